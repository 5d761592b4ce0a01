// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The mailbox's layout (agent.proto, Mailbox): each word the two sides write lies in a cache line of its own, so
// the caller's polling of the reply sequence does not slow the agent's writes around it.
const (
	MinMailbox = 16 << 10
	MaxMailbox = 1 << 20

	mbRequestSeq  = 0
	mbTaken       = 64
	mbReplySeq    = 128
	mbPolling     = 192
	mbCallerSleep = 196
	mbChecked     = 200
	mbAreas       = 4096

	// sealBytes is what a checked mailbox's seal adds behind each frame.
	sealBytes = 4
	// SealPatience is how long the agent reads a checked request whose seal is wrong again before refusing it:
	// a writer's stores reach memory within microseconds, so a seal still wrong after this was never right.
	SealPatience = time.Millisecond
)

// WakeFrame wakes a caller that sleeps on its socket during a mailbox call: a frame header no reply has (replies
// are at most a few MiB), so a wake-up that arrives late is told apart from the next reply on the socket.
var WakeFrame = [4]byte{0xff, 0xff, 0xff, 0xff}

// Mailbox is a fast connection's mapping of its caller's mailbox: requests and replies in shared memory, so a
// round trip needs no system call while both sides poll. Everything in it is the caller's to write at any time:
// a request is copied out before anything reads it, and the words the agent reads only decide when it looks.
type Mailbox struct {
	mapping []byte
	area    int    // bytes of each of the request and reply areas
	last    uint64 // the request sequence last taken
	req     []byte // the request being served, copied out of the mapping
	checked bool   // frames carry seals (agent.proto, Mailbox.checked)
}

// Attach makes mapping (the caller's whole memfd, MinMailbox to MaxMailbox bytes, page-aligned by mmap) the
// mailbox, unmapping the one it had. The caller's request sequence at this moment counts as taken. checked
// says that frames in both areas carry seals; the checked word tells the caller the agent agreed.
func (m *Mailbox) Attach(mapping []byte, checked bool) error {
	if len(mapping) < MinMailbox || len(mapping) > MaxMailbox {
		return fmt.Errorf("a mailbox of %d bytes: between %d and %d", len(mapping), MinMailbox, MaxMailbox)
	}
	m.Unmap()
	m.mapping = mapping
	m.area = (len(mapping) - mbAreas) / 2
	m.checked = checked
	m.last = m.word64(mbRequestSeq).Load()
	m.word64(mbTaken).Store(m.last)
	m.word32(mbChecked).Store(boolWord(checked))
	m.word32(mbPolling).Store(1)
	return nil
}

func boolWord(on bool) uint32 {
	if on {
		return 1
	}
	return 0
}

// Seal is a checked mailbox's seal of a frame (its length word included) announced with sequence seq: the CRC-32
// (IEEE) of the frame started from the sequence's low 32 bits, as zlib's crc32(frame, seq & 0xffffffff). The
// sequence is in it so that a frame left from the previous call, or its seal, never passes for the next one's.
func Seal(seq uint64, frame []byte) uint32 {
	return crc32.Update(uint32(seq), crc32.IEEETable, frame)
}

// readSealed copies the sealed frame at the start of area into buf (reused) and returns the frame, its length
// word included, or why it is not yet whole. A caller's bytes may still be on their way: it reads area again
// on each call.
func readSealed(buf, area []byte, seq uint64) ([]byte, []byte, error) {
	n := int(binary.BigEndian.Uint32(area))
	if n > len(area)-4-sealBytes {
		return buf, nil, fmt.Errorf("a mailbox frame of %d bytes, at most %d: send larger frames on the socket", n, len(area)-4-sealBytes)
	}
	buf = append(buf[:0], area[:4+n+sealBytes]...)
	if binary.LittleEndian.Uint32(buf[4+n:]) != Seal(seq, buf[:4+n]) {
		return buf, nil, errWrongSeal
	}
	return buf, buf[:4+n], nil
}

var errWrongSeal = errors.New("the mailbox frame does not match its seal")

// Attached reports whether the connection has a mailbox.
func (m *Mailbox) Attached() bool { return m.mapping != nil }

// Unmap unmaps the mailbox (the connection ended, or the caller set another).
func (m *Mailbox) Unmap() {
	if m.mapping != nil {
		_ = syscall.Munmap(m.mapping)
		m.mapping = nil
	}
}

func (m *Mailbox) word64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m.mapping[off]))
}

func (m *Mailbox) word32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&m.mapping[off]))
}

// Rung reports whether a request waits in the mailbox (sockio.Doorbell).
func (m *Mailbox) Rung() bool {
	return m.mapping != nil && m.word64(mbRequestSeq).Load() != m.last
}

// Polling tells the caller whether the agent watches the mailbox (sockio.Doorbell). The agent's store is
// sequentially consistent, so a request raised before it reads as Rung afterwards.
func (m *Mailbox) Polling(on bool) {
	if m.mapping == nil {
		return
	}
	m.word32(mbPolling).Store(boolWord(on))
}

// Take copies the waiting request out of the mailbox and returns its payload (valid until the next Take), or an
// error naming what is wrong with the frame the caller wrote.
func (m *Mailbox) Take() ([]byte, error) {
	m.last = m.word64(mbRequestSeq).Load()
	m.word64(mbTaken).Store(m.last)
	area := m.mapping[mbAreas : mbAreas+m.area]
	if m.checked {
		return m.takeSealed(area)
	}
	n := int(binary.BigEndian.Uint32(area)) // the caller may change it under us: read once
	if n > m.area-4 {
		return nil, fmt.Errorf("a mailbox frame of %d bytes, at most %d: send larger frames on the socket", n, m.area-4)
	}
	m.req = append(m.req[:0], area[4:4+n]...)
	return m.req, nil
}

// takeSealed copies a checked request out once its seal matches, reading it again for up to SealPatience.
func (m *Mailbox) takeSealed(area []byte) ([]byte, error) {
	var giveUp time.Time
	for {
		var frame []byte
		var err error
		if m.req, frame, err = readSealed(m.req, area, m.last); err == nil {
			return frame[4:], nil
		}
		now := time.Now()
		if giveUp.IsZero() {
			giveUp = now.Add(SealPatience)
		} else if now.After(giveUp) {
			return nil, fmt.Errorf("%w (read again for %v)", err, SealPatience)
		}
		m.word64(mbRequestSeq).Load() // orders the next reads after the earlier ones on CPUs that would not
	}
}

// Reply writes a sealed reply frame (u32 length + FastReply) for the request last taken, and its seal in a
// checked mailbox, and reports whether the caller sleeps on the socket, to be woken with WakeFrame. A frame
// larger than the reply area is refused: the server answers with a short error instead.
func (m *Mailbox) Reply(frame []byte) (wake bool, err error) {
	room := m.area
	if m.checked {
		room -= sealBytes
	}
	if len(frame) > room {
		return false, fmt.Errorf("a reply of %d bytes does not fit the mailbox's %d", len(frame), room)
	}
	reply := m.mapping[mbAreas+m.area:]
	copy(reply, frame)
	if m.checked {
		binary.LittleEndian.PutUint32(reply[len(frame):], Seal(m.last, frame))
	}
	m.word64(mbReplySeq).Store(m.last)
	return m.word32(mbCallerSleep).Load() != 0, nil
}

// CallerMailbox is the caller's side of a mailbox (the Go client's): it writes requests into the memory it shares
// with the agent and reads the replies there. Not safe for concurrent use.
type CallerMailbox struct {
	mapping []byte
	area    int
	seq     uint64 // the last request sequence raised
	checked bool
	reply   []byte // a checked reply, copied out
}

// NewCallerMailbox uses mapping (the caller's memfd, MinMailbox to MaxMailbox bytes, mapped shared by
// golang.org/x/sys/unix.Mmap, which Unmap undoes) as a mailbox to be passed to the agent. checked seals the
// frames (agent.proto, Mailbox.checked), for an agent asked to.
func NewCallerMailbox(mapping []byte, checked bool) (*CallerMailbox, error) {
	if len(mapping) < MinMailbox || len(mapping) > MaxMailbox {
		return nil, fmt.Errorf("a mailbox of %d bytes: between %d and %d", len(mapping), MinMailbox, MaxMailbox)
	}
	m := &CallerMailbox{mapping: mapping, area: (len(mapping) - mbAreas) / 2, checked: checked}
	m.seq = m.word64(mbRequestSeq).Load()
	return m, nil
}

// AgentChecks reports whether the agent said it seals and checks frames (the checked word).
func (m *CallerMailbox) AgentChecks() bool { return m.word32(mbChecked).Load() != 0 }

func (m *CallerMailbox) word64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m.mapping[off]))
}

func (m *CallerMailbox) word32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&m.mapping[off]))
}

// Fits reports whether a request of n bytes travels through the mailbox (larger ones go on the socket).
func (m *CallerMailbox) Fits(n int) bool {
	if m.checked {
		n += sealBytes
	}
	return n+4 <= m.area
}

// Post writes a request frame of payload (which must fit) and raises the request sequence; it reports whether
// the agent said it watches the mailbox (if not, the caller rings with an empty frame on the socket).
func (m *CallerMailbox) Post(payload []byte) (watched bool) {
	binary.BigEndian.PutUint32(m.mapping[mbAreas:], uint32(len(payload)))
	copy(m.mapping[mbAreas+4:], payload)
	m.seq++
	if m.checked {
		end := mbAreas + 4 + len(payload)
		binary.LittleEndian.PutUint32(m.mapping[end:], Seal(m.seq, m.mapping[mbAreas:end]))
	}
	m.word64(mbRequestSeq).Store(m.seq)
	return m.word32(mbPolling).Load() != 0
}

// Taken reports whether the agent has copied the last request out.
func (m *CallerMailbox) Taken() bool { return m.word64(mbTaken).Load() == m.seq }

// Answered reports whether the reply to the last request is there.
func (m *CallerMailbox) Answered() bool { return m.word64(mbReplySeq).Load() == m.seq }

// Sleeping tells the agent whether the caller waits on the socket (and must be woken with WakeFrame).
func (m *CallerMailbox) Sleeping(on bool) {
	m.word32(mbCallerSleep).Store(boolWord(on))
}

// Reply is the payload of the reply to the last request (once Answered), valid until the next Post. In a
// checked mailbox it is copied out, and a reply whose seal is wrong is an error: read it again.
func (m *CallerMailbox) Reply() ([]byte, error) {
	at := mbAreas + m.area
	if m.checked {
		var frame []byte
		var err error
		m.reply, frame, err = readSealed(m.reply, m.mapping[at:at+m.area], m.seq)
		if err != nil {
			return nil, err
		}
		return frame[4:], nil
	}
	n := int(binary.BigEndian.Uint32(m.mapping[at:]))
	if n > m.area-4 {
		return nil, fmt.Errorf("a mailbox reply of %d bytes, at most %d", n, m.area-4)
	}
	return m.mapping[at+4 : at+4+n], nil
}

// Unmap unmaps the mailbox; it is unusable afterwards.
func (m *CallerMailbox) Unmap() {
	if m.mapping != nil {
		_ = unix.Munmap(m.mapping) // unix's, as the mapping is: syscall.Munmap refuses a mapping it did not make
		m.mapping = nil
	}
}

// Sequence is the last request sequence raised (the count of requests posted since the memory was zero).
func (m *CallerMailbox) Sequence() uint64 { return m.seq }

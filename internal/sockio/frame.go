// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"encoding/binary"
	"fmt"
	"io"
)

// ReadFrame reads one frame (u32 big-endian length, then the payload) of at most max bytes.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	var buf []byte
	return ReadFrameInto(r, &buf, max)
}

// ReadFrameInto is ReadFrame into *buf, which it grows only as the payload's bytes arrive (a peer that announces a
// large frame and sends nothing costs no memory) and keeps for the next frame when it is at most 1 MiB. The
// frame returned is valid until the next call with buf.
func ReadFrameInto(r io.Reader, buf *[]byte, max int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("frame of %d bytes, at most %d", n, max)
	}
	b := (*buf)[:0]
	const step = 256 << 10
	for len(b) < int(n) {
		want := min(int(n), len(b)+step)
		if cap(b) < want {
			b = append(b[:cap(b)], make([]byte, want-cap(b))...)[:len(b)]
		}
		k, err := io.ReadFull(r, b[len(b):want])
		b = b[:len(b)+k]
		if err != nil {
			return nil, err
		}
	}
	if cap(b) <= 1<<20 {
		*buf = b
	}
	return b, nil
}

// WriteFrame writes one frame in a single write.
func WriteFrame(w io.Writer, payload []byte) error {
	buf := make([]byte, 4+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	copy(buf[4:], payload)
	_, err := w.Write(buf)
	return err
}

// FrameReader reads frames from r through one buffer: a frame that has arrived whole is taken in a single read,
// header and payload together, where ReadFrame needs two. Like ReadFrameInto it grows the buffer only as a
// payload's bytes arrive, and it keeps at most 1 MiB between frames.
type FrameReader struct {
	R io.Reader
	// Max bounds one frame's payload.
	Max int

	buf        []byte
	start, end int // unread bytes are buf[start:end]
}

// Buffered is how many bytes of frames not returned yet the reader holds: the socket's next byte is the start of
// a frame only when none.
func (f *FrameReader) Buffered() int { return f.end - f.start }

// Next returns the next frame's payload, valid until the following call.
func (f *FrameReader) Next() ([]byte, error) {
	if f.buf == nil {
		f.buf = make([]byte, 64<<10)
	}
	if err := f.fill(4); err != nil {
		if err == io.ErrUnexpectedEOF && f.end == f.start {
			return nil, io.EOF
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(f.buf[f.start:])
	if uint64(n) > uint64(f.Max) {
		return nil, fmt.Errorf("frame of %d bytes, at most %d", n, f.Max)
	}
	if err := f.fill(4 + int(n)); err != nil {
		return nil, err
	}
	payload := f.buf[f.start+4 : f.start+4+int(n)]
	f.start += 4 + int(n)
	if f.start == f.end {
		f.start, f.end = 0, 0
		if cap(f.buf) > 1<<20 {
			f.buf = make([]byte, 64<<10) // the payload returned keeps the large buffer alive until it is dropped
		}
	}
	return payload, nil
}

// fill reads until at least want unread bytes are buffered, growing the buffer in steps of at most 256 KiB as the
// bytes arrive.
func (f *FrameReader) fill(want int) error {
	if f.end-f.start >= want {
		return nil
	}
	if f.start > 0 { // move the unread bytes to the front
		f.end = copy(f.buf, f.buf[f.start:f.end])
		f.start = 0
	}
	for f.end < want {
		if f.end == len(f.buf) {
			f.buf = append(f.buf, make([]byte, min(want-len(f.buf), 256<<10))...)
			f.buf = f.buf[:cap(f.buf)]
		}
		k, err := f.R.Read(f.buf[f.end:])
		f.end += k
		if err != nil {
			if err == io.EOF && f.end < want {
				return io.ErrUnexpectedEOF
			}
			if f.end >= want {
				return nil
			}
			return err
		}
		if k == 0 {
			return io.ErrNoProgress
		}
	}
	return nil
}

// SealFrame writes the length of frame[4:] into frame[:4] (four bytes reserved for it before the payload was
// appended) and returns frame, ready for one write.
func SealFrame(frame []byte) []byte {
	binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
	return frame
}

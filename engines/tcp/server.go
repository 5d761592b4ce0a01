// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// handshakeTimeout bounds the TLS handshake and the hello exchange of a connection this node accepts.
const handshakeTimeout = 10 * time.Second

// keepaliveEvery is how often the serving side says it is receiving a long payload (see payloadReader); a
// client's Liveness should be several times longer.
const keepaliveEvery = 100 * time.Millisecond

// completerQueue bounds the staged requests a connection has received and not yet answered; the serving loop
// waits beyond it. Each holds a staging slot, so the serving pool (StagingBytes) bounds them first.
const completerQueue = 64

// serve accepts peers until the listener closes; running out of descriptors pauses it (sockio.Accept).
func (e *Engine) serve(ln net.Listener) {
	defer e.wg.Done()
	for {
		nc, err := sockio.Accept(ln.Accept, func() { e.stats.acceptsExhausted.Add(1) })
		if err != nil {
			return // listener closed
		}
		leave, err := e.handshakes.Enter(nc.RemoteAddr())
		if err != nil {
			e.stats.refused.Add(1)
			nc.Close()
			continue
		}
		if !e.trackServerConn(nc, true) {
			leave()
			nc.Close()
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer e.trackServerConn(nc, false)
			defer nc.Close()
			if err := e.serveConn(nc, leave); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				e.logf("tcp engine: serving %s: %v", nc.RemoteAddr(), err)
			}
		}()
	}
}

func (e *Engine) trackServerConn(nc net.Conn, add bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if add {
		if e.closed {
			return false
		}
		e.serverConns[nc] = struct{}{}
		return true
	}
	delete(e.serverConns, nc)
	return true
}

// serveConn answers one client connection: requests are handled in order, payloads go straight between the
// socket and registered memory. authenticated is called once the hello is past (or failed).
func (e *Engine) serveConn(raw net.Conn, authenticated func()) error {
	defer authenticated()
	nc := raw
	raw.SetDeadline(time.Now().Add(handshakeTimeout))
	if e.opts.TLS != nil {
		tc := tls.Server(raw, e.opts.TLS)
		if err := tc.Handshake(); err != nil {
			return fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	client, err := e.serverHello(nc)
	if err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if tc, ok := nc.(*tls.Conn); ok && sealedNegotiated(tc) {
		if nc, err = newSealedConn(raw, tc, false, &e.sealBufs); err != nil {
			return fmt.Errorf("client %q: %w", client, err)
		}
	}
	authenticated()
	e.stats.accepted.Add(1)
	raw.SetDeadline(time.Time{})
	br := bufio.NewReaderSize(nc, 64<<10)
	hdr := make([]byte, 512)
	out := make([]byte, 0, respHeaderSize+maxErrText)
	// Answers leave from this goroutine and from those completing staged writes (see serveStaged), one frame
	// at a time, each within the peer timeout.
	var wmu sync.Mutex
	writeFrame := func(bufs net.Buffers) error {
		wmu.Lock()
		defer wmu.Unlock()
		nc.SetWriteDeadline(time.Now().Add(e.opts.PeerTimeout))
		return writeBuffers(nc, bufs, &e.scratch)
	}
	// Staged requests are answered in order by one completer, which waits for each chunk's GPU copy while the
	// loop receives the next request; it polls for the next chunk briefly before parking (handoffSpin), since
	// a goroutine per chunk would wait to be scheduled as long as the chunk spent on the wire.
	finishes := make(chan stagedAnswer, completerQueue)
	completed := make(chan struct{})
	go func() {
		defer close(completed)
		for {
			finish, ok := recvSpinning(finishes, handoffSpin)
			if !ok {
				return
			}
			resp, data, sent := finish()
			err := writeFrame(net.Buffers{appendRespHeader(nil, resp), data})
			mark("serve.answered", resp.id, resp.length)
			if sent != nil {
				sent(err == nil)
			}
			if err != nil {
				raw.Close() // the stream is broken: the serving loop fails on its next read
			}
		}
	}()
	defer func() {
		raw.Close() // a completion blocked on a peer that stopped reading fails now
		close(finishes)
		<-completed
	}()
	complete := func(finish stagedAnswer) { finishes <- finish }
	for {
		h, err := readReqHeader(br, hdr)
		if err != nil {
			return err
		}
		pr := payloadReader{br: br, write: writeFrame, last: time.Now()}
		// A request's payload must arrive, and its answer leave, within the peer timeout.
		nc.SetReadDeadline(time.Now().Add(e.opts.PeerTimeout))
		resp := respHeader{op: h.op, id: h.id}
		var data []byte
		var vecOut net.Buffers
		var unpin func()
		staged := false
		if h.op >= opWrite && h.op <= opReadV && h.op != opNotify {
			if _, _, ok := e.stagedRegion(h.mem); ok {
				mark("serve.request", h.id, h.length)
				staged = true
				var finish stagedAnswer
				if resp, data, unpin, finish, err = e.serveStaged(br, &pr, h, client); err != nil {
					return err
				}
				if finish != nil {
					// The chunk's GPU copy runs while the next request is received; its answer leaves
					// once the copy finished.
					complete(finish)
					nc.SetReadDeadline(time.Time{})
					continue
				}
			}
		}
		switch {
		case staged:
		case h.op == opWrite:
			if h.length > maxChunk {
				return fmt.Errorf("write of %d bytes, at most %d", h.length, maxChunk)
			}
			dst, release, err := e.serveRegion(h)
			if err != nil {
				if derr := pr.discard(h.length); derr != nil {
					return derr
				}
				resp.status, data = errorStatus(err), []byte(err.Error())
				break
			}
			err = pr.read(dst)
			release()
			if err != nil {
				return err
			}
			e.stats.servedIn.Add(h.length)
		case h.op == opRead:
			if h.length > maxChunk {
				return fmt.Errorf("read of %d bytes, at most %d", h.length, maxChunk)
			}
			src, release, err := e.serveRegion(h)
			if err != nil {
				resp.status, data = errorStatus(err), []byte(err.Error())
				break
			}
			resp.length, data, unpin = h.length, src, release
		case h.op == opWriteV || h.op == opReadV:
			if h.length > maxChunk {
				return fmt.Errorf("vectored request of %d bytes, at most %d", h.length, maxChunk)
			}
			parts, err := readVec(br, h.length, e.partsRead())
			if err != nil {
				return err
			}
			views, release, err := e.serveParts(h.mem, parts)
			if err != nil {
				if h.op == opWriteV {
					if derr := pr.discard(h.length); derr != nil {
						return derr
					}
				}
				resp.status, data = errorStatus(err), []byte(err.Error())
				break
			}
			if h.op == opWriteV {
				for _, v := range views {
					if err := pr.read(v); err != nil {
						release()
						return err
					}
				}
				release()
				e.stats.servedIn.Add(h.length)
				break
			}
			resp.length, unpin = h.length, release
			vecOut = append(net.Buffers(nil), views...)
		case h.op == opNotify:
			if h.length > maxNotifyWire {
				return fmt.Errorf("notification of %d bytes, at most %d", h.length, maxNotifyWire)
			}
			buf := make([]byte, h.length)
			if _, err := io.ReadFull(br, buf); err != nil {
				return err
			}
			n, err := decodeNotification(buf)
			if err == nil && n.From != client {
				err = fmt.Errorf("notification from %q on a connection of %q", n.From, client)
			}
			if err != nil {
				resp.status, data = statusInvalid, []byte(err.Error())
				break
			}
			e.deliver(n)
		default:
			return fmt.Errorf("unknown request op %d", h.op)
		}
		if resp.status != statusOK {
			if len(data) > maxErrText {
				data = data[:maxErrText]
			}
			resp.length = uint64(len(data))
		}
		out = appendRespHeader(out[:0], resp)
		bufs := net.Buffers{out, data}
		if vecOut != nil {
			bufs = append(net.Buffers{out}, vecOut...)
			vecOut = nil
		}
		err = writeFrame(bufs)
		if unpin != nil {
			unpin()
			if err == nil {
				e.stats.servedOut.Add(h.length)
			}
		}
		if err != nil {
			return err
		}
		nc.SetReadDeadline(time.Time{})
	}
}

// payloadReader reads a request's payload and, while it arrives, tells the client that it does: a keepalive
// frame at least every keepaliveEvery. The client's liveness check counts received bytes, and a write's answer
// can only leave once its whole payload arrived, which on a slow or busy link can take longer than the check.
type payloadReader struct {
	br    *bufio.Reader
	write func(net.Buffers) error // sends one frame on the connection
	last  time.Time               // when this connection last sent a frame
	buf   []byte                  // keepalive frame
}

func (r *payloadReader) tick() error {
	now := time.Now()
	if now.Sub(r.last) < keepaliveEvery {
		return nil
	}
	r.last = now
	if r.buf == nil {
		r.buf = appendRespHeader(nil, respHeader{op: opKeepalive})
	}
	return r.write(net.Buffers{r.buf})
}

// read fills dst from the stream.
func (r *payloadReader) read(dst []byte) error {
	for off := 0; off < len(dst); {
		n, err := r.br.Read(dst[off:])
		off += n
		if err != nil {
			if errors.Is(err, io.EOF) && off < len(dst) {
				err = io.ErrUnexpectedEOF
			}
			if off < len(dst) {
				return err
			}
		}
		if err := r.tick(); err != nil {
			return err
		}
	}
	return nil
}

// discard consumes n bytes of payload.
func (r *payloadReader) discard(n uint64) error {
	for n > 0 {
		got, err := r.br.Discard(int(min(n, 64<<10)))
		n -= uint64(got)
		if err != nil {
			return err
		}
		if err := r.tick(); err != nil {
			return err
		}
	}
	return nil
}

// serveRegion pins the local region a request names and returns the requested slice of it.
func (e *Engine) serveRegion(h reqHeader) ([]byte, func(), error) {
	d, unpin, err := e.reg.Pin(h.mem)
	if err != nil {
		return nil, nil, err
	}
	if d.Node != e.opts.Node || d.Handles.Host == nil {
		unpin()
		return nil, nil, fmt.Errorf("%w: memory %s is not host memory served by this node", engines.ErrUnknownMemory, h.mem)
	}
	if h.length == 0 || h.off > d.Size || h.length > d.Size-h.off {
		unpin()
		return nil, nil, fmt.Errorf("%w: [%d, +%d) of %s (%d bytes)", engines.ErrOutOfBounds, h.off, h.length, h.mem, d.Size)
	}
	return d.Handles.Host[h.off : h.off+h.length], unpin, nil
}

// serveParts pins the local region a vectored request names and returns the slice of every part.
func (e *Engine) serveParts(mem engines.MemoryID, parts []vecDesc) ([][]byte, func(), error) {
	d, unpin, err := e.reg.Pin(mem)
	if err != nil {
		return nil, nil, err
	}
	if d.Node != e.opts.Node || d.Handles.Host == nil {
		unpin()
		return nil, nil, fmt.Errorf("%w: memory %s is not host memory served by this node", engines.ErrUnknownMemory, mem)
	}
	views := make([][]byte, len(parts))
	for i, p := range parts {
		n := uint64(p.n)
		if n == 0 || p.off > d.Size || n > d.Size-p.off {
			unpin()
			return nil, nil, fmt.Errorf("%w: part [%d, +%d) of %s (%d bytes)", engines.ErrOutOfBounds, p.off, n, mem, d.Size)
		}
		views[i] = d.Handles.Host[p.off : p.off+n]
	}
	return views, unpin, nil
}

// serverHello reads the client's hello and answers it; it returns the client's node name.
func (e *Engine) serverHello(nc net.Conn) (string, error) {
	var m [4]byte
	if _, err := io.ReadFull(nc, m[:]); err != nil {
		return "", err
	}
	if string(m[:]) != magic {
		return "", fmt.Errorf("bad magic %q", m[:])
	}
	client, err := readString16(nc, maxNameLen)
	if err != nil {
		return "", err
	}
	want, err := readString16(nc, maxNameLen)
	if err != nil {
		return "", err
	}
	status := statusOK
	var identity error
	if tc, ok := nc.(*tls.Conn); ok && e.opts.CheckPeer != nil {
		identity = e.opts.CheckPeer(tc.ConnectionState(), client)
	}
	if want != e.opts.Node || identity != nil {
		status = statusRefused
	}
	reply := append([]byte(magic), status)
	reply = appendString16(reply, e.opts.Node)
	if _, err := nc.Write(reply); err != nil {
		return "", err
	}
	if identity != nil {
		return "", fmt.Errorf("refusing a client that says it is node %q: %w", client, identity)
	}
	if status != statusOK {
		return "", fmt.Errorf("client %q expected node %q, this is %q", client, want, e.opts.Node)
	}
	return client, nil
}

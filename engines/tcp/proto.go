// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines"
)

const (
	magic = "FXT1"

	opWrite  byte = 1
	opRead   byte = 2
	opNotify byte = 3
	// Vectored writes and reads: after the memory id, a u32 count and count (offset u64, length u32) pairs;
	// the payload is the parts back to back. Small scattered segments travel many to a request.
	opWriteV byte = 4
	opReadV  byte = 5
	// opKeepalive is an answer to no request (id 0, no payload): the server is receiving a payload.
	opKeepalive byte = 6

	statusOK      byte = 0
	statusUnknown byte = 1
	statusBounds  byte = 2
	statusInvalid byte = 3
	statusRefused byte = 4

	reqHeaderSize  = 28
	respHeaderSize = 20

	// maxChunk bounds one request's payload; a peer asking for more is broken or hostile.
	maxChunk = 64 << 20
	// maxNotifyWire bounds an encoded notification.
	maxNotifyWire = engines.MaxNotifyPayload + 1<<20
	maxErrText    = 4096
	// maxVecParts bounds the parts of one vectored request to a peer that did not negotiate sealedWideProto;
	// maxVecPartsWide bounds them to one that did, and what this node reads from anyone. A staged chunk of
	// 720 B KV blocks was cut at 1,024 parts (737 KB) while contiguous memory went in chunks twice that size.
	maxVecParts     = 1024
	maxVecPartsWide = 8192
	// vecPartMax: segments up to this size travel in vectored requests.
	vecPartMax = 64 << 10
	maxNameLen = 512
)

type reqHeader struct {
	op     byte
	id     uint64
	off    uint64
	length uint64
	mem    engines.MemoryID
}

func appendReqHeader(b []byte, h reqHeader) []byte {
	b = append(b, h.op, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.mem)))
	b = binary.BigEndian.AppendUint64(b, h.id)
	b = binary.BigEndian.AppendUint64(b, h.off)
	b = binary.BigEndian.AppendUint64(b, h.length)
	return append(b, h.mem...)
}

func readReqHeader(r io.Reader, buf []byte) (reqHeader, error) {
	var h reqHeader
	if _, err := io.ReadFull(r, buf[:reqHeaderSize]); err != nil {
		return h, err
	}
	h.op = buf[0]
	idLen := int(binary.BigEndian.Uint16(buf[2:4]))
	h.id = binary.BigEndian.Uint64(buf[4:12])
	h.off = binary.BigEndian.Uint64(buf[12:20])
	h.length = binary.BigEndian.Uint64(buf[20:28])
	if idLen == 0 || idLen > 256 {
		return h, fmt.Errorf("request with a %d-byte memory id", idLen)
	}
	if _, err := io.ReadFull(r, buf[:idLen]); err != nil {
		return h, err
	}
	h.mem = engines.MemoryID(buf[:idLen])
	return h, nil
}

type respHeader struct {
	op     byte
	status byte
	id     uint64
	length uint64
}

func appendRespHeader(b []byte, h respHeader) []byte {
	b = append(b, h.op, h.status, 0, 0)
	b = binary.BigEndian.AppendUint64(b, h.id)
	return binary.BigEndian.AppendUint64(b, h.length)
}

func parseRespHeader(buf []byte) respHeader {
	return respHeader{op: buf[0], status: buf[1], id: binary.BigEndian.Uint64(buf[4:12]), length: binary.BigEndian.Uint64(buf[12:20])}
}

// statusError turns a response status into the error the client reports.
func statusError(status byte, text string) error {
	switch status {
	case statusUnknown:
		return fmt.Errorf("peer: %w: %s", engines.ErrUnknownMemory, text)
	case statusBounds:
		return fmt.Errorf("peer: %w: %s", engines.ErrOutOfBounds, text)
	case statusInvalid:
		return fmt.Errorf("peer: %w: %s", engines.ErrInvalid, text)
	}
	return fmt.Errorf("peer refused the request: %s", text)
}

func errorStatus(err error) byte {
	switch {
	case errors.Is(err, engines.ErrUnknownMemory):
		return statusUnknown
	case errors.Is(err, engines.ErrOutOfBounds):
		return statusBounds
	case errors.Is(err, engines.ErrInvalid):
		return statusInvalid
	}
	return statusRefused
}

func appendString16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func readString16(r io.Reader, max int) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	l := int(binary.BigEndian.Uint16(n[:]))
	if l > max {
		return "", fmt.Errorf("string of %d bytes, at most %d", l, max)
	}
	s := make([]byte, l)
	if _, err := io.ReadFull(r, s); err != nil {
		return "", err
	}
	return string(s), nil
}

// encodeNotification: from, regions, tags, payload; all length-prefixed.
func encodeNotification(n engines.Notification) []byte {
	b := appendString16(nil, n.From)
	b = binary.BigEndian.AppendUint32(b, uint32(len(n.Regions)))
	for _, r := range n.Regions {
		b = appendString16(b, string(r))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(n.Tags)))
	for _, t := range n.Tags {
		b = binary.BigEndian.AppendUint64(b, uint64(t))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(n.Payload)))
	return append(b, n.Payload...)
}

func decodeNotification(b []byte) (engines.Notification, error) {
	var n engines.Notification
	rd := &sliceReader{b: b}
	n.From = string(rd.take(int(rd.u16())))
	count := int(rd.u32())
	if count > len(b) {
		return n, errors.New("notification: region count exceeds its size")
	}
	for i := 0; i < count && rd.err == nil; i++ {
		n.Regions = append(n.Regions, engines.MemoryID(rd.take(int(rd.u16()))))
	}
	count = int(rd.u32())
	if count > len(b)/8 {
		return n, errors.New("notification: tag count exceeds its size")
	}
	for i := 0; i < count && rd.err == nil; i++ {
		n.Tags = append(n.Tags, engines.Tag(rd.u64()))
	}
	n.Payload = append([]byte{}, rd.take(int(rd.u32()))...)
	if rd.err != nil {
		return n, fmt.Errorf("notification: %w", rd.err)
	}
	if rd.off != len(b) {
		return n, fmt.Errorf("notification: %d trailing bytes", len(b)-rd.off)
	}
	if err := engines.CheckReceived(&n); err != nil {
		return n, fmt.Errorf("notification: %w", err)
	}
	return n, nil
}

type sliceReader struct {
	b   []byte
	off int
	err error
}

func (r *sliceReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = errors.New("truncated")
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *sliceReader) u16() uint16 {
	if s := r.take(2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *sliceReader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *sliceReader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

// appendParts appends a vectored request's part list to b: the count, then each part's remote offset and size.
func appendParts(b []byte, parts []part) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(parts)))
	for _, p := range parts {
		b = binary.BigEndian.AppendUint64(b, p.remoteOff)
		b = binary.BigEndian.AppendUint32(b, uint32(p.n))
	}
	return b
}

// vecDesc is a vectored request's part as the server reads it.
type vecDesc struct {
	off uint64
	n   uint32
}

// readVec reads a vectored request's part list of at most maxParts parts; total must equal the header's length.
func readVec(r io.Reader, total uint64, maxParts uint32) ([]vecDesc, error) {
	var cnt [4]byte
	if _, err := io.ReadFull(r, cnt[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(cnt[:])
	if n == 0 || n > maxParts {
		return nil, fmt.Errorf("vectored request of %d parts, 1 to %d allowed", n, maxParts)
	}
	raw := make([]byte, 12*int(n))
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, err
	}
	parts := make([]vecDesc, n)
	var sum uint64
	for i := range parts {
		parts[i] = vecDesc{off: binary.BigEndian.Uint64(raw[12*i:]), n: binary.BigEndian.Uint32(raw[12*i+8:])}
		sum += uint64(parts[i].n)
	}
	if sum != total {
		return nil, fmt.Errorf("vectored request parts sum to %d bytes, header says %d", sum, total)
	}
	return parts, nil
}

// Writes of many small buffers (the parts of a vectored request or answer) over a connection without vectored
// writes: buffers under coalesceMin are copied into one buffer of up to coalesceMax before they are written.
const (
	coalesceMin = 64 << 10
	coalesceMax = 1 << 20
)

// writeBuffers writes bufs to nc in order. A plain TCP or Unix connection takes them in one vectored write; any
// other (TLS) writes each buffer it is given as records and a system call of its own, which for 1,024 parts of
// 720 B cost a thousand of each per request, so runs of small buffers go as one write through a buffer of
// scratch (a pool of *[]byte, shared by the engine's connections so that idle ones hold none).
func writeBuffers(nc net.Conn, bufs net.Buffers, scratch *sync.Pool) error {
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
		_, err := bufs.WriteTo(nc)
		return err
	}
	var held *[]byte
	defer func() {
		if held != nil {
			scratch.Put(held)
		}
	}()
	for len(bufs) > 0 {
		if len(bufs[0]) >= coalesceMin {
			if _, err := nc.Write(bufs[0]); err != nil {
				return err
			}
			bufs = bufs[1:]
			continue
		}
		if held == nil {
			if held, _ = scratch.Get().(*[]byte); held == nil {
				b := make([]byte, 0, coalesceMax)
				held = &b
			}
		}
		b := (*held)[:0]
		for len(bufs) > 0 && len(bufs[0]) < coalesceMin && len(b)+len(bufs[0]) <= coalesceMax {
			b = append(b, bufs[0]...)
			bufs = bufs[1:]
		}
		*held = b
		if _, err := nc.Write(b); err != nil {
			return err
		}
	}
	return nil
}

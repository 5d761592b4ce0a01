// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
)

// Sealed records: after the mutual TLS handshake and the hello, two agents that both offered sealedProto (ALPN)
// move their stream in AES-128-GCM records of up to recordMax bytes over the bare TCP connection, with keys
// exported from the TLS session. TLS's own records carry at most 16 KiB, each a system call on the way out and a
// copy through the TLS buffer on the way in; at memory speed those, not the cipher, bound a connection. Sealed
// records go out a system call per up to four (a write's first record alone, so that its system call starts
// while the rest is sealed), and a record opens straight into the reader's buffer (the destination region)
// when that buffer holds the whole record. Same guarantees as TLS for the data: secrecy, integrity, order (each
// direction numbers its records, the number is the nonce), no replay across connections (keys are per
// session). Differences, both documented: a record that fails authentication may have left garbage in the
// destination range it was opened into (the transfer fails; a failed transfer's destination is undefined
// anyway), and liveness is proven per record rather than per byte.
const (
	sealedProto = "fxt-sealed/1"
	// sealedWideProto is sealedProto whose vectored requests may carry up to maxVecPartsWide parts. Offered
	// first, so two agents that both know it pick it and an agent that does not answers with sealedProto.
	sealedWideProto = "fxt-sealed/2"
	// sealedLabel is the TLS exporter label of the records' secrets (RFC 8446 7.5).
	sealedLabel = "EXPORTER-fabricxfer-tcp-records"
	// recordMax is the largest plaintext of one record. A record is the unit of liveness on a stream, so it must
	// arrive within the engine's Liveness: 256 KiB in a second is any datacenter link.
	recordMax    = 256 << 10
	recordHeader = 4
	// recordMore, in a record's header, says that the record's writer sends the next one right away (the same
	// Write): a reader may wait for it.
	recordMore     = 1 << 31
	recordTag      = 16
	recordOverhead = recordHeader + recordTag
	// recordsPerFlush records are sealed into one buffer before a system call writes it (a Write's first flush
	// is one record).
	recordsPerFlush = 4
	// rekeyEvery records a direction's key changes (derived again from its secret with the epoch), so one key
	// seals at most 64 GiB, far below AES-GCM's limits per key.
	rekeyEvery = 1 << 16
)

// errRecord marks a stream whose records cannot be trusted: the connection is unusable.
var errRecord = errors.New("tcp record")

// sealBuffers lends the buffers records are sealed into and opened from, shared by an engine's connections so
// idle ones hold none.
type sealBuffers struct {
	out sync.Pool // *[]byte of recordsPerFlush records
	in  sync.Pool // *[]byte of one record
}

func (b *sealBuffers) get(p *sync.Pool, size int) *[]byte {
	if buf, ok := p.Get().(*[]byte); ok && cap(*buf) >= size {
		return buf
	}
	buf := make([]byte, size)
	return &buf
}

// recordKeys seals or opens one direction's records.
type recordKeys struct {
	secret []byte
	epoch  uint64
	aead   cipher.AEAD
	salt   [4]byte
}

func newRecordKeys(secret []byte) (*recordKeys, error) {
	k := &recordKeys{secret: secret}
	if err := k.derive(0); err != nil {
		return nil, err
	}
	return k, nil
}

// derive sets the key and nonce salt of an epoch: HMAC-SHA256(secret, "fxt record key" || epoch).
func (k *recordKeys) derive(epoch uint64) error {
	mac := hmac.New(sha256.New, k.secret)
	mac.Write([]byte("fxt record key"))
	mac.Write(binary.BigEndian.AppendUint64(nil, epoch))
	sum := mac.Sum(nil)
	block, err := aes.NewCipher(sum[:16])
	if err != nil {
		return err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	k.epoch, k.aead = epoch, aead
	copy(k.salt[:], sum[16:20])
	return nil
}

// forRecord returns the cipher and nonce of record seq (counted from 0 in this direction).
func (k *recordKeys) forRecord(seq uint64, nonce *[12]byte) (cipher.AEAD, error) {
	if e := seq / rekeyEvery; e != k.epoch {
		if err := k.derive(e); err != nil {
			return nil, err
		}
	}
	copy(nonce[:4], k.salt[:])
	binary.BigEndian.PutUint64(nonce[4:], seq)
	return k.aead, nil
}

// sealedConn is the stream of records over the TCP connection under a finished TLS session.
type sealedConn struct {
	net.Conn
	bufs *sealBuffers
	// maxParts is the most parts a vectored request on this connection may carry (maxVecPartsWide when both ends
	// negotiated sealedWideProto).
	maxParts int

	wmu  sync.Mutex
	wk   *recordKeys
	wseq uint64
	werr error

	// Read state; one reader at a time. A read interrupted by a deadline resumes where it stopped.
	rk      *recordKeys
	rseq    uint64
	rerr    error
	hdr     [recordHeader]byte
	hdrGot  int
	rbuf    *[]byte
	bodyGot int
	plain   []byte // opened bytes not read yet, in rbuf
}

// newSealedConn switches a connection whose TLS session negotiated sealed records to them. raw is the TCP
// connection under tc; nothing may be buffered in tc (both ends switch right after the hello, before either
// sends more).
func newSealedConn(raw net.Conn, tc *tls.Conn, client bool, bufs *sealBuffers) (*sealedConn, error) {
	cs := tc.ConnectionState()
	if cs.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("%w: sealed records need TLS 1.3, the session is %s", errRecord, tls.VersionName(cs.Version))
	}
	secret, err := cs.ExportKeyingMaterial(sealedLabel, nil, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: exporting the session's secret: %w", errRecord, err)
	}
	toServer, toClient := secret[:32], secret[32:]
	out, in := toServer, toClient
	if !client {
		out, in = toClient, toServer
	}
	wk, err := newRecordKeys(out)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRecord, err)
	}
	rk, err := newRecordKeys(in)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRecord, err)
	}
	maxParts := maxVecParts
	if cs.NegotiatedProtocol == sealedWideProto {
		maxParts = maxVecPartsWide
	}
	return &sealedConn{Conn: raw, bufs: bufs, wk: wk, rk: rk, maxParts: maxParts}, nil
}

// sealedNegotiated reports whether a TLS session agreed on sealed records (either version).
func sealedNegotiated(tc *tls.Conn) bool {
	p := tc.ConnectionState().NegotiatedProtocol
	return p == sealedProto || p == sealedWideProto
}

// partsRead is the most parts of a vectored request this node reads: what it offered.
func (e *Engine) partsRead() uint32 {
	if e.opts.narrowSealed {
		return maxVecParts
	}
	return maxVecPartsWide
}

// vecPartsOn is the most parts a vectored request on nc may carry: what the peer said it reads.
func vecPartsOn(nc net.Conn) int {
	if sc, ok := nc.(*sealedConn); ok {
		return sc.maxParts
	}
	return maxVecParts
}

// Write seals p into records and writes them, the first alone and then up to recordsPerFlush to a system call;
// the records of one flush are sealed in parallel, and the next flush is sealed while this one is written. Every
// record but the last of a Write says that more follow, so the reader may wait for them. A failed write leaves
// the stream unusable (the peer cannot find the next record), as with TLS.
func (s *sealedConn) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr != nil {
		return 0, s.werr
	}
	const flush = recordsPerFlush * recordMax
	size := recordsPerFlush * (recordMax + recordOverhead)
	held, spare := s.bufs.get(&s.bufs.out, size), (*[]byte)(nil)
	defer func() {
		s.bufs.out.Put(held)
		if spare != nil {
			s.bufs.out.Put(spare)
		}
	}()
	// The first flush is one record: the first system call starts once it is sealed, and the rest of the flush
	// is sealed while it goes out, instead of the whole flush waiting for its slowest record.
	n := min(len(p), recordMax)
	out, err := s.sealBatch((*held)[:0], p[:n], n == len(p))
	written := 0
	for err == nil {
		// Seal the next flush on another goroutine while this one goes out.
		rest := p[n:]
		var next []byte
		var nextErr error
		var sealing sync.WaitGroup
		m := min(len(rest), flush)
		if m > 0 {
			if spare == nil {
				spare = s.bufs.get(&s.bufs.out, size)
			}
			sealing.Add(1)
			go func() {
				defer sealing.Done()
				next, nextErr = s.sealBatch((*spare)[:0], rest[:m], m == len(rest))
			}()
		}
		_, werr := s.Conn.Write(out)
		sealing.Wait()
		if werr != nil {
			s.werr = werr
			return written, werr
		}
		written += n
		if m == 0 {
			return written, nil
		}
		p, n, out, err = rest, m, next, nextErr
		held, spare = spare, held
	}
	s.werr = fmt.Errorf("%w: %w", errRecord, err)
	return written, s.werr
}

// sealBatch appends the records of p (at most recordsPerFlush) to out; the last one is marked more unless last.
func (s *sealedConn) sealBatch(out, p []byte, last bool) ([]byte, error) {
	records := (len(p) + recordMax - 1) / recordMax
	jobs := make([]func(), 0, records)
	for i := range records {
		chunk := p[i*recordMax : min(len(p), (i+1)*recordMax)]
		head := uint32(len(chunk))
		if i < records-1 || !last {
			head |= recordMore
		}
		start := len(out)
		out = binary.BigEndian.AppendUint32(out, head)
		rec := out[start : start+recordHeader+len(chunk)+recordTag]
		out = out[:start+len(rec)]
		var nonce [12]byte
		aead, err := s.wk.forRecord(s.wseq, &nonce)
		if err != nil {
			return nil, err
		}
		s.wseq++
		jobs = append(jobs, func() { aead.Seal(rec[recordHeader:recordHeader], nonce[:], chunk, rec[:recordHeader]) })
	}
	parallel(jobs)
	return out, nil
}

// parallel runs jobs, all but the first on goroutines of their own, and returns when all have.
func parallel(jobs []func()) {
	var wg sync.WaitGroup
	for _, job := range jobs[min(1, len(jobs)):] {
		wg.Add(1)
		go func() { defer wg.Done(); job() }()
	}
	if len(jobs) > 0 {
		jobs[0]()
	}
	wg.Wait()
}

// Read returns the plaintext of the next records (or what is left of one). Records that p holds whole are
// opened straight into p, and while their writer says more follow (one Write of the peer, which does not wait
// for this side), up to recordsPerFlush of them are read and opened in parallel.
func (s *sealedConn) Read(p []byte) (int, error) {
	if s.rerr != nil {
		return 0, s.rerr
	}
	if len(s.plain) > 0 {
		n := copy(p, s.plain)
		s.plain = s.plain[n:]
		if len(s.plain) == 0 {
			s.release()
		}
		return n, nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	var opening sync.WaitGroup
	var bufs []*[]byte
	fails := make([]error, recordsPerFlush)
	filled := 0
	for {
		room := len(p) - filled
		if len(bufs) == 0 {
			room = -1 // the record this Read returns, whole or in part
		}
		size, more, err := s.readRecord(room)
		if err != nil {
			if len(bufs) == 0 {
				return 0, err
			}
			break // the next Read resumes the record, or reports the error
		}
		if size < 0 {
			break // a record that does not fit what is left of p, header kept
		}
		var nonce [12]byte
		aead, err := s.rk.forRecord(s.rseq, &nonce)
		if err != nil {
			s.rerr = fmt.Errorf("%w: %w", errRecord, err)
			break
		}
		s.rseq++
		body, hdr, seq := (*s.rbuf)[:size+recordTag], s.hdr, s.rseq-1
		s.hdrGot, s.bodyGot = 0, 0
		if filled+size > len(p) { // only the first record can be larger than p: opened into its buffer
			if s.plain, err = aead.Open(body[:0], nonce[:], body, hdr[:]); err != nil {
				s.plain = nil
				s.release()
				s.rerr = fmt.Errorf("%w %d failed authentication: the stream was altered or is not from this session", errRecord, seq)
				return 0, s.rerr
			}
			return s.Read(p)
		}
		dst, k := p[filled:filled], len(bufs)
		open := func() {
			if _, err := aead.Open(dst, nonce[:], body, hdr[:]); err != nil {
				fails[k] = fmt.Errorf("%w %d failed authentication: the stream was altered or is not from this session", errRecord, seq)
			}
		}
		bufs = append(bufs, s.rbuf)
		s.rbuf = nil
		filled += size
		if !more || filled == len(p) || len(bufs) == recordsPerFlush {
			open() // the last one here; the others were opened while the next arrived
			break
		}
		opening.Add(1)
		go func() { defer opening.Done(); open() }()
	}
	opening.Wait()
	for _, b := range bufs {
		s.bufs.in.Put(b)
	}
	for _, err := range fails {
		if err != nil {
			s.rerr = err
			return 0, err
		}
	}
	if s.rerr != nil && filled == 0 {
		return 0, s.rerr
	}
	return filled, nil
}

// readRecord reads the next record's header and body into s.rbuf and returns its size and whether more follow.
// A record larger than room (-1: any size) is left unread, its header kept for the next Read: size -1.
func (s *sealedConn) readRecord(room int) (size int, more bool, err error) {
	for s.hdrGot < recordHeader {
		n, err := s.Conn.Read(s.hdr[s.hdrGot:])
		s.hdrGot += n
		if err != nil && s.hdrGot < recordHeader {
			return 0, false, s.readErr(err)
		}
	}
	head := binary.BigEndian.Uint32(s.hdr[:])
	size, more = int(head&^recordMore), head&recordMore != 0
	if size == 0 || size > recordMax {
		s.rerr = fmt.Errorf("%w of %d bytes, 1 to %d allowed", errRecord, size, recordMax)
		return 0, false, s.rerr
	}
	if room >= 0 && size > room {
		return -1, false, nil
	}
	if s.rbuf == nil {
		s.rbuf = s.bufs.get(&s.bufs.in, recordMax+recordTag)
	}
	body := (*s.rbuf)[:size+recordTag]
	for s.bodyGot < len(body) {
		n, err := s.Conn.Read(body[s.bodyGot:])
		s.bodyGot += n
		if err != nil && s.bodyGot < len(body) {
			return 0, false, s.readErr(err)
		}
	}
	return size, more, nil
}

// readErr passes a read error on; a deadline keeps the partial record for the next Read, anything else ends
// the stream.
func (s *sealedConn) readErr(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		s.rerr = err
	}
	return err
}

func (s *sealedConn) release() {
	if s.rbuf != nil {
		s.bufs.in.Put(s.rbuf)
		s.rbuf = nil
	}
}

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

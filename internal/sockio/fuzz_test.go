// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"bytes"
	"testing"
	"testing/iotest"
)

// FuzzReadFrame feeds arbitrary bytes to the frame decoder the agent's fast socket uses: it never panics,
// never returns a frame longer than the limit, and whatever it returns re-encodes to the bytes it consumed.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c'}, 16)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, 1<<20)
	f.Add([]byte{0, 0, 0, 9, 1}, 16)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		got, err := ReadFrame(bytes.NewReader(data), limit)
		if err != nil {
			return
		}
		if len(got) > limit {
			t.Fatalf("frame of %d bytes passed a limit of %d", len(got), limit)
		}
		var again bytes.Buffer
		if err := WriteFrame(&again, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), data[:again.Len()]) {
			t.Fatalf("re-encoded frame %x differs from the input prefix %x", again.Bytes(), data[:again.Len()])
		}
	})
}

// FuzzFrameReader feeds arbitrary bytes to the buffered reader of the agent's fast socket, all at once and one
// byte per read: both see the same frames, none over the limit, and the frames re-encode to the input's prefix.
func FuzzFrameReader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 1, 'd'}, 16)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, 1<<20)
	f.Add([]byte{0, 0, 0, 9, 1}, 16)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		frames := func(r *FrameReader) (out [][]byte) {
			for {
				p, err := r.Next()
				if err != nil {
					return out
				}
				if len(p) > limit {
					t.Fatalf("frame of %d bytes passed a limit of %d", len(p), limit)
				}
				out = append(out, bytes.Clone(p))
			}
		}
		whole := frames(&FrameReader{R: bytes.NewReader(data), Max: limit})
		bytewise := frames(&FrameReader{R: iotest.OneByteReader(bytes.NewReader(data)), Max: limit})
		if len(whole) != len(bytewise) {
			t.Fatalf("%d frames read at once, %d byte by byte", len(whole), len(bytewise))
		}
		var again bytes.Buffer
		for i := range whole {
			if !bytes.Equal(whole[i], bytewise[i]) {
				t.Fatalf("frame %d differs: %x at once, %x byte by byte", i, whole[i], bytewise[i])
			}
			if err := WriteFrame(&again, whole[i]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(again.Bytes(), data[:again.Len()]) {
			t.Fatalf("re-encoded frames %x differ from the input prefix %x", again.Bytes(), data[:again.Len()])
		}
	})
}

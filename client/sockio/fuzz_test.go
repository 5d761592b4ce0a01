// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"bytes"
	"testing"
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

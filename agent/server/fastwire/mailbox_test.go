// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire_test

import (
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
)

// TestSealIsZlibCRC32FromTheSequence: a checked mailbox's seal is what a Python caller computes with zlib
// (zlib.crc32(frame, seq & 0xffffffff), whose value for this frame and sequence 7 is 0x801bd6ce), so the two
// sides agree; the sequence's high bits do not enter it, and another sequence or frame changes it.
func TestSealIsZlibCRC32FromTheSequence(t *testing.T) {
	frame := []byte("\x00\x00\x00\x03abc")
	if got := fastwire.Seal(1<<32+7, frame); got != 0x801bd6ce {
		t.Fatalf("Seal(2^32+7, frame) = %#x, want zlib's 0x801bd6ce", got)
	}
	if fastwire.Seal(8, frame) == fastwire.Seal(7, frame) {
		t.Fatal("the seal of a frame does not change with its sequence")
	}
	if fastwire.Seal(7, []byte("\x00\x00\x00\x03abd")) == fastwire.Seal(7, frame) {
		t.Fatal("the seal does not change with the frame")
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"strings"
	"testing"
)

func TestLoadMissingLibrarySaysWhy(t *testing.T) {
	_, err := Load("/nonexistent/libcuda.so.1")
	if err == nil {
		t.Fatal("Load of a missing library succeeded")
	}
	if !strings.HasPrefix(err.Error(), "no CUDA driver: ") || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("error %q does not say which library failed", err)
	}
}

func TestLoadNVRTCMissingLibrarySaysWhy(t *testing.T) {
	_, err := LoadNVRTC("/nonexistent/libnvrtc.so")
	if err == nil || !strings.HasPrefix(err.Error(), "no NVRTC: ") {
		t.Fatalf("LoadNVRTC error = %v", err)
	}
}

func TestErrorNamesTheCallAndResult(t *testing.T) {
	e := &Error{Op: "cuMemCreate", Code: ErrNotPermitted, Name: "CUDA_ERROR_NOT_PERMITTED"}
	if e.Error() != "cuMemCreate: CUDA_ERROR_NOT_PERMITTED" {
		t.Fatalf("Error() = %q", e.Error())
	}
	if !IsResult(e, ErrNotPermitted) || IsResult(e, ErrNotSupported) {
		t.Fatal("IsResult does not match on the code")
	}
	bare := &Error{Op: "cuInit", Code: 42}
	if !strings.Contains(bare.Error(), "42") {
		t.Fatalf("unnamed result hides its code: %q", bare.Error())
	}
}

func TestRoundUp(t *testing.T) {
	for _, c := range []struct{ size, g, want uint64 }{{1, 2 << 20, 2 << 20}, {2 << 20, 2 << 20, 2 << 20}, {3 << 20, 2 << 20, 4 << 20}, {5, 0, 5}} {
		if got := RoundUp(c.size, c.g); got != c.want {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", c.size, c.g, got, c.want)
		}
	}
}

func TestSeqReachedComparesCyclically(t *testing.T) {
	for _, c := range []struct {
		shown, seq uint32
		want       bool
	}{
		{0, 1, false}, {1, 1, true}, {2, 1, true}, {1, 2, false},
		{0xffffffff, 0xffffffff, true}, {1, 0xffffffff, true}, // the word wrapped past seq (0 is skipped)
		{0xffffffff, 1, false}, // seq was issued after the wrap, the word has not got there
		{0x70000000, 1, true}, {1, 0x70000000, false},
	} {
		if got := SeqReached(c.shown, c.seq); got != c.want {
			t.Errorf("SeqReached(%#x, %#x) = %v, want %v", c.shown, c.seq, got, c.want)
		}
	}
}

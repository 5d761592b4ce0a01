// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdpass

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseReply feeds arbitrary lines to the fd socket's reply parser: it never panics, accepts only the
// two OK forms, and reports every refusal as ErrRefused.
func FuzzParseReply(f *testing.F) {
	for _, seed := range []string{"OK", "OK tok-123", "ERR token expired", "", "ok", "OKAY", "ERR", "OK \x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		token, err := parseReply(line)
		switch {
		case err == nil:
			if line != "OK" && line != "OK "+token {
				t.Fatalf("accepted %q as token %q", line, token)
			}
		case strings.HasPrefix(line, "ERR "):
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("refusal %q not reported as ErrRefused: %v", line, err)
			}
		}
	})
}

// FuzzParseRights feeds arbitrary control-message bytes to the SCM_RIGHTS parser: garbage is an error or no
// descriptors, never a panic.
func FuzzParseRights(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 24))
	f.Add([]byte{20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0})
	// SCM_RIGHTS with a 3-byte payload: not a whole descriptor (crashed the parser once).
	f.Add([]byte{19, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, oob []byte) {
		fds, err := parseRights(oob)
		if err != nil && len(fds) > 0 {
			t.Fatalf("error %v with descriptors %v", err, fds)
		}
		if len(fds) > len(oob)/4 {
			t.Fatalf("%d descriptors from %d bytes of control data", len(fds), len(oob))
		}
	})
}

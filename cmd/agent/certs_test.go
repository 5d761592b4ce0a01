// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCertsCommandRefusesBadInput: every flag's bad value is refused with a clear message and writes nothing;
// an existing pool's certificates are never replaced.
func TestCertsCommandRefusesBadInput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	for _, args := range [][]string{
		{},
		{"--dir", dir, "--validity", "0s"},
		{"--dir", dir, "--validity", "-1h"},
		{"--dir", dir, "--validity", "9000h"},
		{"--dir", dir, "--pool-name", ""},
		{"--dir", dir, "--pool-name", "x/y"}, // an agent refuses to start as pool x/y: its certificates were useless
		{"--dir", dir, "--pool-name", "KV"},
		{"--dir", dir, "--pool-namespace", "a.b"},
		{"--dir", dir, "--pool-namespace", ""},
		{"--dir", dir, "--validity", "soon"},
		{"--dir", dir, "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := runMain(context.Background(), append([]string{"certs"}, args...), &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("agent certs %q exited %d (stderr %q), want 2 with a message", args, code, errOut.String())
		}
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("agent certs %q wrote %s", args, dir)
		}
	}
	var out, errOut bytes.Buffer
	if code := runMain(context.Background(), []string{"certs", "--dir", dir}, &out, &errOut); code != 0 {
		t.Fatalf("agent certs exited %d: %s", code, errOut.String())
	}
	before, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := runMain(context.Background(), []string{"certs", "--dir", dir}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "refusing to replace") {
		t.Fatalf("agent certs over existing certificates exited %d: %s", code, errOut.String())
	}
	after, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the pool's key changed (%v)", err)
	}
}

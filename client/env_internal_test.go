// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestSocketPathFindsTheOneAgentOfTheHost: a path or $FABRICXFER_SOCKET wins, then a pod's mounted socket, then
// the one pool socket under the host's socket directories (counted once when two directory names lead to it);
// with none or several there, the pod's default path (whose dial fails naming what is there).
func TestSocketPathFindsTheOneAgentOfTheHost(t *testing.T) {
	root := t.TempDir()
	listen := func(path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	host := filepath.Join(root, "run")
	alias := filepath.Join(root, "var-run") // /var/run -> /run
	if err := os.Symlink(host, alias); err != nil {
		t.Fatal(err)
	}
	dirs := []string{host, alias}
	def := filepath.Join(root, "pod", "agent.sock")
	kv := filepath.Join(host, "kv", "agent.sock")

	if got := socketPath("", "", def, dirs); got != def {
		t.Errorf("nothing anywhere: %q, want the default %q", got, def)
	}
	listen(kv)
	if err := os.WriteFile(filepath.Join(host, "kv", "notes"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(host, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if want, _ := filepath.EvalSymlinks(kv); socketPath("", "", def, dirs) != want {
		t.Errorf("one pool's socket, seen under two names: %q, want %q", socketPath("", "", def, dirs), want)
	}
	if got := socketPath("/x/agent.sock", "/env/agent.sock", def, dirs); got != "/x/agent.sock" {
		t.Errorf("a path given: %q", got)
	}
	if got := socketPath("", "/env/agent.sock", def, dirs); got != "/env/agent.sock" {
		t.Errorf("$FABRICXFER_SOCKET set: %q", got)
	}
	listen(def)
	if got := socketPath("", "", def, dirs); got != def {
		t.Errorf("a pod's mounted socket beside a host's: %q, want %q", got, def)
	}
	os.Remove(def)
	listen(filepath.Join(host, "decode", "agent.sock"))
	if got := socketPath("", "", def, dirs); got != def {
		t.Errorf("two pools' sockets: %q, want the default %q (no guess)", got, def)
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatusFlags checks that status reads kubectl's flags, and refuses a bad -o before connecting anywhere.
func TestStatusFlags(t *testing.T) {
	for _, tc := range []struct {
		args               []string
		namespace, context string
		all                bool
		output             string
	}{
		{[]string{"-n", "kv", "--context", "prod", "-o", "wide"}, "kv", "prod", false, "wide"},
		{[]string{"--namespace=kv", "--output=json"}, "kv", "", false, "json"},
		{[]string{"-A", "-o", "yaml"}, "", "", true, "yaml"},
		{[]string{"--all-namespaces", "-oname"}, "", "", true, "name"},
	} {
		fs, o := newStatusFlags(&bytes.Buffer{})
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if *o.kube.Namespace != tc.namespace || *o.kube.Context != tc.context || o.allNamespaces != tc.all || o.output != tc.output {
			t.Errorf("%v: namespace %q context %q all %v output %q", tc.args, *o.kube.Namespace, *o.kube.Context, o.allNamespaces, o.output)
		}
		if err := checkOutput(o.output); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
	// A server that cannot answer: the command must fail on -o before trying it.
	_, errOut, code := run(t, "status", "--server", "https://127.0.0.1:1", "-o", "xml")
	if code != 2 || !strings.Contains(errOut, `--output "xml": want one of json, yaml, wide, name`) {
		t.Errorf("-o xml: code %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "status", "--frobnicate"); code != 2 || !strings.Contains(errOut, "frobnicate") {
		t.Errorf("unknown flag: code %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "status", "extra"); code != 2 || !strings.Contains(errOut, "extra") {
		t.Errorf("positional argument: code %d, %q", code, errOut)
	}
}

func TestPluginNameInUsage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if code := Run(ctx, Program{Name: "kubectl-fabricxfer"}, []string{"help"}, &out, &errOut); code != 0 ||
		!strings.HasPrefix(out.String(), "usage: kubectl fabricxfer <command>") || strings.Contains(out.String(), "xferctl") {
		t.Errorf("plugin usage: code %d\n%s", code, out.String())
	}
	out.Reset()
	if code := Run(ctx, Program{Name: "kubectl-fabricxfer"}, []string{"nonesuch"}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), `kubectl fabricxfer: unknown command "nonesuch"`) {
		t.Errorf("plugin unknown command: code %d\n%s", code, errOut.String())
	}
	if got := (Program{Name: "kubectl-foo-bar_baz"}).displayName(); got != "kubectl foo bar-baz" {
		t.Errorf("displayName %q", got)
	}
}

// TestCompletion checks that every shell's script names every command, and that __complete (what the scripts
// and kubectl_complete-fabricxfer ask) offers commands, each command's flags and status's -o values.
func TestCompletion(t *testing.T) {
	names := []string{"version"}
	for _, c := range commands(Program{}) {
		names = append(names, c.name)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := run(t, "completion", shell)
		if code != 0 || !strings.Contains(out, "xferctl") {
			t.Fatalf("completion %s: code %d\n%s", shell, code, errOut)
		}
		// The scripts ask the program for the words; __complete "" must offer each command.
		words, _, code := run(t, "__complete", "")
		for _, n := range names {
			if code != 0 || !strings.Contains(words, "\n"+n+"\t") && !strings.HasPrefix(words, n+"\t") {
				t.Errorf("%s completion does not offer %q:\n%s", shell, n, words)
			}
		}
	}
	if _, errOut, code := run(t, "completion", "tcsh"); code != 2 || !strings.Contains(errOut, "no completion script") {
		t.Errorf("completion tcsh: code %d, %q; want a usage error", code, errOut)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--"}, []string{"--all-namespaces", "--context", "--namespace", "--output", "--kubeconfig", "--server"}},
		{[]string{"status", "-o", ""}, []string{"json\n", "yaml\n", "wide\n", "name\n"}},
		{[]string{"transfer", "--"}, []string{"--socket", "--size", "--to"}},
		{[]string{"bench", "--"}, []string{"--iterations", "--json"}},
		{[]string{"local-agent", "--"}, []string{"--pool", "--node-name"}},
	} {
		out, errOut, code := run(t, append([]string{"__complete"}, tc.args...)...)
		for _, w := range tc.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("__complete %q lacks %q: code %d\n%s%s", tc.args, w, code, out, errOut)
			}
		}
	}
}

// TestAMissingSocketNamesTheOnesThere: a socket path with no agent behind it says so and names the pools'
// sockets found beside it (<socket dir>/<pool>/agent.sock), the mistake of naming the socket directory itself.
func TestAMissingSocketNamesTheOnesThere(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "kv"), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "kv", "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, errOut, code := run(t, "info", "--socket", filepath.Join(dir, "agent.sock"), "--timeout", "2s")
	if code == 0 || !strings.Contains(errOut, "no agent socket at "+filepath.Join(dir, "agent.sock")) ||
		!strings.Contains(errOut, filepath.Join(dir, "kv", "agent.sock")) {
		t.Errorf("a socket directory given as the socket: code %d, %q", code, errOut)
	}
	_, errOut, code = run(t, "info", "--socket", filepath.Join(dir, "none", "x", "agent.sock"), "--timeout", "2s")
	if code == 0 || !strings.Contains(errOut, "is the agent running?") {
		t.Errorf("no socket anywhere near: code %d, %q", code, errOut)
	}
}

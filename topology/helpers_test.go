// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/topology"
)

// fixture returns a Host over a fixture tree under testdata/.
func fixture(t testing.TB, name string) topology.DirHost {
	t.Helper()
	h, err := topology.NewDirHost(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return h
}

// alteredHost wraps a Host, failing some paths with an error and replacing the contents of others, the way
// a device cgroup or a different kernel would, without touching the fixture on disk.
type alteredHost struct {
	topology.Host
	errs     map[string]error
	contents map[string]string
}

func (a alteredHost) ReadFile(name string) ([]byte, error) {
	if err, ok := a.errs[name]; ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if c, ok := a.contents[name]; ok {
		return []byte(c), nil
	}
	return a.Host.ReadFile(name)
}

func (a alteredHost) ReadDir(name string) ([]string, error) {
	if err, ok := a.errs[name]; ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return a.Host.ReadDir(name)
}

// flatten turns a value into path -> JSON leaf, keeping lists of scalars whole, so two reports can be
// compared field by field.
func flatten(t testing.TB, v any) map[string]string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var generic any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(prefix+"."+k, e)
			}
		case []any:
			objects := false
			for _, e := range x {
				if _, ok := e.(map[string]any); ok {
					objects = true
				}
			}
			if objects {
				for i, e := range x {
					walk(fmt.Sprintf("%s[%d]", prefix, i), e)
				}
				return
			}
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		default:
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		}
	}
	walk("", generic)
	return out
}

// diff lists the paths whose values differ between two reports, sorted.
func diff(t testing.TB, a, b topology.Report) map[string][2]string {
	t.Helper()
	fa, fb := flatten(t, a), flatten(t, b)
	out := map[string][2]string{}
	for k, va := range fa {
		if vb, ok := fb[k]; !ok || vb != va {
			out[k] = [2]string{va, fb[k]}
		}
	}
	for k, vb := range fb {
		if _, ok := fa[k]; !ok {
			out[k] = [2]string{"", vb}
		}
	}
	return out
}

func assertDiffPaths(t *testing.T, d map[string][2]string, want ...string) {
	t.Helper()
	var got []string
	for k := range d {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		var lines []string
		for _, k := range got {
			lines = append(lines, fmt.Sprintf("  %s: %s -> %s", k, d[k][0], d[k][1]))
		}
		t.Fatalf("changed fields:\n%s\nwant exactly: %v", strings.Join(lines, "\n"), want)
	}
}

func mustDetect(t testing.TB, h topology.Host, opts topology.Options) topology.Report {
	t.Helper()
	r, err := topology.Detect(t.Context(), h, opts)
	if err != nil {
		t.Fatalf("Detect: %v", err)
	}
	return r
}

func engineOf(t testing.TB, r topology.Report, name string) topology.Engine {
	t.Helper()
	e, ok := r.Engine(name)
	if !ok {
		t.Fatalf("no %s engine in report", name)
	}
	return e
}

func nicRanking(g topology.GPU) string {
	var parts []string
	for _, n := range g.NICs {
		parts = append(parts, fmt.Sprintf("%s:%s", n.NIC, n.Level))
	}
	return strings.Join(parts, " ")
}

// assertDiffWithin fails when a changed field is outside the given path prefixes.
func assertDiffWithin(t *testing.T, d map[string][2]string, prefixes ...string) {
	t.Helper()
	for k, v := range d {
		ok := false
		for _, p := range prefixes {
			ok = ok || strings.HasPrefix(k, p)
		}
		if !ok {
			t.Errorf("unexpected change %s: %s -> %s", k, v[0], v[1])
		}
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary act as the peer process, as the xferbench binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "peer" {
		if err := runPeer(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"720": 720, "4KiB": 4096, "4Ki": 4096, "1MiB": 1 << 20, "2GiB": 2 << 30, "2G": 2e9, "9B": 9} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "4K", "1.5", "MiB", "99999999GiB"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}

func TestWorkloadItemsStayInTheirWindow(t *testing.T) {
	tg := &Target{Src: "a/src", Dst: "a/dst"}
	for _, w := range []Workload{{"contiguous", 4096, 1}, {"contiguous", 4096, 8}, {"scattered", 720, 500}} {
		for th := uint64(0); th < 3; th++ {
			base := th * w.window()
			items := w.items(tg, base, th)
			var total uint64
			dst := map[uint64]bool{}
			for _, it := range items {
				if it.SrcOffset < base || it.SrcOffset+it.Size > base+w.window() || it.DstOffset < base || it.DstOffset+it.Size > base+w.window() {
					t.Fatalf("%+v: item %+v leaves window [%d, +%d)", w, it, base, w.window())
				}
				if dst[it.DstOffset] {
					t.Fatalf("%+v: two items write offset %d", w, it.DstOffset)
				}
				dst[it.DstOffset] = true
				total += it.Size
			}
			if total != w.BytesPerOp() {
				t.Fatalf("%+v: items move %d bytes, want %d", w, total, w.BytesPerOp())
			}
		}
	}
}

// TestRunEndToEnd runs short sweeps of the host and tcp modes and checks the table, JSON and plot.
func TestRunEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a peer process")
	}
	dir := t.TempDir()
	for _, args := range [][]string{
		{"-engine", "xgmi", "-sizes", "4KiB,1MiB", "-batch", "2"},
		{"-engine", "xgmi", "-blocks", "300", "-block-size", "720"},
		{"-engine", "tcp", "-op", "write,read", "-sizes", "64KiB", "-conns", "2"},
		{"-engine", "auto", "-peer", "remote", "-sizes", "64KiB"},
	} {
		jsonPath, pngPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.png")
		var out, errOut bytes.Buffer
		full := append(args, "-iters", "2", "-min-time", "5ms", "-rounds", "1", "-json", jsonPath, "-png", pngPath)
		if err := run(full, &out, &errOut); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut.String())
		}
		var doc struct {
			Results []Result `json:"results"`
		}
		b, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Results) == 0 {
			t.Fatalf("%v: no results", args)
		}
		for _, r := range doc.Results {
			if r.GBps <= 0 || r.Ops < 2 || r.Baseline == nil || r.Baseline.GBps <= 0 || r.Ratio <= 0 {
				t.Fatalf("%v: implausible result %+v", args, r)
			}
		}
		if !strings.Contains(out.String(), "GB/s") || strings.Count(out.String(), "\n") != len(doc.Results)+1 {
			t.Fatalf("%v: table\n%s", args, out.String())
		}
		f, err := os.Open(pngPath)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil || img.Bounds().Dx() != plotW {
			t.Fatalf("%v: plot: %v", args, err)
		}
		if errOut.Len() != 0 {
			t.Fatalf("%v: progress bar drawn on a non-terminal: %q", args, errOut.String())
		}
	}
}

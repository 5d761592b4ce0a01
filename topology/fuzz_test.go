// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// memHost is an in-memory Host for fuzzing: files by node-absolute path, directories implied by them.
type memHost struct {
	files map[string]string
	links map[string]string
}

func (m memHost) ReadFile(name string) ([]byte, error) {
	if c, ok := m.files[path.Clean(name)]; ok {
		return []byte(c), nil
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (m memHost) ReadDir(name string) ([]string, error) {
	prefix := strings.TrimSuffix(path.Clean(name), "/") + "/"
	seen := map[string]bool{}
	for p := range m.files {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			seen[strings.SplitN(rest, "/", 2)[0]] = true
		}
	}
	for p := range m.links {
		if rest, ok := strings.CutPrefix(p, prefix); ok {
			seen[strings.SplitN(rest, "/", 2)[0]] = true
		}
	}
	if len(seen) == 0 {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

func (m memHost) Realpath(name string) (string, error) {
	if t, ok := m.links[path.Clean(name)]; ok {
		return t, nil
	}
	return path.Clean(name), nil
}

func FuzzParseKeyValues(f *testing.F) {
	f.Add([]byte("vendor_id 4098\ndrm_render_minor 128\nlocation_id 1280\n"))
	f.Add([]byte("hive_id 18446744073709551615\nunique_id 1801979520617338022\n"))
	f.Add([]byte("type 11\nnode_from 2\nnode_to 7\nflags 17\n\n\n"))
	f.Add([]byte("vendor_id -1\nvendor_id 4098 extra\n\x00\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kv := parseKeyValues(b)
		for k, v := range kv {
			// Every parsed key must appear in the input with its value.
			if !bytes.Contains(b, []byte(k)) || !bytes.Contains(b, []byte(strconv.FormatUint(v, 10))) {
				t.Fatalf("parsed %s=%d that is not in the input", k, v)
			}
		}
		if kfdIsGPU(1, kv) && (!bytes.Contains(b, []byte("vendor_id")) || !bytes.Contains(b, []byte("drm_render_minor"))) {
			t.Fatal("a GPU without vendor_id and drm_render_minor")
		}
		if loc, ok := kv["location_id"]; ok {
			if s, err := bdfFromLocation(kv["domain"], loc); err == nil {
				if _, err := canonicalBDF(s); err != nil {
					t.Fatalf("bdfFromLocation produced %q: %v", s, err)
				}
			}
		}
	})
}

func FuzzParsePortFields(f *testing.F) {
	for _, s := range []string{"4: ACTIVE", "1: DOWN", "5: ACTIVE_DEFER", "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", "InfiniBand", "Ethernet", ": ", "4:", "x: ACTIVE", "-1 Gb/sec"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if st, err := parsePortState(s); err == nil && (st == "" || !strings.Contains(s, st)) {
			t.Fatalf("state %q from %q", st, s)
		}
		if r, err := parseRate(s); err == nil && (r < 0 || !strings.Contains(s, "Gb/sec")) {
			t.Fatalf("rate %d from %q", r, s)
		}
		if ll, err := parseLinkLayer(s); err == nil && strings.TrimSpace(s) != ll {
			t.Fatalf("link layer %q from %q", ll, s)
		}
		if n, err := parseNUMANode(s); err == nil && n < -1 {
			t.Fatalf("numa %d from %q", n, s)
		}
		_, _ = parseHex(s)
	})
}

func FuzzParseGID(f *testing.F) {
	f.Add("fe80:0000:0000:0000:a088:c203:0012:3456")
	f.Add("0000:0000:0000:0000:0000:ffff:0a00:0001")
	f.Add("0000:0000:0000:0000:0000:0000:0000:0000")
	f.Add("zzzz:0000:0000:0000:0000:0000:0000:000g")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseGID(s)
		if err == nil && (!a.Is6() || strings.Count(s, ":") != 7) {
			t.Fatalf("GID %v from %q", a, s)
		}
	})
}

func FuzzCanonicalBDF(f *testing.F) {
	for _, s := range []string{"0000:05:00.0", "00000000:1B:00.0", "0008:01:00.0", "0000:00:01.10", "pci0000:00", "0000:0g:00.0", "::."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := canonicalBDF(s)
		if err != nil {
			return
		}
		again, err := canonicalBDF(c)
		if err != nil || again != c || len(c) != 12 {
			t.Fatalf("canonicalBDF(%q) = %q, not a fixed point (%q, %v)", s, c, again, err)
		}
	})
}

func FuzzUALinkKey(f *testing.F) {
	f.Add("1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081", "1")
	f.Add("0x1C9E2F4A6B7D4E119A2B3C4D5E6F7081", "7")
	f.Add("00000000-0000-0000-0000-000000000000", "1")
	f.Add("0x", "4294967295")
	f.Add("1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f708g", "0")
	f.Fuzz(func(t *testing.T, ppod, vpod string) {
		// Inputs are bounded: a ppod_id is at most 36 characters and a vpod_id 10 digits, so longer strings
		// only repeat what 128 bytes already reach (whitespace padding, a clipped error message). Unbounded,
		// the mutator grows strings to kilobytes, and when one finds new coverage (the Unicode paths of
		// ToLower and TrimSpace) go's fuzzer minimizes it by trying to remove every span of bytes, about len²/2
		// runs reported only when done: a 1 KiB string kept a worker at 0 execs/s for 30 s and more.
		if len(ppod) > 128 || len(vpod) > 128 {
			return
		}
		key, err := ualinkKey(ppod, vpod)
		if err != nil {
			return
		}
		rest, ok := strings.CutPrefix(key, "ualink:")
		uuid, id, ok2 := strings.Cut(rest, "/")
		if !ok || !ok2 || len(uuid) != 36 || id == "0" || id == "4294967295" {
			t.Fatalf("key %q from (%q, %q)", key, ppod, vpod)
		}
		if _, err := normalizePPodID(uuid); err != nil {
			t.Fatalf("key %q has a ppod that does not parse back: %v", key, err)
		}
	})
}

func FuzzProcFiles(f *testing.F) {
	f.Add([]byte("Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-5e1f0000-7b1c-4f9e-9d1a-a1b2c3d40000\nBus Location: \t 0000:1b:00.0\n"))
	f.Add([]byte("Character devices:\n195 nvidia-frontend\n237 nvidia-caps-imex-channels\n\nBlock devices:\n  7 loop\n"))
	f.Add([]byte("ffffffffc0a01000 T ib_umem_dmabuf_get\t[ib_uverbs]\n0 t ib_register_peer_memory_client_x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for k := range parseKeyColon(b) {
			if k == "" || !bytes.Contains(b, []byte(k)) {
				t.Fatalf("key %q not in input", k)
			}
		}
		for name, major := range parseCharDevices(b) {
			if major < 0 || !bytes.Contains(b, []byte(name)) {
				t.Fatalf("device %q major %d", name, major)
			}
		}
		if kallsymsHas(b, "ib_umem_dmabuf_get") && !bytes.Contains(b, []byte(" ib_umem_dmabuf_get")) {
			t.Fatal("symbol found that is not in the input")
		}
	})
}

func FuzzParsePCIPath(f *testing.F) {
	f.Add("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:05:00.0", "/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:09:00.0")
	f.Add("/sys/devices/pci0000:00/0000:00:01.1/0000:05:00.0", "/sys/devices/pci0000:00/0000:00:01.10/0000:09:00.0")
	f.Add("/sys/devices/virtual/net/lo", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		pa, okA := parsePCIPath(a)
		pb, okB := parsePCIPath(b)
		if !okA || !okB {
			return
		}
		l1, h1 := pciDistance(pa, pb, 0, 0)
		l2, h2 := pciDistance(pb, pa, 0, 0)
		if l1 != l2 || h1 != h2 || l1 < LevelPIX || l1 > LevelSYS || h1 < 0 {
			t.Fatalf("distance not symmetric or out of range: %v/%d vs %v/%d", l1, h1, l2, h2)
		}
	})
}

// FuzzDetectKFDNode puts garbage where one KFD node's files are: detection must not panic and must never
// report more GPUs than nodes, nor a GPU whose files do not say it is one.
func FuzzDetectKFDNode(f *testing.F) {
	f.Add("1234", "vendor_id 4098\ndrm_render_minor 128\nlocation_id 1280\nlocal_mem_size 1024\n", "type 11\nnode_from 1\nnode_to 1\nflags 1\n")
	f.Add("0", "cpu_cores_count 96\n", "")
	f.Add("x", "\x00", "type 11\nnode_from 1\nnode_to 99\nflags 17\n")
	f.Fuzz(func(t *testing.T, gpuID, props, link string) {
		h := memHost{files: map[string]string{
			kfdNodesDir + "/0/gpu_id":                "0\n",
			kfdNodesDir + "/0/properties":            "cpu_cores_count 8\n",
			kfdNodesDir + "/1/gpu_id":                gpuID,
			kfdNodesDir + "/1/properties":            props,
			kfdNodesDir + "/1/io_links/0/properties": link,
		}}
		r, err := Detect(context.Background(), h, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GPUs) > 1 {
			t.Fatalf("%d GPUs from one KFD GPU node", len(r.GPUs))
		}
		if len(r.GPUs) == 1 {
			id, err := strconv.ParseUint(strings.TrimSpace(gpuID), 10, 32)
			if err != nil || id == 0 || !kfdIsGPU(id, parseKeyValues([]byte(props))) {
				t.Fatalf("GPU reported from gpu_id %q and properties %q", gpuID, props)
			}
			if len(r.GPUs[0].XGMIPeers) != 0 {
				t.Fatalf("a lone GPU has peers %v", r.GPUs[0].XGMIPeers)
			}
		}
		if len(r.NICs) != 0 {
			t.Fatal("NICs from a KFD tree")
		}
	})
}

// FuzzDetectRDMAPort puts garbage in one port's files: the port is reported once (it exists), and it is
// usable only if its files really say ACTIVE and a transport the engine speaks.
func FuzzDetectRDMAPort(f *testing.F) {
	f.Add("4: ACTIVE", "InfiniBand", "400 Gb/sec (4X NDR)", "fe80:0000:0000:0000:a088:c203:0012:3456", "IB/RoCE v1")
	f.Add("4: ACTIVE", "Ethernet", "100 Gb/sec (4X EDR)", "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")
	f.Add("1: DOWN", "Ethernet", "", "fe80:0000:0000:0000:0ac0:ebff:fe1e:0001", "RoCE v2")
	f.Add("\xff", "\x00", "Gb/sec", "::", "")
	f.Fuzz(func(t *testing.T, state, linkLayer, rate, gid, gidType string) {
		port := infinibandDir + "/mlx5_0/ports/1"
		h := memHost{files: map[string]string{
			port + "/state": state, port + "/link_layer": linkLayer, port + "/rate": rate,
			port + "/gids/0": gid, port + "/gid_attrs/types/0": gidType,
			"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/numa_node": "0\n",
		}, links: map[string]string{infinibandDir + "/mlx5_0/device": "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"}}
		r, err := Detect(context.Background(), h, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.NICs) != 1 || r.NICs[0].Name != "mlx5_0" || r.NICs[0].Port != 1 || len(r.GPUs) != 0 {
			t.Fatalf("NICs %+v GPUs %d from one port", r.NICs, len(r.GPUs))
		}
		n := r.NICs[0]
		if n.Usable() && (!strings.Contains(state, "ACTIVE") || !strings.Contains(linkLayer, n.LinkLayer)) {
			t.Fatalf("usable port from state %q link layer %q", state, linkLayer)
		}
		if n.RoCEv2 && !strings.Contains(gidType, "RoCE v2") {
			t.Fatalf("RoCE v2 from GID type %q", gidType)
		}
		if e, _ := r.Engine(EngineRDMA); e.Available != n.Usable() {
			t.Fatalf("rdma engine %+v for port %+v", e, n)
		}
	})
}

func TestRealpathStaysInsideRoot(t *testing.T) {
	root := t.TempDir()
	h, err := NewDirHost(root)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(p string) {
		if err := os.MkdirAll(root+p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
	mk("/sys/class/infiniband")
	// An absolute link target resolves under the root, not on the machine running the test.
	if err := os.Symlink("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", root+"/sys/class/infiniband/abs"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../devices/pci0000:00/0000:00:01.0/0000:01:00.0", root+"/sys/class/infiniband/rel"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("loop", root+"/sys/class/infiniband/loop"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"abs", "rel"} {
		got, err := h.Realpath("/sys/class/infiniband/" + name)
		if err != nil || got != "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0" {
			t.Errorf("Realpath(%s) = %q, %v", name, got, err)
		}
	}
	// ".." above the root stays at the root: the machine's own /etc is never reached.
	if got, err := h.Realpath("/sys/../../../etc"); err == nil {
		t.Errorf("Realpath escaped the root: %q", got)
	}
	if _, err := h.Realpath("/sys/class/infiniband/loop"); err == nil {
		t.Error("Realpath followed a link loop forever")
	}
}

func TestPCIDistanceComparesWholeComponents(t *testing.T) {
	gpu, _ := parsePCIPath("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0")
	nic, _ := parsePCIPath("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:09:00.0")
	if l, _ := pciDistance(gpu, nic, 0, 0); l != LevelPXB {
		t.Errorf("AMD guide pair: %v, want PXB", l)
	}
	a, _ := parsePCIPath("/sys/devices/pci0000:00/0000:00:01.1/0000:05:00.0")
	b, _ := parsePCIPath("/sys/devices/pci0000:00/0000:00:01.10/0000:06:00.0")
	if l, _ := pciDistance(a, b, 0, 0); l != LevelPHB {
		t.Errorf("01.1 vs 01.10: %v, want PHB (different root ports)", l)
	}
	c, _ := parsePCIPath("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0")
	if l, _ := pciDistance(a, c, 0, 0); l != LevelNODE {
		t.Errorf("two roots, one NUMA node: %v, want NODE", l)
	}
	if l, _ := pciDistance(a, c, 0, 1); l != LevelSYS {
		t.Errorf("two NUMA nodes: %v, want SYS", l)
	}
	if l, _ := pciDistance(a, c, -1, -1); l != LevelSYS {
		t.Errorf("unknown NUMA: %v, want SYS (not guessed near)", l)
	}
}

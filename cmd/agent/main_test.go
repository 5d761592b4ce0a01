// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

const testdata = "../../topology/testdata"

func runAgent(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runMain(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestDetectJSONIsTheTransferNodeStatus(t *testing.T) {
	out, errOut, code := runAgent(t, "detect", "--host-root", filepath.Join(testdata, "ualink-vpod-node-b-accel-error"), "-o", "json", "--endpoint", "10.1.2.3:7470")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var st v1alpha1.TransferNodeStatus
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("output is not a TransferNode status: %v\n%s", err, out)
	}
	if len(st.GPUs) != 4 || st.GPUs[0].Fabric == nil || st.GPUs[0].Fabric.Domain != "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1" ||
		st.GPUs[3].Fabric != nil || st.GPUs[2].PCIBusID != "0000:85:00.0" || st.Endpoint != "10.1.2.3:7470" {
		t.Errorf("status %+v", st)
	}
	if len(st.Engines) != 4 || st.Engines[1].Name != v1alpha1.EngineFabric || !st.Engines[1].Available ||
		!strings.Contains(st.Engines[1].Reason, `GPU 3: UALink accel_state "error"`) {
		t.Errorf("engines %+v", st.Engines)
	}
	if st.LastHeartbeat != nil {
		t.Error("detect must not invent a heartbeat")
	}
}

func TestDetectTableSections(t *testing.T) {
	out, errOut, code := runAgent(t, "detect", "--host-root", filepath.Join(testdata, "hgx-h200-8gpu-ib"),
		"--nvml-fixture", filepath.Join(testdata, "hgx-h200-8gpu-ib.nvml.json"), "--node-name", "hgx-1", "--disable-engines", "tcp")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"Node hgx-1", "GPUs (8)", "RDMA ports (8)", "NICs per GPU, nearest first", "GPU 0  mlx5_0/1 PIX",
		"Engines", "tcp     unavailable  disabled by agent configuration (--disable-engines)",
		"NVSwitches on PCIe: 4; IMEX channel region registered: yes; IMEX channel devices: 1",
		"Unreadable facts (0)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestBadInvocations(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"detect", "-o", "yaml"},
		{"detect", "--host-root", filepath.Join(t.TempDir(), "missing")},
		{"detect", "--disable-engines", "nvlink"},
		{"detect", "--engines", "xgmi,ib"},
		{"detect", "--engines", ","},
		{"detect", "--fabric-domain", "vpod-1"},
		{"detect", "--nvml-fixture", filepath.Join(t.TempDir(), "none.json")},
		{"detect", "extra"},
		{"detect", "--node-name", "n", "--kubeconfig", filepath.Join(t.TempDir(), "missing-kubeconfig")},
		{"detect", "--node-name", "", "--kubeconfig", filepath.Join(t.TempDir(), "missing-kubeconfig")},
		{"run", "--node-name", ""},
		{"run", "--node-name", "n", "--heartbeat", "0s"},
	} {
		_, errOut, code := runAgent(t, args...)
		if code == 0 || errOut == "" {
			t.Errorf("agent %v: exit %d, stderr %q; want a failure that says why", args, code, errOut)
		}
	}
}

func TestPoolEnginesAndDisabledEnginesCombine(t *testing.T) {
	out, errOut, code := runAgent(t, "detect", "--host-root", filepath.Join(testdata, "rdma-only-node"), "-o", "json",
		"--engines", "rdma,tcp,xgmi", "--disable-engines", "tcp")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var st v1alpha1.TransferNodeStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	want := map[v1alpha1.EngineName]string{
		v1alpha1.EngineXGMI:   "no GPU detected",
		v1alpha1.EngineFabric: "disabled by the pool's engines (--engines) and agent configuration (--disable-engines) (hardware: unavailable: no GPU detected)",
		v1alpha1.EngineRDMA:   "2 of 2 ports usable",
		v1alpha1.EngineTCP:    "disabled by the pool's engines (--engines) and agent configuration (--disable-engines) (hardware: available: host memory over TCP)",
	}
	for _, e := range st.Engines {
		if e.Reason != want[e.Name] || e.Available != (e.Name == v1alpha1.EngineRDMA) {
			t.Errorf("engine %s: available %t reason %q", e.Name, e.Available, e.Reason)
		}
	}
}

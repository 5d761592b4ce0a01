// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nvmlfake

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/topology"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvml.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRejectsWhatNVMLCouldNotSay(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field": `{"devices":[{"name":"x","pciAddress":"0000:01:00.0"}]}`,
		"bad UUID":      `{"devices":[{"fabric":{"state":3,"status":"SUCCESS","clusterUUID":"not-a-uuid"}}]}`,
		"not JSON":      `devices:`,
	} {
		if _, err := Load(write(t, body)); err == nil {
			t.Errorf("%s: Load accepted %s", name, body)
		}
	}
}

func TestFakeAnswers(t *testing.T) {
	m, err := Load(write(t, `{"devices":[
		{"name":"NVIDIA GB200","uuid":"GPU-1","pciBusID":"00000008:01:00.0","memoryBytes":42,"p2pNVLink":"OK",
		 "p2pOverrides":{"1":"NOT_SUPPORTED"},"fabric":{"state":3,"status":"SUCCESS","clusterUUID":"6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b","cliqueId":7}},
		{"name":"NVIDIA GB200","uuid":"GPU-2","pciBusID":"00000008:02:00.0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	lib, release, err := m.Opener()()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if n, _ := lib.DeviceCount(); n != 2 {
		t.Fatalf("count %d", n)
	}
	if st, err := lib.P2PNVLink(0, 1); err != nil || st != "NOT_SUPPORTED" {
		t.Errorf("P2P 0->1 = %q, %v", st, err)
	}
	if _, err := lib.P2PNVLink(1, 0); !errors.Is(err, topology.ErrNotSupported) {
		t.Errorf("P2P 1->0 error %v, want not supported", err)
	}
	if _, err := lib.FabricInfo(1); !errors.Is(err, topology.ErrNotSupported) {
		t.Errorf("fabric of device 1: %v", err)
	}
	fi, err := lib.FabricInfo(0)
	if err != nil || fi.CliqueID != 7 || fi.ClusterUUID[0] != 0x6f || fi.State != topology.FabricStateCompleted {
		t.Errorf("fabric of device 0: %+v %v", fi, err)
	}
	if _, err := lib.UUID(5); err == nil {
		t.Error("UUID of a device that does not exist")
	}
	if _, _, err := (Machine{InitError: "ERROR_DRIVER_NOT_LOADED"}).Opener()(); err == nil || !strings.Contains(err.Error(), "ERROR_DRIVER_NOT_LOADED") {
		t.Errorf("init error %v", err)
	}
}

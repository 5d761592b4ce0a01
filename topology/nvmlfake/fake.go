// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nvmlfake

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/fabricxfer/fabricxfer/topology"
)

// Machine is the JSON shape of a fake: what NVML would answer on one node.
type Machine struct {
	// InitError, when set, makes Open fail with it (e.g. "ERROR_LIBRARY_NOT_FOUND").
	InitError string   `json:"initError,omitempty"`
	Devices   []Device `json:"devices"`
}

// Device is one GPU as NVML reports it.
type Device struct {
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	PCIBusID    string `json:"pciBusID"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// NVLinks lists the device's links; empty means NVLink is not supported.
	NVLinks []topology.NVLink `json:"nvlinks,omitempty"`
	// P2PNVLink is the NVLink P2P status towards every other device unless P2POverrides names it; empty
	// means not supported.
	P2PNVLink string `json:"p2pNVLink,omitempty"`
	// P2POverrides maps a peer's NVML index (as a string) to a status.
	P2POverrides map[string]string `json:"p2pOverrides,omitempty"`
	// Fabric is the GPU fabric info; nil means the query is not supported.
	Fabric *Fabric `json:"fabric,omitempty"`
}

// Fabric is GPU fabric info with the cluster UUID written as text.
type Fabric struct {
	State       uint8  `json:"state"`
	Status      string `json:"status"`
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueId"`
}

// Load reads a Machine from a JSON file.
func Load(path string) (Machine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Machine{}, fmt.Errorf("reading NVML fixture: %w", err)
	}
	var m Machine
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Machine{}, fmt.Errorf("parsing NVML fixture %s: %w", path, err)
	}
	for i, d := range m.Devices {
		if d.Fabric != nil {
			if _, err := parseUUID(d.Fabric.ClusterUUID); err != nil {
				return Machine{}, fmt.Errorf("NVML fixture %s device %d: %w", path, i, err)
			}
		}
	}
	return m, nil
}

// Opener returns a topology.OpenNVML that serves this machine.
func (m Machine) Opener() topology.OpenNVML {
	return func() (topology.NVML, func(), error) {
		if m.InitError != "" {
			return nil, nil, fmt.Errorf("nvmlInit: %s", m.InitError)
		}
		return fake{m}, func() {}, nil
	}
}

type fake struct{ m Machine }

func (f fake) dev(i int) (Device, error) {
	if i < 0 || i >= len(f.m.Devices) {
		return Device{}, fmt.Errorf("device %d: ERROR_INVALID_ARGUMENT", i)
	}
	return f.m.Devices[i], nil
}

func (f fake) DeviceCount() (int, error) { return len(f.m.Devices), nil }

func (f fake) Name(i int) (string, error) {
	d, err := f.dev(i)
	return d.Name, err
}

func (f fake) UUID(i int) (string, error) {
	d, err := f.dev(i)
	return d.UUID, err
}

func (f fake) PCIBusID(i int) (string, error) {
	d, err := f.dev(i)
	return d.PCIBusID, err
}

func (f fake) MemoryBytes(i int) (uint64, error) {
	d, err := f.dev(i)
	return d.MemoryBytes, err
}

func (f fake) NVLinks(i int) ([]topology.NVLink, error) {
	d, err := f.dev(i)
	if err != nil {
		return nil, err
	}
	if len(d.NVLinks) == 0 {
		return nil, fmt.Errorf("NVLink state: %w", topology.ErrNotSupported)
	}
	return d.NVLinks, nil
}

func (f fake) P2PNVLink(i, j int) (string, error) {
	d, err := f.dev(i)
	if err != nil {
		return "", err
	}
	if _, err := f.dev(j); err != nil {
		return "", err
	}
	if st, ok := d.P2POverrides[fmt.Sprint(j)]; ok {
		return st, nil
	}
	if d.P2PNVLink == "" {
		return "", fmt.Errorf("P2P status: %w", topology.ErrNotSupported)
	}
	return d.P2PNVLink, nil
}

func (f fake) FabricInfo(i int) (topology.FabricInfo, error) {
	d, err := f.dev(i)
	if err != nil {
		return topology.FabricInfo{}, err
	}
	if d.Fabric == nil {
		return topology.FabricInfo{}, fmt.Errorf("GPU fabric info: %w", topology.ErrNotSupported)
	}
	u, err := parseUUID(d.Fabric.ClusterUUID)
	if err != nil {
		return topology.FabricInfo{}, err
	}
	return topology.FabricInfo{State: d.Fabric.State, Status: d.Fabric.Status, ClusterUUID: u, CliqueID: d.Fabric.CliqueID}, nil
}

func parseUUID(s string) ([16]byte, error) {
	var out [16]byte
	if s == "" {
		return out, nil
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(raw) != 16 {
		return out, errors.New("clusterUUID " + s + ": want a UUID")
	}
	copy(out[:], raw)
	return out, nil
}

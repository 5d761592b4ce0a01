// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"errors"
	"fmt"
)

// NVML is what detection needs from NVIDIA's management library. Devices are named by NVML index. The real
// implementation lives in topology/nvml (cgo); tests and demos use topology/nvmlfake.
type NVML interface {
	DeviceCount() (int, error)
	Name(i int) (string, error)
	UUID(i int) (string, error)
	// PCIBusID returns the bus id as NVML prints it ("00000000:1B:00.0").
	PCIBusID(i int) (string, error)
	MemoryBytes(i int) (uint64, error)
	// NVLinks returns the state of every NVLink of the device; ErrNotSupported when it has none.
	NVLinks(i int) ([]NVLink, error)
	// P2PNVLink returns NVML's P2P status over NVLink between two devices ("OK" when usable).
	P2PNVLink(i, j int) (string, error)
	// FabricInfo returns the device's GPU fabric (multi-node NVLink) registration.
	FabricInfo(i int) (FabricInfo, error)
}

// OpenNVML loads NVML and returns it with the function that releases it.
type OpenNVML func() (NVML, func(), error)

// ErrNotSupported is what an NVML implementation returns for a query the device or driver does not support.
var ErrNotSupported = errors.New("not supported")

// NVLink is one NVLink of a GPU.
type NVLink struct {
	Link   int  `json:"link"`
	Active bool `json:"active"`
	// RemoteType is GPU, SWITCH, IBMNPU or UNKNOWN.
	RemoteType  string `json:"remoteType,omitempty"`
	RemoteBusID string `json:"remoteBusID,omitempty"`
}

// Fabric states as NVML numbers them (nvmlGpuFabricState_t).
const (
	FabricStateNotSupported uint8 = 0
	FabricStateNotStarted   uint8 = 1
	FabricStateInProgress   uint8 = 2
	FabricStateCompleted    uint8 = 3
)

// FabricInfo is NVML's GPU fabric info (the v3 shape, reduced to what detection uses).
type FabricInfo struct {
	State uint8 `json:"state"`
	// Status is the NVML return name of the registration ("SUCCESS"); meaningful once State is COMPLETED.
	Status      string   `json:"status"`
	ClusterUUID [16]byte `json:"clusterUUID"`
	CliqueID    uint32   `json:"cliqueId"`
}

// FabricStateName names a fabric state as NVML does.
func FabricStateName(s uint8) string {
	switch s {
	case FabricStateNotSupported:
		return "NOT_SUPPORTED"
	case FabricStateNotStarted:
		return "NOT_STARTED"
	case FabricStateInProgress:
		return "IN_PROGRESS"
	case FabricStateCompleted:
		return "COMPLETED"
	}
	return fmt.Sprintf("UNKNOWN(%d)", s)
}

// nvlinkFabric applies the rules NVIDIA's DRA driver and NCCL use: a GPU is in a multi-node NVLink domain
// only when its fabric registration COMPLETED with SUCCESS and a non-zero cluster UUID; the domain is that
// UUID plus the clique id.
func nvlinkFabric(fi FabricInfo, err error) (*Fabric, string, error) {
	if errors.Is(err, ErrNotSupported) {
		return nil, "NVML fabric info not supported", nil
	}
	if err != nil {
		return nil, "", err
	}
	state := FabricStateName(fi.State)
	switch {
	case fi.State == FabricStateNotSupported:
		return nil, "NVML fabric state " + state, nil
	case fi.State != FabricStateCompleted:
		return nil, "NVML fabric state " + state + ": fabric registration not complete", nil
	case fi.Status != "SUCCESS":
		return nil, fmt.Sprintf("NVML fabric state %s with status %s", state, fi.Status), nil
	case fi.ClusterUUID == [16]byte{}:
		return nil, "NVML fabric state " + state + ", cluster UUID zero: NVLink within the node only", nil
	}
	key := fmt.Sprintf("%s:%s.%d", FabricNVLink, formatUUID(fi.ClusterUUID[:]), fi.CliqueID)
	return &Fabric{Kind: FabricNVLink, Domain: key}, "NVML fabric state " + state, nil
}

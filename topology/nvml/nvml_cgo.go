// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

//go:build cgo

package nvml

import (
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fabricxfer/fabricxfer/topology"
)

// Open initialises NVML; the returned function shuts it down.
func Open() (topology.NVML, func(), error) {
	lib := gonvml.New()
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, nil, fmt.Errorf("nvmlInit: %s", errorString(ret))
	}
	n := &library{lib: lib}
	return n, func() { _ = lib.Shutdown() }, nil
}

type library struct {
	lib gonvml.Interface
}

func wrap(what string, ret gonvml.Return) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	if ret == gonvml.ERROR_NOT_SUPPORTED {
		return fmt.Errorf("%s: %w", what, topology.ErrNotSupported)
	}
	return fmt.Errorf("%s: %s", what, errorString(ret))
}

func errorString(ret gonvml.Return) string {
	return ret.Error()
}

func (l *library) device(i int) (gonvml.Device, error) {
	d, ret := l.lib.DeviceGetHandleByIndex(i)
	return d, wrap(fmt.Sprintf("device %d handle", i), ret)
}

func (l *library) DeviceCount() (int, error) {
	n, ret := l.lib.DeviceGetCount()
	return n, wrap("device count", ret)
}

func (l *library) Name(i int) (string, error) {
	d, err := l.device(i)
	if err != nil {
		return "", err
	}
	s, ret := d.GetName()
	return s, wrap("name", ret)
}

func (l *library) UUID(i int) (string, error) {
	d, err := l.device(i)
	if err != nil {
		return "", err
	}
	s, ret := d.GetUUID()
	return s, wrap("UUID", ret)
}

func (l *library) PCIBusID(i int) (string, error) {
	d, err := l.device(i)
	if err != nil {
		return "", err
	}
	p, ret := d.GetPciInfo()
	if err := wrap("PCI info", ret); err != nil {
		return "", err
	}
	return cString(p.BusId[:]), nil
}

func (l *library) MemoryBytes(i int) (uint64, error) {
	d, err := l.device(i)
	if err != nil {
		return 0, err
	}
	m, ret := d.GetMemoryInfo()
	return m.Total, wrap("memory info", ret)
}

func (l *library) NVLinks(i int) ([]topology.NVLink, error) {
	d, err := l.device(i)
	if err != nil {
		return nil, err
	}
	var links []topology.NVLink
	for link := 0; link < gonvml.NVLINK_MAX_LINKS; link++ {
		st, ret := d.GetNvLinkState(link)
		if ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_INVALID_ARGUMENT {
			break // no such link: links are numbered densely from 0
		}
		if err := wrap(fmt.Sprintf("NVLink %d state", link), ret); err != nil {
			return links, err
		}
		nl := topology.NVLink{Link: link, Active: st == gonvml.FEATURE_ENABLED}
		if nl.Active {
			if t, ret := d.GetNvLinkRemoteDeviceType(link); ret == gonvml.SUCCESS {
				nl.RemoteType = remoteType(t)
			}
			if p, ret := d.GetNvLinkRemotePciInfo(link); ret == gonvml.SUCCESS {
				nl.RemoteBusID = cString(p.BusId[:])
			}
		}
		links = append(links, nl)
	}
	if len(links) == 0 {
		return nil, fmt.Errorf("NVLink state: %w", topology.ErrNotSupported)
	}
	return links, nil
}

func remoteType(t gonvml.IntNvLinkDeviceType) string {
	switch t {
	case gonvml.NVLINK_DEVICE_TYPE_GPU:
		return "GPU"
	case gonvml.NVLINK_DEVICE_TYPE_SWITCH:
		return "SWITCH"
	case gonvml.NVLINK_DEVICE_TYPE_IBMNPU:
		return "IBMNPU"
	}
	return "UNKNOWN"
}

func (l *library) P2PNVLink(i, j int) (string, error) {
	a, err := l.device(i)
	if err != nil {
		return "", err
	}
	b, err := l.device(j)
	if err != nil {
		return "", err
	}
	st, ret := a.GetP2PStatus(b, gonvml.P2P_CAPS_INDEX_NVLINK)
	if err := wrap("P2P status", ret); err != nil {
		return "", err
	}
	return p2pStatusName(st), nil
}

func p2pStatusName(s gonvml.GpuP2PStatus) string {
	switch s {
	case gonvml.P2P_STATUS_OK:
		return "OK"
	case gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "CHIPSET_NOT_SUPPORTED"
	case gonvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GPU_NOT_SUPPORTED"
	case gonvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "IOH_TOPOLOGY_NOT_SUPPORTED"
	case gonvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "DISABLED_BY_REGKEY"
	case gonvml.P2P_STATUS_NOT_SUPPORTED:
		return "NOT_SUPPORTED"
	}
	return fmt.Sprintf("UNKNOWN(%d)", s)
}

// FabricInfo prefers the versioned v3 query and falls back to the original one on older drivers.
func (l *library) FabricInfo(i int) (topology.FabricInfo, error) {
	d, err := l.device(i)
	if err != nil {
		return topology.FabricInfo{}, err
	}
	if v3, ret := d.GetGpuFabricInfoV().V3(); ret == gonvml.SUCCESS {
		return topology.FabricInfo{State: v3.State, Status: returnName(gonvml.Return(v3.Status)), ClusterUUID: v3.ClusterUuid, CliqueID: v3.CliqueId}, nil
	}
	v1, ret := d.GetGpuFabricInfo()
	if err := wrap("GPU fabric info", ret); err != nil {
		return topology.FabricInfo{}, err
	}
	return topology.FabricInfo{State: v1.State, Status: returnName(gonvml.Return(v1.Status)), ClusterUUID: v1.ClusterUuid, CliqueID: v1.CliqueId}, nil
}

func returnName(r gonvml.Return) string {
	if r == gonvml.SUCCESS {
		return "SUCCESS"
	}
	return strings.ToUpper(strings.ReplaceAll(r.Error(), " ", "_"))
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

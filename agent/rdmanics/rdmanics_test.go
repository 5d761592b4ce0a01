// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdmanics

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/rdma/fakeverbs"
	"github.com/fabricxfer/fabricxfer/topology"
)

// Every port goes over with detection's verdict (a down port and a RoCE port without a v2 GID are not
// usable), each GPU keeps its ranking in order, and detection's reason for the engine wins.
func TestFromReport(t *testing.T) {
	rep := &topology.Report{
		GPUs: []topology.GPU{{Index: 0, PCIBusID: "0000:1a:00.0", NICs: []topology.NICRank{
			{NIC: "mlx5_1", Port: 1, Level: topology.LevelPIX}, {NIC: "mlx5_0", Port: 1, Level: topology.LevelSYS}}}},
		NICs: []topology.NIC{
			{Name: "mlx5_0", Port: 1, State: "ACTIVE", LinkLayer: "InfiniBand"},
			{Name: "mlx5_1", Port: 1, State: "DOWN", LinkLayer: "InfiniBand"},
			{Name: "mlx5_2", Port: 1, State: "ACTIVE", LinkLayer: "Ethernet"},
			{Name: "mlx5_3", Port: 2, State: "ACTIVE", LinkLayer: "Ethernet", RoCEv2: true},
		},
	}
	got := FromReport(rep)
	want := rdma.NICs{
		Ports: []rdma.Port{
			{PortName: rdma.PortName{Device: "mlx5_0", Port: 1}, Usable: true},
			{PortName: rdma.PortName{Device: "mlx5_1", Port: 1}},
			{PortName: rdma.PortName{Device: "mlx5_2", Port: 1}},
			{PortName: rdma.PortName{Device: "mlx5_3", Port: 2}, Usable: true},
		},
		GPUs: []rdma.GPUPorts{{Index: 0, PCIBusID: "0000:1a:00.0", Nearest: []rdma.PortName{{Device: "mlx5_1", Port: 1}, {Device: "mlx5_0", Port: 1}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromReport =\n%+v\nwant\n%+v", got, want)
	}

	rep.Engines = []topology.Engine{{Name: engines.EngineRDMA, Reason: "disabled by --disable-engines"}}
	e, err := rdma.New(rdma.Options{Node: "n", Provider: fakeverbs.NewNetwork().Provider("n"), NICs: FromReport(rep)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := e.Available(); ok || why != "disabled by --disable-engines" {
		t.Fatalf("Available = %v %q, want detection's reason", ok, why)
	}
	if ok, why := mustNew(t, FromReport(nil)).Available(); ok || !strings.Contains(why, "no topology report") {
		t.Fatalf("Available without a report = %v %q", ok, why)
	}
}

func mustNew(t *testing.T, nics rdma.NICs) *rdma.Engine {
	t.Helper()
	e, err := rdma.New(rdma.Options{Node: "n", Provider: fakeverbs.NewNetwork().Provider("n"), NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/rdma/fakeverbs"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// TestAcceptAnswersAsManyQueuePairsAsOffered: the request comes over the wire from a peer whose QPsPerPeer may
// differ; the answer pairs with what was offered, and a device this node has no usable port on is refused.
func TestAcceptAnswersAsManyQueuePairsAsOffered(t *testing.T) {
	c := newCluster(t, func(o *rdma.Options) { o.QPsPerPeer = 3 }, "node-b")
	dev, err := c.net.Provider("node-a").Open("mlx5_0", 1)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := dev.CreateQP(4)
	if err != nil {
		t.Fatal(err)
	}
	req := rdma.ExchangeRequest{From: "node-a", To: "node-b", FromNIC: "mlx5_0", ToNIC: "mlx5_0", QPs: []verbs.ConnInfo{qp.Info()}}
	infos, err := c.nodes["node-b"].AcceptQPs(context.Background(), req)
	if err != nil || len(infos) != 1 {
		t.Fatalf("AcceptQPs of one queue pair = %d infos, %v; want 1", len(infos), err)
	}
	if err := qp.Connect(infos[0]); err != nil {
		t.Fatalf("connecting to the answer: %v", err)
	}
	req.FromNIC, req.ToNIC = "mlx5_1", "mlx5_9"
	if _, err := c.nodes["node-b"].AcceptQPs(context.Background(), req); !errors.Is(err, engines.ErrInvalid) {
		t.Fatalf("AcceptQPs for an unknown device = %v, want ErrInvalid", err)
	}
	req.ToNIC = ""
	if _, err := c.nodes["node-b"].AcceptQPs(context.Background(), req); !errors.Is(err, engines.ErrInvalid) {
		t.Fatalf("AcceptQPs naming no device = %v, want ErrInvalid", err)
	}
}

// TestNewRefusesNICsWithoutADevice: the NIC facts come from the caller; a port without a device name or with
// port 0 cannot be opened and is refused at New, not at the first registration.
func TestNewRefusesNICsWithoutADevice(t *testing.T) {
	for _, bad := range []rdma.Port{{PortName: rdma.PortName{Device: "", Port: 1}, Usable: true}, {PortName: rdma.PortName{Device: "mlx5_0", Port: 0}}} {
		nics := nics()
		nics.Ports = append(nics.Ports, bad)
		_, err := rdma.New(rdma.Options{Node: "node-a", Provider: fakeverbs.NewNetwork().Provider("node-a"), NICs: nics})
		if !errors.Is(err, engines.ErrInvalid) {
			t.Errorf("New with port %+v = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestUnavailableSaysDetectionsReason: detection's verdict on the engine wins over usable-looking ports.
func TestUnavailableSaysDetectionsReason(t *testing.T) {
	nics := nics()
	nics.Unavailable = "rdma disabled by --disable-engines"
	e, err := rdma.New(rdma.Options{Node: "node-a", Provider: fakeverbs.NewNetwork().Provider("node-a"), NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := e.Available(); ok || why != nics.Unavailable {
		t.Fatalf("Available = %v %q, want detection's reason", ok, why)
	}
}

// TestConcurrentAcceptsOfOneSetCreateOneSetOfQueuePairs: a peer that offers the same queue-pair set many times at
// once (a hostile node of the pool, or a retry while the first is still being connected) gets one answer; the
// others are refused as a race before any queue pair is created for them.
func TestConcurrentAcceptsOfOneSetCreateOneSetOfQueuePairs(t *testing.T) {
	c := newCluster(t, nil, "node-b")
	dev, err := c.net.Provider("node-a").Open("mlx5_0", 1)
	if err != nil {
		t.Fatal(err)
	}
	var offer []verbs.ConnInfo
	for range 4 {
		qp, err := dev.CreateQP(4)
		if err != nil {
			t.Fatal(err)
		}
		offer = append(offer, qp.Info())
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var creations atomic.Int32
	c.net.BeforeCreateQP = func(node string) {
		if node == "node-b" && creations.Add(1) == 1 { // hold the first acceptance in its first creation
			close(entered)
			<-release
		}
	}
	created := c.net.Created
	req := rdma.ExchangeRequest{From: "node-a", To: "node-b", FromNIC: "mlx5_0", ToNIC: "mlx5_0", QPs: offer}
	first := make(chan error, 1)
	go func() {
		infos, err := c.nodes["node-b"].AcceptQPs(context.Background(), req)
		if err == nil && len(infos) != len(offer) {
			err = errors.New("answered a different number of queue pairs")
		}
		first <- err
	}()
	<-entered // the first acceptance is creating its queue pairs
	for i := range 50 {
		if _, err := c.nodes["node-b"].AcceptQPs(context.Background(), req); !errors.Is(err, rdma.ErrConnectRace) {
			t.Fatalf("acceptance %d of a set being accepted = %v, want ErrConnectRace", i+2, err)
		}
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("the first acceptance: %v", err)
	}
	if n := c.net.Created - created; n != len(offer) {
		t.Fatalf("%d queue pairs created for 51 offers of one set of %d, want %d", n, len(offer), len(offer))
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
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
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"fmt"
	"maps"
	"testing"
)

// At scale each agent pre-opens data connections to a bounded subset of peers; the subsets must be stable for
// one agent and spread across agents, so no node receives every agent's connections.
func TestDataSubsetIsBoundedStableAndSpread(t *testing.T) {
	const nodes, limit = 1000, 64
	all := map[string]string{}
	for i := range nodes {
		all[fmt.Sprintf("node-%04d", i)] = fmt.Sprintf("10.0.%d.%d:7471", i/256, i%256)
	}
	inbound := map[string]int{}
	for i := range nodes {
		p := &Peers{opts: Options{Node: fmt.Sprintf("node-%04d", i), MaxDataPeers: limit}}
		got := p.dataSubset(all)
		if len(got) != limit {
			t.Fatalf("%s pre-connects %d peers, want %d", p.opts.Node, len(got), limit)
		}
		if again := p.dataSubset(all); !maps.Equal(got, again) {
			t.Fatalf("%s chose a different subset on the next refresh", p.opts.Node)
		}
		for n, addr := range got {
			if all[n] != addr {
				t.Fatalf("%s: %s has address %q, want %q", p.opts.Node, n, addr, all[n])
			}
			inbound[n]++
		}
	}
	most := 0
	for _, c := range inbound {
		most = max(most, c)
	}
	// 64 choices per agent over 1,000 nodes average 64 inbound peers; a shared order would give one node 1,000.
	if most > 3*limit {
		t.Errorf("one node is chosen by %d agents: the subsets are not spread", most)
	}
	small := map[string]string{"a": "1", "b": "2"}
	if got := (&Peers{opts: Options{Node: "x"}}).dataSubset(small); !maps.Equal(got, small) {
		t.Errorf("below the default limit every peer is pre-connected, got %v", got)
	}
	if got := (&Peers{opts: Options{Node: "x", MaxDataPeers: -1}}).dataSubset(small); len(got) != 0 {
		t.Errorf("a negative limit pre-connects nothing, got %v", got)
	}
}

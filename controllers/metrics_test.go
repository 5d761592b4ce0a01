// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// The operator's gauges count pools by Ready reason, their nodes, reports and domains, and move with them.
func TestOperatorMetricsCountPoolsNodesAndDomains(t *testing.T) {
	c := apiClient(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Metrics{Reader: c})
	read := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, s := range promtest.Samples(t, reg) {
			key := s.Name
			for _, l := range s.Labels {
				key += "/" + l.Value
			}
			out[key] = s.Value
		}
		return out
	}
	before := read()
	for _, name := range []string{"fabricxfer_operator_pools/AllNodesReady", "fabricxfer_operator_pool_nodes/desired",
		"fabricxfer_operator_transfer_nodes", "fabricxfer_operator_vpods/discovered", "fabricxfer_operator_vpod_members/missing"} {
		if _, ok := before[name]; !ok {
			t.Errorf("%s missing: %v", name, before)
		}
	}
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "opmetrics", 1)
	pool := newPool(t, c, ns, "kv", "opmetrics")
	report(t, c, pool, nodes[0], time.Now(), gpusIn("ualink:77/1", 0, 1))
	waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "1/1")
	eventually(t, settle, "the gauges count the pool, its node, the report and the domain", func() error {
		now := read()
		for name, delta := range map[string]float64{"fabricxfer_operator_pools/AllNodesReady": 1, "fabricxfer_operator_pool_nodes/ready": 1,
			"fabricxfer_operator_transfer_nodes": 1, "fabricxfer_operator_vpods/discovered": 1, "fabricxfer_operator_vpod_members/reporting": 1} {
			if now[name] < before[name]+delta {
				return fmt.Errorf("%s = %v, was %v", name, now[name], before[name])
			}
		}
		return nil
	})
}

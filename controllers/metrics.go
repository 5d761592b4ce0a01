// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

var (
	poolsDesc = prometheus.NewDesc("fabricxfer_operator_pools",
		"TransferPools by their Ready condition's reason (AllNodesReady, NodesNotReady, Conflict, InvalidSpec, ...; Unknown before the first status).",
		[]string{"reason"}, nil)
	poolNodesDesc = prometheus.NewDesc("fabricxfer_operator_pool_nodes",
		"Nodes selected by TransferPools, summed over pools, by state (desired, ready).", []string{"state"}, nil)
	transferNodesDesc = prometheus.NewDesc("fabricxfer_operator_transfer_nodes", "TransferNodes (agent reports) in the cluster.", nil, nil)
	vpodsDesc         = prometheus.NewDesc("fabricxfer_operator_vpods",
		"VPodTopologies by origin (discovered by the operator, declared by an admin).", []string{"origin"}, nil)
	vpodMembersDesc = prometheus.NewDesc("fabricxfer_operator_vpod_members",
		"Members of the scale-up domains, summed, by state (reporting, missing).", []string{"state"}, nil)
)

// Metrics is the operator's collector of what the cluster holds, read from the manager's cache at scrape time
// (no label names a pool, node or domain). Register it with controller-runtime's metrics.Registry.
type Metrics struct {
	// Reader is the manager's cached client.
	Reader client.Reader
}

// Describe implements prometheus.Collector.
func (m Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolsDesc, poolNodesDesc, transferNodesDesc, vpodsDesc, vpodMembersDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A list that fails leaves its metrics out of this scrape.
func (m Metrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	var pools fxv1.TransferPoolList
	if err := m.Reader.List(ctx, &pools, client.UnsafeDisableDeepCopy); err == nil {
		byReason := map[string]int{fxv1.ReasonAllNodesReady: 0, fxv1.ReasonNodesNotReady: 0, fxv1.ReasonConflict: 0}
		desired, ready := 0, 0
		for _, p := range pools.Items {
			reason := "Unknown"
			if c := meta.FindStatusCondition(p.Status.Conditions, fxv1.ConditionReady); c != nil && c.Reason != "" {
				reason = c.Reason
			}
			byReason[reason]++
			desired += int(p.Status.DesiredNodes)
			ready += int(p.Status.ReadyNodes)
		}
		for r, n := range byReason {
			g(poolsDesc, n, r)
		}
		g(poolNodesDesc, desired, "desired")
		g(poolNodesDesc, ready, "ready")
	}
	var tns fxv1.TransferNodeList
	if err := m.Reader.List(ctx, &tns, client.UnsafeDisableDeepCopy); err == nil {
		g(transferNodesDesc, len(tns.Items))
	}
	var vps fxv1.VPodTopologyList
	if err := m.Reader.List(ctx, &vps, client.UnsafeDisableDeepCopy); err == nil {
		discovered, declared, members, missing := 0, 0, 0, 0
		for _, v := range vps.Items {
			if v.Labels[fxv1.LabelDiscovered] == "true" {
				discovered++
			} else {
				declared++
			}
			members += len(v.Status.Members)
			missing += len(v.Status.MissingMembers)
		}
		g(vpodsDesc, discovered, "discovered")
		g(vpodsDesc, declared, "declared")
		g(vpodMembersDesc, members, "reporting")
		g(vpodMembersDesc, missing, "missing")
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"fmt"
	"slices"
)

// BuildNotification assembles the notification for the given plans (all writing to one destination node):
// their destination regions, sorted and unique, and their tags in plan order.
func BuildNotification(from string, plans []*Plan, payload []byte) Notification {
	n := Notification{From: from, Payload: payload}
	for _, p := range plans {
		n.Regions = append(n.Regions, p.Dst)
		n.Tags = append(n.Tags, p.Tags...)
	}
	slices.Sort(n.Regions)
	n.Regions = slices.Compact(n.Regions)
	return n
}

// CheckReceived checks a notification another node sent before the receiver looks its regions up (under its
// agent's one lock): a payload of at most MaxNotifyPayload bytes and at most MaxNotifyEntries regions, which it
// sorts and names once each (a sender repeating one would have it looked up, and heard of, as often).
func CheckReceived(n *Notification) error {
	if len(n.Payload) > MaxNotifyPayload {
		return fmt.Errorf("%w: a notification payload of %d bytes, at most %d", ErrInvalid, len(n.Payload), MaxNotifyPayload)
	}
	if len(n.Regions) > MaxNotifyEntries {
		return fmt.Errorf("%w: a notification of %d regions, at most %d", ErrInvalid, len(n.Regions), MaxNotifyEntries)
	}
	slices.Sort(n.Regions)
	n.Regions = slices.Compact(n.Regions)
	return nil
}

// AllSucceeded reports whether every outcome is a success.
func AllSucceeded(outcomes []Outcome) bool {
	for _, o := range outcomes {
		if o.Err != nil {
			return false
		}
	}
	return true
}

// NotifyDestinations sends a successful submission's notification to every destination node, grouped by node
// in sorted order: writes notify the destination region's node, reads notify this node (the bytes land here).
// local delivers to this node's handler; send reaches another node and gets one plan of the group to find its
// way there. A notification that cannot be delivered fails the plans of its node: the caller cannot count on
// the receiver knowing. Nothing is sent unless every plan succeeded.
func NotifyDestinations(ctx context.Context, self string, reg *Registry, plans []Plan, outcomes []Outcome, payload []byte,
	local func(Notification), send func(ctx context.Context, node string, anyPlan *Plan, n Notification) error) {
	if !AllSucceeded(outcomes) || len(plans) == 0 {
		return
	}
	byNode := map[string][]int{}
	var nodes []string
	for i := range plans {
		node := self
		if plans[i].Direction == DirWrite {
			d, _, err := reg.Lookup(plans[i].Dst)
			if err != nil {
				outcomes[i].Err = fmt.Errorf("notifying: %w", err)
				continue
			}
			node = d.Node
		}
		if _, ok := byNode[node]; !ok {
			nodes = append(nodes, node)
		}
		byNode[node] = append(byNode[node], i)
	}
	slices.Sort(nodes)
	for _, node := range nodes {
		idx := byNode[node]
		ptrs := make([]*Plan, len(idx))
		for k, i := range idx {
			ptrs[k] = &plans[i]
		}
		n := BuildNotification(self, ptrs, payload)
		if node == self {
			local(n)
			continue
		}
		if err := send(ctx, node, &plans[idx[0]], n); err != nil {
			for _, i := range idx {
				outcomes[i].Err = fmt.Errorf("data landed but the notification to %s failed: %w", node, err)
			}
		}
	}
}

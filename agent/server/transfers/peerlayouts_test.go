// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestKeptPeerLayoutsAreAskedAgainBeforeTheyExpire: a kept answer is used as it is until peerLayoutRefresh, then
// still used while one background question (never two) asks again; the new answer replaces it, an owner's refusal
// drops it, an unreachable owner leaves it until peerLayoutTTL, and an answer forgotten while the question was
// under way is not brought back.
func TestKeptPeerLayoutsAreAskedAgainBeforeTheyExpire(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	key := peerLayoutKey{node: "node-b", asker: "team-a", segment: "kv"}
	fresh := func(at time.Time) *peerLayout { return &peerLayout{blockBytes: 16, blocks: 4, resolved: at} }
	var c peerLayouts
	check := func(step string, at time.Time, want *peerLayout, wantRefresh bool) {
		t.Helper()
		got, refresh := c.lookup(key, at)
		if got != want || refresh != wantRefresh {
			t.Fatalf("%s: lookup gave %p (ask again: %v), want %p (%v)", step, got, refresh, want, wantRefresh)
		}
	}
	check("nothing kept", t0, nil, false)
	old := fresh(t0)
	c.store(key, old)
	check("young", t0.Add(peerLayoutRefresh-time.Millisecond), old, false)
	check("past the refresh age", t0.Add(peerLayoutRefresh), old, true)
	check("a question under way", t0.Add(peerLayoutRefresh+100*time.Millisecond), old, false)
	renewed := fresh(t0.Add(peerLayoutRefresh + 200*time.Millisecond))
	c.refreshed(key, old, renewed, nil)
	check("the new answer", renewed.resolved.Add(time.Millisecond), renewed, false)
	check("expired", renewed.resolved.Add(peerLayoutTTL), nil, false)

	unreachable := status.Error(codes.Unavailable, "peer channel down")
	c.store(key, old)
	check("asked again", t0.Add(peerLayoutRefresh), old, true)
	c.refreshed(key, old, nil, unreachable)
	check("kept while the owner cannot be asked", t0.Add(peerLayoutTTL-time.Millisecond), old, true)
	c.refreshed(key, old, nil, errors.New("deadline"))
	check("until it expires", t0.Add(peerLayoutTTL), nil, false)

	for _, refusal := range []codes.Code{codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition} {
		c.store(key, old)
		check("asked again", t0.Add(peerLayoutRefresh), old, true)
		c.refreshed(key, old, nil, status.Error(refusal, "the owner says no"))
		check("dropped on "+refusal.String(), t0.Add(peerLayoutRefresh), nil, false)
	}

	c.store(key, old)
	check("asked again", t0.Add(peerLayoutRefresh), old, true)
	c.mu.Lock()
	delete(c.entries, key) // what ForgetPeerLayout does: the owner said the layout went
	c.mu.Unlock()
	c.refreshed(key, old, fresh(t0.Add(peerLayoutRefresh)), nil)
	check("forgotten while asked", t0.Add(peerLayoutRefresh), nil, false)
	c.store(key, old)
	check("a new answer asks again in its turn", t0.Add(peerLayoutRefresh), old, true)
}

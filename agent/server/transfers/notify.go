// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// A listener holds at most maxListenerBacklog notifications its caller has not read (past it, it loses its
// stream), and a caller's listeners together at most maxCallerNotifyBytes of them (payloads and region ids,
// counted per listener; past it, the one furthest behind loses its stream: furtherBehind). A caller may keep 128 streams open: 128 listeners that never read could hold 1,024
// notifications of 64 KiB each, 8 GiB of one pod's, in the agent.
const (
	maxListenerBacklog   = 1024
	maxCallerNotifyBytes = 32 << 20
)

type notifyListener struct {
	regions map[uint64]bool // nil: every region of the caller
	// Under the table lock: the notifications not sent yet and their bytes, and why the stream was lost ("" while
	// it was not). wake (one slot) tells the stream's goroutine to look.
	queue  []queuedNotification
	queued int
	lost   string
	wake   chan struct{}
	// sendingSince is when the stream began handing its client the notification it is on (zero between them),
	// under the table lock: gRPC's flow control holds a send to a client that does not read.
	sendingSince time.Time
}

// furtherBehind reports whether listener a, which holds notifications, is further behind than b: held longer in
// handing one to its client, else holding an older one, else more bytes. Queue positions alone picked a listener
// that reads over ones that never did: gRPC's buffers take a few notifications off a listener's queue before its
// sends stop, more than a reader that lagged a moment had taken.
func furtherBehind(a, b *notifyListener, now time.Time) bool {
	if len(b.queue) == 0 {
		return true
	}
	sinceA, sinceB := a.sendingSince, b.sendingSince
	if sinceA.IsZero() {
		sinceA = now
	}
	if sinceB.IsZero() {
		sinceB = now
	}
	switch {
	case !sinceA.Equal(sinceB):
		return sinceA.Before(sinceB)
	case a.queue[0].seq != b.queue[0].seq:
		return a.queue[0].seq < b.queue[0].seq
	}
	return a.queued > b.queued
}

// queuedNotification is a notification waiting for its listener; seq orders the deliveries, oldest first.
type queuedNotification struct {
	msg *agentv1.Notification
	seq uint64
}

// notificationBytes is what a notification holds in the agent while it waits for its listener.
func notificationBytes(n *agentv1.Notification) int {
	return 64 + len(n.Payload) + len(n.Segment) + len(n.SourceNode) + 8*len(n.RegionIds)
}

// queueLocked queues n for listener l of caller key, or ends the stream of the caller's listener furthest behind
// (l itself, when l is) if l is full or the caller's listeners would hold more than maxCallerNotifyBytes.
func (s *Service) queueLocked(key string, l *notifyListener, n *agentv1.Notification, seq uint64) {
	if l.lost != "" {
		return
	}
	if len(l.queue) >= maxListenerBacklog {
		s.loseLocked(key, l, fmt.Sprintf("notification stream fell %d notifications behind (at most %d): read it faster or listen to fewer regions",
			len(l.queue), maxListenerBacklog))
		return
	}
	size := notificationBytes(n)
	for s.notifyBytes[key]+size > maxCallerNotifyBytes {
		behind, now := l, time.Now() // l's queue may be empty: any that is not is further behind
		for o := range s.listeners[key] {
			if len(o.queue) > 0 && furtherBehind(o, behind, now) {
				behind = o
			}
		}
		s.loseLocked(key, behind, fmt.Sprintf("this caller's notification streams held %d bytes not read (at most %d together); this one, %d notifications (%d bytes) behind, was furthest behind",
			s.notifyBytes[key], maxCallerNotifyBytes, len(behind.queue), behind.queued))
		if behind == l {
			return
		}
	}
	l.queue = append(l.queue, queuedNotification{n, seq})
	s.holdLocked(key, l, size)
	l.wakeUp()
}

// loseLocked ends l's stream for the reason why, dropping what it held.
func (s *Service) loseLocked(key string, l *notifyListener, why string) {
	l.lost = why
	s.holdLocked(key, l, -l.queued)
	clear(l.queue)
	l.queue = nil
	l.wakeUp()
}

// holdLocked counts delta bytes more (or fewer) held for listener l of caller key.
func (s *Service) holdLocked(key string, l *notifyListener, delta int) {
	l.queued += delta
	if s.notifyBytes[key] += delta; s.notifyBytes[key] == 0 {
		delete(s.notifyBytes, key)
	}
}

// wakeUp tells l's stream to look at its queue (the one slot taken already: it will look).
func (l *notifyListener) wakeUp() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// nextLocked takes l's oldest queued notification off its queue (nil if none).
func (s *Service) nextLocked(key string, l *notifyListener) *agentv1.Notification {
	if len(l.queue) == 0 {
		return nil
	}
	n := l.queue[0].msg
	l.queue[0] = queuedNotification{}
	l.queue = l.queue[1:]
	s.holdLocked(key, l, -notificationBytes(n))
	return n
}

// QueuedNotificationBytesLocked is the bytes of notifications the agent holds for listeners that have not read
// them yet, all callers together.
func (s *Service) QueuedNotificationBytesLocked() int {
	total := 0
	for _, b := range s.notifyBytes {
		total += b
	}
	return total
}

// DeliverNotification receives the engines' notifications for this node and hands each listener of the callers
// owning the written regions one message naming every one of its regions the transfer touched: a transfer over
// a 64-region layout is one message, not 64 (which filled a listener's buffer within 16 transfers).
func (s *Service) DeliverNotification(n engines.Notification) {
	s.table.Lock()
	defer s.table.Unlock()
	type message struct {
		msg   *agentv1.Notification
		first *regiontable.Region // the region of the lowest id: region_id and segment name it
	}
	var msgs map[*notifyListener]*message
	for _, mem := range n.Regions {
		r, ok := s.table.ByMemoryLocked(mem)
		if !ok {
			continue // deregistered meanwhile
		}
		for l := range s.listeners[r.Owner()] {
			if l.regions != nil && !l.regions[r.ID()] {
				continue
			}
			if m := msgs[l]; m != nil {
				m.msg.RegionIds = append(m.msg.RegionIds, r.ID())
				if r.ID() < m.first.ID() {
					m.first = r
				}
				continue
			}
			if msgs == nil {
				msgs = map[*notifyListener]*message{}
			}
			msgs[l] = &message{first: r, msg: &agentv1.Notification{SourceNode: n.From, Op: agentv1.Op_OP_WRITE, Payload: n.Payload,
				RegionIds: []uint64{r.ID()}}}
		}
	}
	s.notifySeq++
	for l, m := range msgs {
		slices.Sort(m.msg.RegionIds)
		m.msg.RegionId, m.msg.Segment = m.first.ID(), m.first.Segment()
		s.queueLocked(m.first.Owner(), l, m.msg, s.notifySeq)
	}
}

// DeliverPeerNotification hands over a notification another agent of the pool sent for regions of this node
// (engines without a wire of their own notify through the peer channel). Unknown memory ids are ignored; if
// none is known the sender is told, so it can fail the transfer instead of reporting a notified success.
func (s *Service) DeliverPeerNotification(n engines.Notification) error {
	s.table.Lock()
	known := 0
	for _, id := range n.Regions {
		if _, ok := s.table.ByMemoryLocked(id); ok {
			known++
			break // one is enough to deliver
		}
	}
	s.table.Unlock()
	if known == 0 {
		return status.Errorf(codes.NotFound, "none of the %d notified regions is registered on node %s", len(n.Regions), s.node)
	}
	s.DeliverNotification(n)
	return nil
}

// Notifications serves the Agent API call of that name for the caller of sess.
func (s *Service) Notifications(sess *regiontable.Session, req *agentv1.NotificationsRequest, stream agentv1.Agent_NotificationsServer) error {
	l := &notifyListener{wake: make(chan struct{}, 1)}
	s.table.Lock()
	if len(req.RegionIds) > 0 {
		l.regions = map[uint64]bool{}
		for _, id := range req.RegionIds {
			if _, err := s.table.OwnRegionLocked(sess, id); err != nil {
				s.table.Unlock()
				return err
			}
			l.regions[id] = true
		}
	}
	key := sess.Caller.Key
	if s.listeners[key] == nil {
		s.listeners[key] = map[*notifyListener]struct{}{}
	}
	s.listeners[key][l] = struct{}{}
	s.table.Unlock()
	defer func() {
		s.table.Lock()
		delete(s.listeners[key], l)
		s.loseLocked(key, l, "ended")
		s.table.Unlock()
	}()
	// The header tells the client the listener is in place: nothing sent after this is missed.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case <-s.stopping: // before the backlog: a listener fed as fast as it reads would keep shutdown waiting
			return status.Error(codes.Unavailable, "the agent is shutting down")
		default:
		}
		s.table.Lock()
		n, lost := s.nextLocked(key, l), l.lost
		l.sendingSince = time.Time{}
		if n != nil {
			l.sendingSince = time.Now()
		}
		s.table.Unlock()
		switch {
		case n != nil:
			if err := stream.Send(n); err != nil {
				return err
			}
			continue
		case lost != "":
			s.log.Info("ended a notification stream that fell behind", "caller", key, "why", lost)
			return status.Error(codes.ResourceExhausted, lost)
		}
		select {
		case <-l.wake:
		case <-stream.Context().Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "the agent is shutting down")
		}
	}
}

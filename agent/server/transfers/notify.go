// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

type notifyListener struct {
	regions  map[uint64]bool // nil: every region of the caller
	ch       chan *agentv1.Notification
	overflow bool
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
	for l, m := range msgs {
		slices.Sort(m.msg.RegionIds)
		m.msg.RegionId, m.msg.Segment = m.first.ID(), m.first.Segment()
		select {
		case l.ch <- m.msg:
		default:
			l.overflow = true
		}
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
	l := &notifyListener{ch: make(chan *agentv1.Notification, 1024)}
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
		s.table.Unlock()
	}()
	// The header tells the client the listener is in place: nothing sent after this is missed.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case n := <-l.ch:
			if err := stream.Send(n); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "the agent is shutting down")
		}
		s.table.Lock()
		over := l.overflow
		s.table.Unlock()
		if over && len(l.ch) == 0 {
			return status.Error(codes.ResourceExhausted, "notification stream fell more than 1024 behind")
		}
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
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

// DeliverNotification receives the engines' notifications for this node and hands each to the listeners of
// the caller owning the written region.
func (s *Service) DeliverNotification(n engines.Notification) {
	s.table.Lock()
	defer s.table.Unlock()
	for _, mem := range n.Regions {
		r, ok := s.table.ByMemoryLocked(mem)
		if !ok {
			continue // deregistered meanwhile
		}
		msg := &agentv1.Notification{RegionId: r.ID(), Segment: r.Segment(), SourceNode: n.From,
			Op: agentv1.Op_OP_WRITE, Payload: n.Payload}
		for l := range s.listeners[r.Owner()] {
			if l.regions != nil && !l.regions[r.ID()] {
				continue
			}
			select {
			case l.ch <- msg:
			default:
				l.overflow = true
			}
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

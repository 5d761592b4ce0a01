// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

type notifyListener struct {
	regions  map[uint64]bool // nil: every region of the caller
	ch       chan *agentv1.Notification
	overflow bool
}

// deliverNotification receives the engines' notifications for this node and hands each to the listeners of
// the caller owning the written region.
func (s *Server) deliverNotification(n engines.Notification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, mem := range n.Regions {
		r, ok := s.byMemory[mem]
		if !ok {
			continue // deregistered meanwhile
		}
		msg := &agentv1.Notification{RegionId: r.id, Segment: r.segment, SourceNode: n.From,
			Op: agentv1.Op_OP_WRITE, Payload: n.Payload}
		for l := range s.listeners[r.owner] {
			if l.regions != nil && !l.regions[r.id] {
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
func (s *Server) DeliverPeerNotification(n engines.Notification) error {
	s.mu.Lock()
	known := 0
	for _, id := range n.Regions {
		if _, ok := s.byMemory[id]; ok {
			known++
		}
	}
	s.mu.Unlock()
	if known == 0 {
		return status.Errorf(codes.NotFound, "none of the %d notified regions is registered on node %s", len(n.Regions), s.opts.NodeName)
	}
	s.deliverNotification(n)
	return nil
}

// Notifications implements agentv1.AgentServer.
func (s *Server) Notifications(req *agentv1.NotificationsRequest, stream agentv1.Agent_NotificationsServer) error {
	sess, err := s.sessionOf(stream.Context())
	if err != nil {
		return err
	}
	l := &notifyListener{ch: make(chan *agentv1.Notification, 1024)}
	s.mu.Lock()
	if len(req.RegionIds) > 0 {
		l.regions = map[uint64]bool{}
		for _, id := range req.RegionIds {
			if _, err := s.ownRegionLocked(sess, id); err != nil {
				s.mu.Unlock()
				return err
			}
			l.regions[id] = true
		}
	}
	key := sess.caller.Key
	if s.listeners[key] == nil {
		s.listeners[key] = map[*notifyListener]struct{}{}
	}
	s.listeners[key][l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners[key], l)
		s.mu.Unlock()
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
		s.mu.Lock()
		over := l.overflow
		s.mu.Unlock()
		if over && len(l.ch) == 0 {
			return status.Error(codes.ResourceExhausted, "notification stream fell more than 1024 behind")
		}
	}
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/trace"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

type transfer struct {
	id    uint64
	owner string
	// t is the engines' transfer while it runs, nil once settled: a waiter that still holds the transfer must
	// not keep its plans, tracker and context alive with it. The one goroutine that finishes the transfer reads
	// it freely and clears it under s.table's lock; anyone else reads it there.
	t      engines.Transfer
	tags   []string // engines.Tag -> the caller's tag
	bytes  uint64
	start  time.Time
	done   chan struct{} // closed once status is set
	once   sync.Once
	status *agentv1.TransferStatus
	err    error // how the engines ended it, set with status
	// ids hands back memory the plans read (block ids), once the transfer settled.
	ids idLease
	// waited is the session whose call waits for the transfer (Settle waits for it there), nil for an unwaited
	// one: the caller is never told the id of a waited call it cut short.
	waited *regiontable.Session
	// early answers the waiting caller once the bytes landed (Landed), with resp; landed is the status it
	// answered, which the record keeps.
	early  Replier
	resp   *agentv1.TransferResponse
	landed *agentv1.TransferStatus
}

// Replier answers a waited transfer's caller as soon as its bytes have landed, before the agent records its
// end (the fast socket's mailbox); the call's own return is then answered no more. Nil: the call's return is
// the answer.
type Replier interface {
	ReplyEarly(resp *agentv1.TransferResponse)
}

// Landed implements engines.Lander: the success is answered now, the bookkeeping follows.
func (x *transfer) Landed() {
	x.landed = statusNow(x)
	x.landed.State = agentv1.TransferState_TRANSFER_STATE_SUCCEEDED
	x.resp.Status = x.landed
	x.early.ReplyEarly(x.resp)
}

type watcher struct {
	ids      map[uint64]bool // nil: every transfer of the caller
	ch       chan *agentv1.TransferStatus
	overflow bool
}

// Transfer serves Transfer for the gRPC call and the fast socket alike. Every item is checked before anything
// moves: a request with one bad item is refused whole, naming the item, and changes nothing.
// early (nil on gRPC) answers a waited transfer as soon as its bytes landed.
func (s *Service) Transfer(ctx context.Context, sess *regiontable.Session, req *agentv1.TransferRequest, early Replier) (*agentv1.TransferResponse, error) {
	timeout, err := checkSubmission(req.Op, req.Notify, req.Timeout)
	if err != nil {
		return nil, err
	}
	if len(req.Items) == 0 {
		return nil, status.Error(codes.InvalidArgument, "transfer has no items")
	}
	if max := s.limits.MaxItemsPerTransfer; len(req.Items) > max {
		s.refusals.LimitHit(refusals.LimitItems)
		return nil, status.Errorf(codes.InvalidArgument, "transfer has %d items, at most %d", len(req.Items), max)
	}

	// Everything done for this transfer, resolving and importing peers' segments included, is bounded by its
	// deadline, counted from now: a stalled peer fails it within its timeout, not the call's.
	if timeout <= 0 {
		timeout = engines.DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	plan := s.engine.NewPlan()
	tagOf := map[string]engines.Tag{}
	var tags []string
	resolved := map[*agentv1.RemoteRef]engines.MemoryID{}
	var total uint64
	for i, it := range req.Items {
		where := func() string { return fmt.Sprintf("item %d (tag %q)", i, it.Tag) }
		s.table.Lock()
		local, err := s.table.OwnRegionLocked(sess, it.LocalRegionId)
		s.table.Unlock()
		if err != nil {
			return nil, status.Errorf(codes.NotFound, "%s: %v", where(), status.Convert(err).Message())
		}
		ref := it.Remote
		if ref == nil {
			ref = req.Remote
		}
		if ref == nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s names no remote and the request has no default remote", where())
		}
		remote, ok := resolved[ref]
		if !ok {
			remote, err = s.resolveRemote(rctx, sess, ref)
			if err != nil {
				st := status.Convert(err)
				return nil, status.Errorf(st.Code(), "%s: %s", where(), st.Message())
			}
			resolved[ref] = remote
		}
		tag, ok := tagOf[it.Tag]
		if !ok {
			tag = engines.Tag(len(tags))
			tagOf[it.Tag] = tag
			tags = append(tags, it.Tag)
		}
		item := engines.Item{Src: local.Mem(), SrcOffset: it.LocalOffset, Dst: remote, DstOffset: it.RemoteOffset, Size: it.Length, Tag: tag}
		if req.Op == agentv1.Op_OP_READ {
			item = engines.Item{Src: remote, SrcOffset: it.RemoteOffset, Dst: local.Mem(), DstOffset: it.LocalOffset, Size: it.Length, Tag: tag}
		}
		if err := plan.Add(item); err != nil {
			return nil, status.Errorf(regiontable.StatusCode(err), "%s: %v", where(), err)
		}
		total += it.Length
	}
	ps := plan.Build()
	if len(ps.Rejected) > 0 {
		ie := ps.Rejected[0]
		return nil, status.Errorf(regiontable.StatusCode(ie.Err), "item with tag %q: %v", tags[ie.Item.Tag], ie.Err)
	}

	left := time.Until(deadline)
	if left <= 0 {
		return nil, status.Errorf(codes.DeadlineExceeded, "the transfer's %v ran out while its peers were resolved", timeout)
	}
	return s.submit(ctx, sess, ps, tags, total, len(req.Items)-len(ps.Dropped), left, req.Notify, req.Wait, idLease{}, early)
}

// checkSubmission checks what item and block transfers share: the op, the notification and the timeout.
func checkSubmission(op agentv1.Op, notify []byte, timeout *durationpb.Duration) (time.Duration, error) {
	if op != agentv1.Op_OP_READ && op != agentv1.Op_OP_WRITE {
		return 0, status.Errorf(codes.InvalidArgument, "op must be OP_READ or OP_WRITE, got %s", op)
	}
	if len(notify) > engines.MaxNotifyPayload {
		return 0, status.Errorf(codes.InvalidArgument, "notification payload is %d bytes, at most %d", len(notify), engines.MaxNotifyPayload)
	}
	if timeout == nil {
		return 0, nil
	}
	if err := timeout.CheckValid(); err != nil || timeout.AsDuration() < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "timeout %v is not a valid non-negative duration", timeout)
	}
	return timeout.AsDuration(), nil
}

// submit starts a planned transfer for the caller and, with wait, waits for it within the call. ids (the zero
// lease: none) is given back once nothing can read the plan set's memory any more: the transfer settled, or never
// started. early, when the engines can tell the waiting goroutine that the bytes landed, answers a waited
// success then, before the transfer is recorded.
func (s *Service) submit(ctx context.Context, sess *regiontable.Session, ps *engines.PlanSet, tags []string, total uint64, items int,
	timeout time.Duration, notify []byte, wait bool, ids idLease, early Replier) (*agentv1.TransferResponse, error) {
	s.table.Lock()
	u := s.table.UsageLocked(sess.Caller.Key)
	if held := u.InFlight; held >= s.limits.MaxInFlight {
		s.table.ReleaseUsageLocked(sess.Caller.Key)
		s.table.Unlock()
		ids.release()
		s.refusals.LimitHit(refusals.LimitInFlight)
		return nil, status.Errorf(codes.ResourceExhausted, "caller has %d transfers in flight, the limit is %d", held, s.limits.MaxInFlight)
	}
	if held, max := u.InFlightBytes, s.limits.MaxInFlightBytes; held+total > max || held+total < total {
		s.table.ReleaseUsageLocked(sess.Caller.Key)
		s.table.Unlock()
		ids.release()
		s.refusals.Edge.Refused("grpc", "busy")
		s.refusals.LimitHit(refusals.LimitInFlightBytes)
		return nil, status.Errorf(codes.ResourceExhausted, "caller has %d bytes in flight; %d more would pass the limit of %d", held, total, max)
	}
	if wait && ctx.Err() != nil {
		// Checked under the lock Settle takes: a waited call its caller cut short before this point never
		// submits, and one cut later is among the transfers a Settle arriving after the cut waits for.
		s.table.ReleaseUsageLocked(sess.Caller.Key)
		s.table.Unlock()
		ids.release()
		return nil, status.Errorf(status.FromContextError(ctx.Err()).Code(), "transfer not submitted: its call ended first: %v", ctx.Err())
	}
	u.InFlight++
	u.InFlightBytes += total
	s.nextXfer++
	x := &transfer{id: s.epoch + s.nextXfer, owner: sess.Caller.Key, tags: tags, bytes: total, start: time.Now(), done: make(chan struct{}),
		ids: ids}
	if wait {
		x.waited = sess
		s.waitedLocked(sess)[x] = struct{}{}
	}
	s.table.Unlock()

	// The transfer outlives this call; its deadline comes from the request's timeout (or the engine default).
	t, err := s.engine.Submit(context.Background(), ps, engines.SubmitOptions{Timeout: timeout, Notify: notify, Waited: wait, Share: sess.Caller.Key})
	trace.Log(ctx, "transfer", "submitted")
	if err != nil {
		s.table.Lock()
		u.InFlight--
		u.InFlightBytes -= total
		s.table.ReleaseUsageLocked(sess.Caller.Key)
		s.forgetWaitedLocked(x)
		s.table.Unlock()
		ids.release()
		return nil, status.Errorf(regiontable.StatusCode(err), "submitting: %v", err)
	}
	x.t = t
	s.table.Lock()
	s.running[x.id] = x
	s.table.Unlock()
	if !wait {
		select {
		case <-t.Done():
			// Done already (a host copy runs within Submit): recorded here rather than by a goroutine, whose
			// start wakes a thread that competes with the caller's.
			s.finish(x)
		default:
			go s.settle(x, t)
		}
	}

	resp := &agentv1.TransferResponse{TransferId: x.id, Items: uint32(items), Bytes: ps.Bytes()}
	if one, ok := s.oneEngine[planEngine(ps)]; ok && len(ps.Plans) == 1 {
		resp.Engines = one // read only, as every response is once answered
	} else {
		for i := range ps.Plans {
			resp.Engines = append(resp.Engines, ps.Plans[i].Engine)
		}
	}
	if wait {
		// A GPU copy is seen done on this goroutine, without a hand-off; with early, its caller is answered
		// the moment it is, and the records below follow.
		if ld, ok := t.(engines.LandedDriven); ok && early != nil {
			x.early, x.resp = early, resp
			ld.DriveLanded(ctx, x)
		} else if d, ok := t.(engines.Driven); ok {
			d.Drive(ctx)
		}
		spinUntilDone(t.Done(), waitSpin)
		select {
		case <-t.Done():
			trace.Log(ctx, "transfer", "settled")
			s.finish(x)
			// Block ids left to the GPU are refused as it runs them (nothing moved); the waiting caller hears it
			// as the same refusal planning would have given.
			if err := x.err; errors.Is(err, engines.ErrOutOfBounds) || errors.Is(err, engines.ErrOverlap) {
				return nil, status.Errorf(codes.InvalidArgument, "transfer %d refused: %v", x.id, err)
			}
			resp.Status = x.status
		case <-ctx.Done():
			// A call that ran out of time is DeadlineExceeded, and its transfer goes on (its own timeout bounds it):
			// wait for it by id. One cut short otherwise is Unavailable, so clients retry or recover instead of
			// blaming their deadline; when its caller cancelled it or went away (not the agent stopping, which
			// lets transfers end as a shutdown does), its transfer is stopped: nobody waits for it, and nobody was
			// told its id. The call then returns only once the transfer's copies stopped: on the fast socket the
			// connection closes after that, which is how the caller's client learns that nothing more lands.
			code := codes.Unavailable
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				code = codes.DeadlineExceeded
			} else if s.callerEnded(ctx) {
				t.Cancel()
				s.awaitStop(x, t)
				return nil, status.Errorf(code, "transfer %d cancelled with its call: %v", x.id, context.Cause(ctx))
			}
			go s.settle(x, t) // its status is recorded when it ends
			return nil, status.Errorf(code, "transfer %d submitted but still pending when the call ended (wait for it by id): %v", x.id, ctx.Err())
		}
	}
	return resp, nil
}

// stopAfterCancel bounds how long a call cut short by its caller waits for its cancelled transfer's copies to
// stop. Engines end a cancelled transfer once nothing of it can still touch memory, and bound that themselves (a
// launched GPU copy is waited for up to 30 s); this bound only keeps the call's goroutine from outliving an
// engine that broke that contract.
const stopAfterCancel = 35 * time.Second

// awaitStop waits for the cancelled transfer t to end and records x; past stopAfterCancel, or when the agent
// stops, it leaves that to a goroutine.
func (s *Service) awaitStop(x *transfer, t engines.Transfer) {
	timer := time.NewTimer(stopAfterCancel)
	defer timer.Stop()
	select {
	case <-t.Done():
		s.finish(x)
	case <-timer.C:
		go s.settle(x, t)
	case <-s.stopping:
		go s.settle(x, t)
	}
}

// callerEnded says whether a call's cancelled context was its caller's doing (gRPC's cancel of the call, or
// ErrCallerGone), not the agent's stopping.
func (s *Service) callerEnded(ctx context.Context) bool {
	if errors.Is(context.Cause(ctx), ErrCallerGone) {
		return true
	}
	select {
	case <-s.stopping:
		return false
	default:
		return true
	}
}

// ErrCallerGone is the cause of a call's context its caller ended by going away (a fast call whose connection
// closed while it was served): its waited transfer is stopped.
var ErrCallerGone = errors.New("the caller closed its connection during the call")

// waitSpin is how long a waited transfer's call polls for completion before parking: a GPU copy of tens of
// microseconds ends on another thread, and waking a parked goroutine costs about as much again.
const waitSpin = 100 * time.Microsecond

// spinUntilDone polls done for up to d, yielding the processor between polls.
func spinUntilDone(done <-chan struct{}, d time.Duration) {
	until := time.Now().Add(d)
	for {
		select {
		case <-done:
			return
		default:
		}
		if time.Now().After(until) {
			return
		}
		runtime.Gosched()
	}
}

// resolveRemote turns a RemoteRef into a memory id the engines know, importing a remote descriptor if needed.
func (s *Service) resolveRemote(ctx context.Context, sess *regiontable.Session, ref *agentv1.RemoteRef) (engines.MemoryID, error) {
	self := ref.Node == "" || ref.Node == s.node
	switch t := ref.Target.(type) {
	case *agentv1.RemoteRef_RegionId:
		if !self {
			return "", status.Errorf(codes.InvalidArgument, "a region id names memory on this node; use a segment or descriptor for node %q", ref.Node)
		}
		s.table.Lock()
		defer s.table.Unlock()
		r, err := s.table.OwnRegionLocked(sess, t.RegionId)
		if err != nil {
			return "", err
		}
		return r.Mem(), nil
	case *agentv1.RemoteRef_Segment:
		if err := regiontable.CheckSegmentRef(t.Segment); err != nil {
			return "", err
		}
		if self {
			s.table.Lock()
			defer s.table.Unlock()
			r, err := s.table.SegmentLocked(t.Segment, sess.Caller.Namespace)
			if err != nil {
				return "", err
			}
			return r.Mem(), nil
		}
		if s.peers == nil {
			return "", status.Errorf(codes.Unavailable, "segment %q is on node %s and this agent has no peer channel", t.Segment, ref.Node)
		}
		desc, err := s.peers.ResolveSegment(ctx, ref.Node, t.Segment, sess.Caller.Namespace)
		if err != nil {
			return "", status.Errorf(peerCode(err), "resolving segment %q on node %s: %s", t.Segment, ref.Node, peerMessage(err))
		}
		return s.importDescriptor(ctx, desc, false)
	case *agentv1.RemoteRef_Desc:
		return s.importDescriptor(ctx, t.Desc, true)
	}
	return "", status.Error(codes.InvalidArgument, "remote names no region, segment or descriptor")
}

// peerMessage is what a peer's error says, without gRPC's "rpc error: code = ... desc =" around it (the code is
// the answer's own: peerCode).
func peerMessage(err error) string {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return st.Message()
	}
	return err.Error()
}

func peerCode(err error) codes.Code {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return st.Code()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return codes.DeadlineExceeded // the transfer's own timeout ran out while the peer was asked
	}
	return codes.Unavailable
}

// settle waits for x's engine transfer t to end and finishes x. It is handed t rather than reading x.t: a wait
// may have finished x (and cleared x.t) before this goroutine runs.
func (s *Service) settle(x *transfer, t engines.Transfer) {
	<-t.Done()
	s.finish(x)
}

// finish records the status of an ended transfer and tells watchers, once. A waiting Transfer call runs it
// on its own goroutine as soon as the engine is done, saving a hand-off on the latency-bound path.
func (s *Service) finish(x *transfer) {
	x.once.Do(func() {
		err := x.t.Wait(context.Background())
		x.ids.release()
		st := s.statusOf(x, err)
		s.table.Lock()
		x.status, x.err = st, err
		x.t, x.tags = nil, nil
		delete(s.running, x.id)
		s.forgetWaitedLocked(x)
		s.settled.put(x.owner, st, time.Now())
		if u := s.table.UsageOfLocked(x.owner); u != nil {
			u.InFlight--
			u.InFlightBytes -= x.bytes
			s.table.ReleaseUsageLocked(x.owner)
		}
		for w := range s.watchers[x.owner] {
			if w.ids != nil && !w.ids[x.id] {
				continue
			}
			select {
			case w.ch <- st:
			default:
				w.overflow = true
			}
		}
		s.table.Unlock()
		close(x.done)
	})
}

// planEngine is the engine of a plan set's first plan ("" for none).
func planEngine(ps *engines.PlanSet) string {
	if len(ps.Plans) == 0 {
		return ""
	}
	return ps.Plans[0].Engine
}

// settledStatus is a status and its elapsed time, allocated together.
type settledStatus struct {
	st      agentv1.TransferStatus
	elapsed durationpb.Duration
}

func (s *Service) statusOf(x *transfer, err error) *agentv1.TransferStatus {
	if err == nil && x.landed != nil {
		return x.landed // the status its caller was answered
	}
	st := statusNow(x)
	if err == nil {
		st.State = agentv1.TransferState_TRANSFER_STATE_SUCCEEDED
		return st
	}
	st.Error = err.Error()
	st.State = agentv1.TransferState_TRANSFER_STATE_FAILED
	var te *engines.TransferError
	if !errors.As(err, &te) {
		return st
	}
	allCancelled, allDeadline := true, true
	seen := map[engines.Tag]bool{}
	for _, f := range te.Failures {
		code := regiontable.StatusCode(f.Err)
		allCancelled = allCancelled && code == codes.Canceled
		allDeadline = allDeadline && code == codes.DeadlineExceeded
		for _, tag := range f.Tags {
			if seen[tag] || int(tag) >= len(x.tags) {
				continue
			}
			seen[tag] = true
			st.Failures = append(st.Failures, &agentv1.TagFailure{Tag: x.tags[tag], Code: code.String(), Message: f.Err.Error()})
		}
	}
	switch {
	case allCancelled:
		st.State = agentv1.TransferState_TRANSFER_STATE_CANCELLED
	case allDeadline:
		st.State = agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED
	}
	return st
}

// statusNow is x's status with no state yet, its elapsed time counted until now.
func statusNow(x *transfer) *agentv1.TransferStatus {
	ss := &settledStatus{}
	d := time.Since(x.start)
	ss.elapsed.Seconds, ss.elapsed.Nanos = int64(d/time.Second), int32(d%time.Second)
	ss.st.TransferId, ss.st.Bytes, ss.st.Elapsed = x.id, x.bytes, &ss.elapsed
	return &ss.st
}

func (s *Service) ownTransfer(sess *regiontable.Session, id uint64) (*transfer, error) {
	s.table.Lock()
	defer s.table.Unlock()
	return s.ownTransferLocked(sess, id)
}

// ownTransferLocked finds the caller's transfer id, running or settled; a settled one comes back as a transfer
// already done, with its status.
func (s *Service) ownTransferLocked(sess *regiontable.Session, id uint64) (*transfer, error) {
	if x, ok := s.running[id]; ok && x.owner == sess.Caller.Key {
		return x, nil
	}
	if st := s.settled.get(sess.Caller.Key, id, time.Now()); st != nil {
		return &transfer{id: id, owner: sess.Caller.Key, done: s.closed, status: st}, nil
	}
	if !s.handedOutLocked(id) {
		return nil, s.notHandedOutLocked(id)
	}
	return nil, status.Errorf(codes.NotFound, "transfer %d is not known for this caller (settled more than %s ago, pushed out by %d newer transfers of this caller, or by a caller quieter than it, or never submitted)", id, s.settled.retention, maxFinished)
}

// handedOutLocked reports whether this agent instance handed out transfer id (epoch+1 to epoch+nextXfer).
func (s *Service) handedOutLocked(id uint64) bool {
	return id-s.epoch-1 < s.nextXfer
}

// notHandedOutLocked is the answer for an id this agent instance never handed out: most likely one a previous
// instance handed out (the caller outlived an agent restart), whose transfer this agent knows nothing of.
func (s *Service) notHandedOutLocked(id uint64) error {
	ours := "it has handed out none yet"
	if s.nextXfer > 0 {
		ours = fmt.Sprintf("its transfer ids are %d to %d", s.epoch+1, s.epoch+s.nextXfer)
	}
	return status.Errorf(codes.NotFound, "transfer %d is not one of this agent's (%s): an id of a previous agent instance (the agent restarted since), or never handed out", id, ours)
}

func pending(id uint64) *agentv1.TransferStatus {
	return &agentv1.TransferStatus{TransferId: id, State: agentv1.TransferState_TRANSFER_STATE_PENDING}
}

// Wait serves the Agent API call of that name for the caller of sess.
func (s *Service) Wait(ctx context.Context, sess *regiontable.Session, req *agentv1.WaitRequest) (*agentv1.TransferStatus, error) {
	return s.waitFor(ctx, sess, []uint64{req.TransferId}, req.Timeout)
}

// maxWaitIDs bounds the transfers one FastWait lists.
const maxWaitIDs = 1024

// FastWait serves FastWait on the fast socket.
func (s *Service) FastWait(ctx context.Context, sess *regiontable.Session, req *agentv1.FastWait) (*agentv1.TransferResponse, error) {
	if n := len(req.TransferIds); n == 0 || n > maxWaitIDs {
		return nil, status.Errorf(codes.InvalidArgument, "a wait lists 1 to %d transfers, got %d", maxWaitIDs, n)
	}
	st, err := s.waitFor(ctx, sess, req.TransferIds, req.Timeout)
	if err != nil {
		return nil, err
	}
	return &agentv1.TransferResponse{TransferId: st.TransferId, Status: st}, nil
}

// waitFor waits for the caller's transfers ids in order, all of them named by the caller before any wait: it
// answers the status of the first that did not succeed, else of the last, or PENDING for the first still
// running when timeout (when positive) passed. Without a timeout the transfers' own deadlines bound it.
func (s *Service) waitFor(ctx context.Context, sess *regiontable.Session, ids []uint64, timeout *durationpb.Duration) (*agentv1.TransferStatus, error) {
	xs := make([]*transfer, len(ids))
	// The engines' transfers of those still running: the waiter sees them end and records them itself, rather
	// than waiting for their settling goroutines to be woken first.
	ts := make([]engines.Transfer, len(ids))
	s.table.Lock()
	for i, id := range ids {
		x, err := s.ownTransferLocked(sess, id)
		if err != nil {
			s.table.Unlock()
			return nil, err
		}
		xs[i], ts[i] = x, x.t
	}
	s.table.Unlock()
	// The timeout's timer is made only when a wait has to block: most waits find their transfers ending within
	// the spin.
	var deadline time.Time
	if timeout != nil && timeout.AsDuration() > 0 {
		deadline = time.Now().Add(timeout.AsDuration())
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	expired := func() <-chan time.Time {
		if deadline.IsZero() {
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		return timer.C
	}
	var st *agentv1.TransferStatus
	for i, x := range xs {
		if t := ts[i]; t != nil {
			if d, ok := t.(engines.Driven); ok {
				d.Drive(ctx) // a transfer its engine left to its waiter
			}
			spinUntilDone(t.Done(), waitSpin) // the last of a pipeline of copies usually ends within the spin
			select {
			case <-t.Done():
			default:
				select {
				case <-t.Done():
				case <-expired():
					return pending(x.id), nil
				case <-ctx.Done():
					return nil, status.FromContextError(ctx.Err()).Err()
				}
			}
			s.finish(x)
		}
		spinUntilDone(x.done, waitSpin)
		select {
		case <-x.done:
		default:
			select {
			case <-x.done:
			case <-expired():
				return pending(x.id), nil
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		if st = x.status; st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			return st, nil
		}
	}
	return st, nil
}

// Cancel serves the Agent API call of that name for the caller of sess.
func (s *Service) Cancel(ctx context.Context, sess *regiontable.Session, req *agentv1.CancelRequest) (*agentv1.TransferStatus, error) {
	x, err := s.ownTransfer(sess, req.TransferId)
	if err != nil {
		return nil, err
	}
	s.table.Lock()
	t := x.t
	s.table.Unlock()
	if t != nil { // nil: settled already
		t.Cancel()
	}
	select {
	case <-x.done:
		return x.status, nil
	case <-ctx.Done():
		return pending(x.id), nil
	case <-time.After(5 * time.Second):
		return pending(x.id), nil
	}
}

// Watch serves the Agent API call of that name for the caller of sess.
func (s *Service) Watch(sess *regiontable.Session, req *agentv1.WatchRequest, stream agentv1.Agent_WatchServer) error {
	w := &watcher{ch: make(chan *agentv1.TransferStatus, 1024)}
	remaining := 0
	var already []*agentv1.TransferStatus
	s.table.Lock()
	if len(req.TransferIds) > 0 {
		w.ids = map[uint64]bool{}
		for _, id := range req.TransferIds {
			x, err := s.ownTransferLocked(sess, id)
			if err != nil {
				s.table.Unlock()
				return err
			}
			if w.ids[id] {
				continue
			}
			w.ids[id] = true
			if x.status != nil {
				already = append(already, x.status)
			} else {
				remaining++
			}
		}
	} else {
		for _, x := range s.running {
			if x.owner == sess.Caller.Key {
				remaining++ // reported as they settle
			}
		}
	}
	if s.watchers[sess.Caller.Key] == nil {
		s.watchers[sess.Caller.Key] = map[*watcher]struct{}{}
	}
	s.watchers[sess.Caller.Key][w] = struct{}{}
	s.table.Unlock()
	defer func() {
		s.table.Lock()
		delete(s.watchers[sess.Caller.Key], w)
		s.table.Unlock()
	}()
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for _, st := range already {
		if err := stream.Send(st); err != nil {
			return err
		}
	}
	for w.ids == nil || remaining > 0 {
		select {
		case st := <-w.ch:
			if err := stream.Send(st); err != nil {
				return err
			}
			remaining--
		case <-stream.Context().Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "the agent is shutting down")
		}
		s.table.Lock()
		over := w.overflow
		s.table.Unlock()
		if over && len(w.ch) == 0 {
			return status.Error(codes.ResourceExhausted, "watch fell more than 1024 completions behind; use Wait for the ones missed")
		}
	}
	return nil
}

// waitedLocked is the session's set of waited transfers in flight (s.table's lock held), made when missing.
func (s *Service) waitedLocked(sess *regiontable.Session) map[*transfer]struct{} {
	w := s.waited[sess]
	if w == nil {
		w = map[*transfer]struct{}{}
		s.waited[sess] = w
	}
	return w
}

// forgetWaitedLocked takes x out of its session's waited transfers in flight.
func (s *Service) forgetWaitedLocked(x *transfer) {
	if x.waited == nil {
		return
	}
	w := s.waited[x.waited]
	delete(w, x)
	if len(w) == 0 {
		delete(s.waited, x.waited)
	}
	x.waited = nil
}

// Settle serves the Agent API call of that name: it waits until every waited transfer of the session (the client: its
// gRPC connection and fast connections) in flight when it arrived has ended, and those of the caller's ended
// sessions; other live clients of the same caller are not waited for. Engines end a transfer once its copies stopped,
// so nothing such a transfer started lands after the answer. A waited call its caller cut short was cancelled, or
// checked its context under the lock taken here before it submitted (a gRPC call's cancel reaches the agent before a
// later call on the connection).
func (s *Service) Settle(ctx context.Context, sess *regiontable.Session) (*agentv1.SettleResponse, error) {
	s.table.Lock()
	var xs []*transfer
	for in, waited := range s.waited {
		// An ended session of the same caller too: a client whose connection dropped and that recovered on this
		// agent has its earlier session's calls stopping in the background.
		if in == sess || (in.Ended && in.Caller.Key == sess.Caller.Key) {
			for x := range waited {
				xs = append(xs, x)
			}
		}
	}
	s.table.Unlock()
	for _, x := range xs {
		select {
		case <-x.done:
		case <-ctx.Done():
			return nil, status.Errorf(status.FromContextError(ctx.Err()).Code(), "settling %d waited transfers: transfer %d still in flight: %v", len(xs), x.id, ctx.Err())
		}
	}
	return &agentv1.SettleResponse{Waited: uint32(len(xs))}, nil
}

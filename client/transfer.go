// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// Remote names the other side of an item: one of this client's regions, a segment on a node, or a
// descriptor a peer shared.
type Remote struct {
	region     *Region
	node       string
	segment    string
	descriptor []byte
}

// ToRegion names another of this client's regions on this node.
func ToRegion(r *Region) Remote { return Remote{region: r} }

// ToSegment names a segment on node ("" for this node).
func ToSegment(node, segment string) Remote { return Remote{node: node, segment: segment} }

// ToDescriptor names memory by a descriptor (Region.Descriptor of the owner, or ResolveSegment), as its node
// issued it: the agent asks that node to confirm it the first time (an altered one is refused).
func ToDescriptor(desc []byte) Remote { return Remote{descriptor: desc} }

func (r Remote) proto() (*agentv1.RemoteRef, error) {
	switch {
	case r.region != nil:
		id, err := r.region.current()
		if err != nil {
			return nil, err
		}
		return &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: id}}, nil
	case r.segment != "":
		return &agentv1.RemoteRef{Node: r.node, Target: &agentv1.RemoteRef_Segment{Segment: r.segment}}, nil
	case r.descriptor != nil:
		return &agentv1.RemoteRef{Target: &agentv1.RemoteRef_Desc{Desc: r.descriptor}}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "remote names no region, segment or descriptor")
}

// Item is one contiguous copy between a local region and the remote.
type Item struct {
	Local        *Region
	LocalOffset  uint64
	Remote       Remote
	RemoteOffset uint64
	Length       uint64
	Tag          string
}

// Op is the direction of a transfer.
type Op int

const (
	// Write copies local bytes to the remote.
	Write Op = 1
	// Read copies remote bytes into the local region.
	Read Op = 2
)

// TransferOptions tune a submission.
type TransferOptions struct {
	// Timeout bounds the transfer on the agent (zero: the agent's default). A waited transfer is also bounded
	// by its context's deadline, less a margin for the answer to come back: the agent fails it then. Copies an
	// engine already started (a host copy under way, a queued GPU copy) may still land after that, as after
	// Cancel; memory a failed or timed-out call wrote to is not to be reused until a Wait or Cancel of a
	// submitted transfer returns, or a later transfer over it completes.
	Timeout time.Duration
	// Notify is delivered to the target's Notifications stream once every byte landed: 1 to
	// Info().Limits.MaxNotifyBytes bytes (an empty one, which would travel as none, and a longer one are refused
	// as InvalidArgument before anything is sent); nil for none.
	Notify []byte
}

// Transfer is a submitted transfer.
type Transfer struct {
	ID      uint64
	Engines []string
	c       *Client
	gen     uint64
	bytes   uint64 // what it moves: how long Wait polls for its end
}

// Status is how a transfer ended.
type Status = agentv1.TransferStatus

// TransferError reports a transfer that did not succeed, with the failed tags. Code reads its state as a gRPC
// code (DeadlineExceeded, Canceled, else its first failure's), and errors.Is matches context.DeadlineExceeded
// and context.Canceled for those states.
type TransferError struct {
	Status *Status
}

// GRPCStatus is the transfer's outcome as a gRPC status (status.FromError and Code read it).
func (e *TransferError) GRPCStatus() *status.Status {
	code := codes.Unknown
	switch e.Status.GetState() {
	case agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED:
		code = codes.DeadlineExceeded
	case agentv1.TransferState_TRANSFER_STATE_CANCELLED:
		code = codes.Canceled
	default:
		if f := e.Status.GetFailures(); len(f) > 0 {
			if c, ok := codeNamed(f[0].Code); ok {
				code = c
			}
		}
	}
	return status.New(code, e.Error())
}

// Is matches context.DeadlineExceeded and context.Canceled for a transfer that ran out of time or was cancelled.
func (e *TransferError) Is(target error) bool {
	switch e.Status.GetState() {
	case agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED:
		return target == context.DeadlineExceeded
	case agentv1.TransferState_TRANSFER_STATE_CANCELLED:
		return target == context.Canceled
	}
	return false
}

// codeNamed reads a code the agent names a failure with (codes.Code's String).
func codeNamed(name string) (codes.Code, bool) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return codes.Unknown, false
}

func (e *TransferError) Error() string {
	// The first few failures name the trouble; a transfer of thousands of items that timed out would otherwise
	// make an error of hundreds of kilobytes (Status.Failures holds them all).
	const shown = 8
	var tags []string
	for i, f := range e.Status.Failures {
		if i == shown {
			tags = append(tags, fmt.Sprintf("and %d more", len(e.Status.Failures)-shown))
			break
		}
		tags = append(tags, fmt.Sprintf("%s: %s %s", f.Tag, f.Code, f.Message))
	}
	return fmt.Sprintf("transfer %d %s: %s [%s]", e.Status.TransferId, strings.TrimPrefix(e.Status.State.String(), "TRANSFER_STATE_"),
		e.Status.Error, strings.Join(tags, "; "))
}

// submission is what item and block transfers send alike: the op and the timeout, the latter bounded by ctx's
// deadline for a waited transfer.
func submission(ctx context.Context, op Op, opts TransferOptions, wait bool) (agentv1.Op, *durationpb.Duration, error) {
	var timeout *durationpb.Duration
	if d := boundedTimeout(ctx, opts.Timeout, wait); d > 0 {
		timeout = durationpb.New(d)
	}
	switch op {
	case Write:
		return agentv1.Op_OP_WRITE, timeout, nil
	case Read:
		return agentv1.Op_OP_READ, timeout, nil
	}
	return 0, nil, status.Errorf(codes.InvalidArgument, "unknown op %d", op)
}

// check refuses options no transfer can have.
// check refuses options the agent would refuse or misread; limits gives the agent's (read only for a payload:
// Info takes the client's lock, which a block transfer's common case does without).
func (o TransferOptions) check(limits func() *agentv1.GetInfoResponse) error {
	if o.Timeout < 0 {
		return status.Errorf(codes.InvalidArgument, "a transfer's timeout must not be negative, got %v (zero: the agent's default)", o.Timeout)
	}
	if o.Notify != nil {
		// An empty payload travels as none: the listener would wait for a notification that never comes.
		most := cmp.Or(int(limits().GetLimits().GetMaxNotifyBytes()), defaultMaxNotifyBytes)
		if len(o.Notify) == 0 {
			return status.Errorf(codes.InvalidArgument, "an empty Notify sends no notification: give it at least one byte (the block ids, say), or leave it nil for none")
		}
		if len(o.Notify) > most {
			return status.Errorf(codes.InvalidArgument, "a Notify of %d bytes: the agent delivers at most %d (Info().Limits.MaxNotifyBytes)", len(o.Notify), most)
		}
	}
	return nil
}

// defaultMaxNotifyBytes is the notify payload limit of an agent too old to say it (engines.MaxNotifyPayload).
const defaultMaxNotifyBytes = 64 << 10

// agentDefaultTimeout is the timeout the agent gives a transfer that names none (engines.DefaultTimeout).
const agentDefaultTimeout = 60 * time.Second

// boundedTimeout is a transfer's timeout on the agent: timeout (zero: the agent's default), and for a waited
// transfer at most what ctx has left less a tenth (at most 100 ms), the time the agent's answer needs to come
// back within the call. A context with more time left than the timeout changes nothing.
func boundedTimeout(ctx context.Context, timeout time.Duration, wait bool) time.Duration {
	deadline, ok := ctx.Deadline()
	if !wait || !ok {
		return timeout
	}
	left := time.Until(deadline)
	left -= min(left/10, 100*time.Millisecond)
	if left <= 0 {
		left = time.Millisecond // the call is out of time: the agent's answer says so
	}
	if left < cmp.Or(timeout, agentDefaultTimeout) {
		return left
	}
	return timeout
}

// callTimeout is how long the agent has to answer a fast call bounded by ctx (FastRequest.call_timeout): what the
// call waits for its reply (ctx's deadline, or fastDefaultDeadline without one) less a twentieth (at most 50 ms)
// for the answer to travel, as the agent leaves itself for a gRPC call; half the margin of a waited transfer's
// own timeout (boundedTimeout), which then fires first and is what the caller hears.
func callTimeout(ctx context.Context) time.Duration {
	left := time.Until(callDeadline(ctx))
	left -= min(left/20, 50*time.Millisecond)
	return max(left, time.Millisecond) // out of time: the agent's answer says so
}

func (c *Client) request(ctx context.Context, op Op, items []Item, opts TransferOptions, wait bool) (*agentv1.TransferRequest, error) {
	if err := opts.check(c.Info); err != nil {
		return nil, err
	}
	if most := c.Info().GetLimits().GetMaxItemsPerTransfer(); most > 0 && len(items) > int(most) {
		return nil, status.Errorf(codes.InvalidArgument, "%d items, the agent moves at most %d items a call (Info().Limits.MaxItemsPerTransfer): split the transfer", len(items), most)
	}
	req := &agentv1.TransferRequest{Items: make([]*agentv1.TransferItem, len(items)), Notify: opts.Notify, Wait: wait}
	var err error
	if req.Op, req.Timeout, err = submission(ctx, op, opts, wait); err != nil {
		return nil, err
	}
	for i, it := range items {
		if it.Local == nil {
			return nil, status.Errorf(codes.InvalidArgument, "item %d (tag %q) has no local region", i, it.Tag)
		}
		id, err := it.Local.current()
		if err != nil {
			return nil, err
		}
		ref, err := it.Remote.proto()
		if err != nil {
			return nil, fmt.Errorf("item %d (tag %q): %w", i, it.Tag, err)
		}
		req.Items[i] = &agentv1.TransferItem{LocalRegionId: id, LocalOffset: it.LocalOffset, Remote: ref,
			RemoteOffset: it.RemoteOffset, Length: it.Length, Tag: it.Tag}
	}
	// Refused here with the limit: past it the agent cannot read the request, and gRPC's refusal names only a size.
	if n := proto.Size(req); n > fastwire.MaxRequest {
		return nil, status.Errorf(codes.InvalidArgument, "%d items make a %d-byte request, the agent reads requests of at most %d bytes: split the transfer", len(items), n, fastwire.MaxRequest)
	}
	return req, nil
}

// Submit starts a transfer and returns at once; Wait on the result.
func (c *Client) Submit(ctx context.Context, op Op, items []Item, opts TransferOptions) (*Transfer, error) {
	n := itemBytes(items)
	resp, gen, err := c.send(ctx, op, items, n, opts, false)
	if err != nil {
		return nil, err
	}
	return &Transfer{ID: resp.TransferId, Engines: resp.Engines, c: c, gen: gen, bytes: n}, nil
}

// itemBytes is what items move: how long a wait for them polls (spinFor).
func itemBytes(items []Item) (n uint64) {
	for _, it := range items {
		n += it.Length
	}
	return n
}

// Do submits a transfer and waits for it in one round trip; a transfer that did not succeed returns its
// status and a *TransferError. Cancelling ctx ends the call; copies under way may still land for as long as the
// transfer takes (package doc).
func (c *Client) Do(ctx context.Context, op Op, items []Item, opts TransferOptions) (*Status, error) {
	resp, _, err := c.send(ctx, op, items, itemBytes(items), opts, true)
	if err != nil {
		return nil, err
	}
	return resp.Status, statusErr(resp.Status)
}

// send sends a transfer of n bytes, waited or not, on the fast socket where there is one, else through gRPC; gen
// is the dial generation it was sent under.
func (c *Client) send(ctx context.Context, op Op, items []Item, n uint64, opts TransferOptions, wait bool) (resp *agentv1.TransferResponse, gen uint64, err error) {
	what := "submitting"
	if wait {
		what = "transferring"
	}
	gen = c.generation()
	if err := c.check(); err != nil {
		return nil, gen, err
	}
	if err := ctx.Err(); err != nil {
		return nil, gen, fmt.Errorf("%s: nothing sent: %w", what, err)
	}
	req, err := c.request(ctx, op, items, opts, wait)
	if err != nil {
		return nil, gen, fmt.Errorf("%s: %w", what, err)
	}
	if wait {
		defer c.waited.leave(c.waited.enter())
	}
	resp, fast, err := c.transferFast(ctx, req, c.spinFor(wait, n))
	if !fast {
		resp, err = c.api.Transfer(ctx, req)
	}
	if err != nil {
		return nil, gen, c.wrap(ctx, what, gen, err)
	}
	return resp, gen, nil
}

// Write copies length bytes from local at localOff to remote at remoteOff and waits.
func (c *Client) Write(ctx context.Context, local *Region, localOff uint64, remote Remote, remoteOff, length uint64) (*Status, error) {
	return c.Do(ctx, Write, []Item{{Local: local, LocalOffset: localOff, Remote: remote, RemoteOffset: remoteOff, Length: length}}, TransferOptions{})
}

// Read copies length bytes from remote at remoteOff into local at localOff and waits.
func (c *Client) Read(ctx context.Context, local *Region, localOff uint64, remote Remote, remoteOff, length uint64) (*Status, error) {
	return c.Do(ctx, Read, []Item{{Local: local, LocalOffset: localOff, Remote: remote, RemoteOffset: remoteOff, Length: length}}, TransferOptions{})
}

func statusErr(st *Status) error {
	if st == nil || st.State == agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		return nil
	}
	return &TransferError{Status: st}
}

// Wait blocks until the transfer settles or ctx ends. A transfer that did not succeed returns its status and
// a *TransferError. The wait starts on the fast socket, where a transfer that ends within fastWaitSlice is seen
// without a gRPC round trip; one still running then is waited for through gRPC, so the client's other calls
// are not held behind it. Ending ctx ends the wait, not the transfer (Cancel stops it).
func (t *Transfer) Wait(ctx context.Context) (*Status, error) {
	if err := t.ofAnEarlierSession(); err != nil {
		return nil, err
	}
	st, fast, err := t.c.fastWait(ctx, []uint64{t.ID}, t.bytes)
	if !fast {
		st, err = t.c.api.Wait(ctx, &agentv1.WaitRequest{TransferId: t.ID})
	}
	if err != nil {
		return nil, t.c.wrap(ctx, fmt.Sprintf("waiting for transfer %d", t.ID), t.gen, err)
	}
	return st, statusErr(st)
}

// ofAnEarlierSession is ErrLost for a transfer submitted in a session Recover has replaced since: the agent that
// ran it knows nothing of it any more, and calling Recover again (what ErrSessionLost asks) would not change that.
func (t *Transfer) ofAnEarlierSession() error {
	if t.gen == t.c.generation() {
		return nil
	}
	return fmt.Errorf("transfer %d: %w (submitted before the agent's restart that Recover recovered from; whether its bytes "+
		"landed is unknown: submit it again)", t.ID, ErrLost)
}

// maxWaitIDs is the most transfers one FastWait names (agent.proto).
const maxWaitIDs = 1024

// WaitAll waits for every transfer of ts, submitted by this client, as Wait does for each, in one round trip on
// the fast socket for those that ended (per 1,024): the last one's status when every one succeeded, else the
// status of the first (in ts's order) that did not, with a *TransferError; a call that failed (its context
// ended, the session was lost) returns its error. One still running after the fast socket's moment is waited for
// alone, through gRPC, and those after it in one round trip again: 64 transfers that ended cost one round trip,
// not 64.
func (c *Client) WaitAll(ctx context.Context, ts ...*Transfer) (*Status, error) {
	if len(ts) == 0 {
		return nil, status.Error(codes.InvalidArgument, "waiting for no transfers")
	}
	gen := c.generation()
	for _, t := range ts {
		switch {
		case t == nil || t.c != c:
			return nil, status.Error(codes.InvalidArgument, "waiting for a transfer this client did not submit (nil, or another client's)")
		case t.gen != gen:
			return t.Wait(ctx) // of a session lost since: it says so
		}
	}
	var last *Status
	ids := make([]uint64, 0, min(len(ts), maxWaitIDs))
	for len(ts) > 0 {
		batch := ts[:min(len(ts), maxWaitIDs)]
		ids, n := ids[:0], uint64(0)
		for _, t := range batch {
			ids, n = append(ids, t.ID), n+t.bytes
		}
		st, fast, err := c.fastWait(ctx, ids, n)
		if err != nil {
			return nil, c.wrap(ctx, fmt.Sprintf("waiting for %d transfers", len(batch)), gen, err)
		}
		if fast {
			if err := statusErr(st); err != nil {
				return st, err
			}
			last, ts = st, ts[len(batch):]
			continue
		}
		// One still running (those before it succeeded), or no fast connection: that one alone.
		k := 0
		for i, t := range batch {
			if st != nil && t.ID == st.TransferId {
				k = i
				break
			}
		}
		if last, err = batch[k].Wait(ctx); err != nil {
			return last, err
		}
		ts = ts[k+1:]
	}
	return last, nil
}

// Cancel stops the transfer and returns its status (still PENDING if it did not stop within the call).
func (t *Transfer) Cancel(ctx context.Context) (*Status, error) {
	if err := t.ofAnEarlierSession(); err != nil {
		return nil, err
	}
	st, err := t.c.api.Cancel(ctx, &agentv1.CancelRequest{TransferId: t.ID})
	if err != nil {
		return nil, t.c.wrap(ctx, fmt.Sprintf("cancelling transfer %d", t.ID), t.gen, err)
	}
	return st, nil
}

// ResolveSegment returns the descriptor of a segment on node ("" for this node).
func (c *Client) ResolveSegment(ctx context.Context, node, segment string) ([]byte, error) {
	gen := c.generation()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	resp, err := c.api.ResolveSegment(ctx, &agentv1.ResolveSegmentRequest{Node: node, Segment: segment})
	if err != nil {
		return nil, c.wrap(ctx, fmt.Sprintf("resolving segment %q on node %q", segment, node), gen, err)
	}
	return resp.Desc, nil
}

// ResolveLayoutSegment returns the geometry of the layout published as segment on node ("": this one), as a
// TransferBlocks to ToLayoutSegment(node, segment) would find it: BlockBytes and Regions, which the caller's
// layout must match, and Blocks, which every id must be below. NotFound while nothing is published under the
// name (a consumer started before its producer can ask again until it is).
func (c *Client) ResolveLayoutSegment(ctx context.Context, node, segment string) (*agentv1.LayoutGeometry, error) {
	gen := c.generation()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	resp, err := c.api.ResolveSegment(ctx, &agentv1.ResolveSegmentRequest{Node: node, Segment: segment, Layout: true})
	if err != nil {
		return nil, c.wrap(ctx, fmt.Sprintf("resolving layout segment %q on node %q", segment, node), gen, err)
	}
	if resp.Layout == nil {
		// An agent older than the layout field read the question as a region's, and answered as one.
		return nil, status.Errorf(codes.Unimplemented, "resolving layout segment %q on node %q: the agent does not look layouts up (it predates ResolveSegment's layout field): upgrade it", segment, node)
	}
	return resp.Layout, nil
}

// Notifications streams notifications for the given regions (every region this client holds now when none are
// given; another client's are not told) until ctx ends or the agent ends the stream: an agent restart ends it
// (open it again after Recover: what landed meanwhile is not told), and so does a listener that fell about
// 1,024 notifications behind the agent, or furthest behind when the caller's listeners hold 32 MiB not read
// (ResourceExhausted; the channel and the connection hold more before that). Open it before the other side may
// write: nothing that landed earlier is told. The channel is closed when the stream ends; the returned function
// waits for that (cancel ctx to end it) and says why: the context's error, ErrClosed, ErrSessionLost, or the
// agent's answer.
func (c *Client) Notifications(ctx context.Context, regions ...*Region) (<-chan *agentv1.Notification, func() error, error) {
	gen := c.generation()
	if c.closed.Load() {
		return nil, nil, ErrClosed
	}
	req := &agentv1.NotificationsRequest{}
	if len(regions) == 0 {
		// The agent's filter is the caller (every client of a pod, or of a user without Kubernetes): asked for
		// nothing, it streamed other clients' notifications too.
		regions = c.heldRegions()
		if len(regions) == 0 {
			return nil, nil, status.Error(codes.InvalidArgument, "this client holds no regions to be notified about: register them first, or name regions")
		}
	}
	for _, r := range regions {
		id, err := r.current()
		if err != nil {
			return nil, nil, err
		}
		req.RegionIds = append(req.RegionIds, id)
	}
	stream, err := c.api.Notifications(ctx, req)
	if err != nil {
		return nil, nil, c.wrap(ctx, "opening the notification stream", gen, err)
	}
	// The agent sends headers once it listens, so nothing that happens after this returns is missed.
	if _, err := stream.Header(); err != nil {
		return nil, nil, c.wrap(ctx, "opening the notification stream", gen, err)
	}
	ch := make(chan *agentv1.Notification, 64)
	var end error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		for {
			n, err := stream.Recv()
			if err != nil {
				end = c.streamEnd(ctx, gen, stream.Trailer(), err)
				return
			}
			select {
			case ch <- n:
			case <-ctx.Done():
				end = ctx.Err()
				return
			case <-c.life.Done(): // closed while nobody read the channel: the stream ends as after Close
				end = fmt.Errorf("notification stream: %w", ErrClosed)
				return
			}
		}
	}()
	return ch, func() error { <-done; return end }, nil
}

// streamEnd says why a stream of this client ended with err, as its calls say it: ErrClosed after Close, ctx's
// error, ErrSessionLost when the connection or the agent went (an Unavailable the agent did not mark as its own
// answer in the trailer: an agent stopping, or gone), else the agent's answer.
func (c *Client) streamEnd(ctx context.Context, gen uint64, trailer metadata.MD, err error) error {
	if Code(err) == codes.Unavailable && len(trailer.Get(fastwire.AnsweredHeader)) == 0 && !c.closed.Load() {
		return fmt.Errorf("notification stream: %w (%v)", ErrSessionLost, err)
	}
	return c.wrap(ctx, "notification stream", gen, err)
}

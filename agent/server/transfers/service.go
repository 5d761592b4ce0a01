// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// Engine is what transfers need from the transfer layer: the composite engine.
type Engine interface {
	Import(ctx context.Context, desc engines.MemoryDesc) error
	Deregister(ctx context.Context, id engines.MemoryID) error
	NewPlan() engines.PlanBuilder
	Submit(ctx context.Context, plans *engines.PlanSet, opts engines.SubmitOptions) (engines.Transfer, error)
	Explain(src, dst engines.MemoryID) (engines.Explanation, error)
}

// SegmentResolver finds named segments and published layouts on other nodes of the pool (agent/peers).
type SegmentResolver interface {
	// ResolveSegment returns the SegmentDescriptor (serialized) of segment on node, asked for by a pod of
	// namespace asker.
	ResolveSegment(ctx context.Context, node, segment, asker string) ([]byte, error)
	// ResolveLayout returns the published layout segment of node, asked for by a pod of namespace asker.
	ResolveLayout(ctx context.Context, node, segment, asker string) (*agentv1.LayoutDescriptor, error)
	// ForgetLayout tells node, which resolved this node's published layout as segment for namespace asker,
	// that the layout is gone.
	ForgetLayout(ctx context.Context, node, segment, asker string) error
	// ConfirmDescriptor returns the SegmentDescriptor (serialized) node issued for its region id, when key is
	// the region's key.
	ConfirmDescriptor(ctx context.Context, node string, id uint64, key []byte) ([]byte, error)
}

// Limits bound one caller's transfers.
type Limits struct {
	MaxInFlight         int
	MaxItemsPerTransfer int
	// MaxInFlightBytes bounds the bytes of one caller's transfers in flight at once.
	MaxInFlightBytes uint64
}

// EngineNote is what detection said of one engine on this node (Explain repeats it).
type EngineNote struct {
	Name, Reason string
}

// Config is what a Service is built from.
type Config struct {
	Table  *regiontable.Table
	Engine Engine
	Limits Limits
	Node   string
	// Peers resolves segments and layouts on other nodes; nil limits them to this node.
	Peers   SegmentResolver
	Engines []EngineNote
	// SessionGrace bounds how long an evicted import waits for the transfers still using it.
	SessionGrace time.Duration
	// FinishedRetention is how long settled transfers stay visible to Wait (and Cancel and Watch by id), among
	// the agent's last 65,536 transfers.
	FinishedRetention time.Duration
	// Stopping is closed when the server begins to stop; open streams (Watch, Notifications) end with it.
	Stopping <-chan struct{}
	Refusals *refusals.Counters
	// Epoch is this agent instance's epoch (high 32 bits; the table's): transfer ids count up from it, so an id
	// a previous instance handed out names no transfer here and is told apart from ids this one handed out.
	Epoch uint64
	// Logger hears what no caller is answered with (nil: nothing is logged).
	Logger *slog.Logger
}

// Service moves memory between the regions of a Table and other nodes' memory: it plans and submits transfers,
// records how they end for Wait and Watch, delivers notifications and imports other nodes' memory into the
// engines. Its state lives under the table's lock.
type Service struct {
	table        *regiontable.Table
	engine       Engine
	limits       Limits
	node         string
	peers        SegmentResolver
	engines      []EngineNote
	sessionGrace time.Duration
	stopping     <-chan struct{}
	refusals     *refusals.Counters
	log          *slog.Logger

	// running are the transfers not settled yet; settled keeps the settled ones' statuses for Wait.
	running map[uint64]*transfer
	// waited are the waited transfers in flight, by session (Settle).
	waited  map[*regiontable.Session]map[*transfer]struct{}
	settled settledRing
	closed  chan struct{} // closed: the done of a settled transfer looked up again
	// Transfer ids are epoch+1, epoch+2, …, epoch+nextXfer (past 2^32 transfers the count carries into the
	// epoch's bits: ids stay distinct and increasing).
	epoch     uint64
	nextXfer  uint64
	watchers  map[string]map[*watcher]struct{}
	listeners map[string]map[*notifyListener]struct{}
	// notifyBytes are the bytes of notifications the listeners of each caller hold, by caller key.
	notifyBytes map[string]int
	notifySeq   uint64 // deliveries so far
	imports     map[engines.MemoryID]*imported
	importMu    sync.Mutex
	// peerLayouts are other nodes' published layouts, resolved (under a lock of their own).
	peerLayouts peerLayouts
	// ids recycles the block-id arrays of block transfers (*[]uint32).
	ids sync.Pool
	// blockTags are a block transfer's tags (one, for all its blocks); oneEngine the engines list of a transfer
	// of one plan, by engine. Both are read only, shared by every transfer.
	blockTags []string
	oneEngine map[string][]string
}

// New makes a service with no transfers.
func New(cfg Config) *Service {
	s := &Service{table: cfg.Table, engine: cfg.Engine, limits: cfg.Limits, node: cfg.Node, peers: cfg.Peers,
		engines: cfg.Engines, sessionGrace: cfg.SessionGrace, stopping: cfg.Stopping, refusals: cfg.Refusals,
		epoch: cfg.Epoch, running: map[uint64]*transfer{}, waited: map[*regiontable.Session]map[*transfer]struct{}{}, settled: newSettledRing(cfg.FinishedRetention), closed: make(chan struct{}),
		watchers: map[string]map[*watcher]struct{}{}, listeners: map[string]map[*notifyListener]struct{}{},
		notifyBytes: map[string]int{},
		imports:     map[engines.MemoryID]*imported{}, blockTags: []string{blockTag}, oneEngine: map[string][]string{},
		log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, name := range []string{engines.EngineXGMI, engines.EngineFabric, engines.EngineRDMA, engines.EngineTCP} {
		s.oneEngine[name] = []string{name}
	}
	close(s.closed)
	return s
}

// ImportedLocked is how many other nodes' regions are imported into the engines (the table's lock held).
func (s *Service) ImportedLocked() int { return len(s.imports) }

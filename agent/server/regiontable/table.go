// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontable

import (
	"context"
	"sync"

	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/engines"
)

// Engine is what the table needs from the transfer layer: registering and deregistering memory.
type Engine interface {
	Register(ctx context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error)
	Deregister(ctx context.Context, id engines.MemoryID) error
	CanHandle(src, dst *engines.MemoryDesc) (ok bool, reason string)
}

// Limits bound what one caller (one pod) may register.
type Limits struct {
	MaxRegions         int
	MaxRegisteredBytes uint64
}

// GPU is one GPU of this node, as detection found it.
type GPU struct {
	Index  int
	UUID   string
	Vendor engines.Vendor
	BusID  string
	// FabricDomain is the GPU's scale-up domain key (empty outside any domain).
	FabricDomain string
}

// Config is what a Table is built from.
type Config struct {
	// Node, PoolNamespace and PoolName say whose regions these are: descriptors carry them, and descriptors of
	// another pool are refused. PeerEndpoint is this agent's agent-to-agent address, written into descriptors.
	Node, PoolNamespace, PoolName, PeerEndpoint string
	// Epoch is or'ed into every region and layout id, so an id of a previous agent instance names nothing here.
	Epoch  uint64
	Engine Engine
	Limits Limits
	// Tokens are the fd socket's descriptors, which RegisterMemory takes.
	Tokens *fdsocket.Tokens
	GPUs   []GPU
	// FabricDomainOf, when set, is a GPU's fabric domain key now, read at each registration in place of
	// GPU.FabricDomain; ok false leaves that.
	FabricDomainOf func(gpu int) (domain string, ok bool)
	Refusals       *refusals.Counters
}

// Table is the memory callers registered with the agent: regions, the layouts over them, the names both are
// published under, and what each caller holds against its limits.
//
// Its lock is the agent server's one lock: the server's sessions, transfers and listeners live under it too, so
// a region, the counts it is charged to and the transfers that name it change together. Methods whose names end
// in Locked are called with it held; the others take it themselves.
type Table struct {
	sync.Mutex

	node, poolNamespace, poolName, peerEndpoint string
	epoch                                       uint64
	engine                                      Engine
	limits                                      Limits
	tokens                                      *fdsocket.Tokens
	gpus                                        []GPU
	fabricDomainOf                              func(gpu int) (string, bool)
	refusals                                    *refusals.Counters

	nextRegion uint64
	regions    map[uint64]*Region
	byMemory   map[engines.MemoryID]*Region
	segments   map[string]*Region
	nextLayout uint64
	layouts    map[uint64]*Layout
	// layoutSegments are published layouts, by name (a namespace of their own beside region segments).
	layoutSegments map[string]*Layout
	callers        map[string]*Usage
	// added, when set, runs after each region is recorded (SetAddedHook; tests only).
	added func()
}

// New makes an empty table.
func New(cfg Config) *Table {
	return &Table{node: cfg.Node, poolNamespace: cfg.PoolNamespace, poolName: cfg.PoolName, peerEndpoint: cfg.PeerEndpoint,
		epoch: cfg.Epoch, engine: cfg.Engine, limits: cfg.Limits, tokens: cfg.Tokens, gpus: cfg.GPUs,
		fabricDomainOf: cfg.FabricDomainOf, refusals: cfg.Refusals,
		regions: map[uint64]*Region{}, byMemory: map[engines.MemoryID]*Region{}, segments: map[string]*Region{},
		layouts: map[uint64]*Layout{}, layoutSegments: map[string]*Layout{}, callers: map[string]*Usage{}}
}

// A Session is one client connection as the table sees it. Regions belong to the session that created them and
// go away with it; visibility and limits are per caller (Caller.Key), shared by a pod's connections.
type Session struct {
	ID     uint64
	Caller identity.Caller
	// Regions are the regions the session registered.
	Regions map[uint64]*Region
	// Ended is set once the connection is gone: nothing is added to the session after.
	Ended bool
}

// Usage is what one caller holds, against its limits.
type Usage struct {
	Regions  int
	Bytes    uint64
	InFlight int
	// InFlightBytes are the bytes of the transfers counted in InFlight.
	InFlightBytes uint64
}

// UsageOfLocked is what the caller of key holds, nil when it holds nothing.
func (tab *Table) UsageOfLocked(key string) *Usage { return tab.callers[key] }

// ReleaseUsageLocked forgets the usage of key once it holds nothing, so the table keeps an entry per caller that
// holds something rather than per pod the node ever ran. Called after every decrease and every refusal that may
// leave an entry empty; an entry is only ever held across an unlock while it counts something.
func (tab *Table) ReleaseUsageLocked(key string) {
	if u := tab.callers[key]; u != nil && *u == (Usage{}) {
		delete(tab.callers, key)
	}
}

// CallersLocked is how many callers hold something.
func (tab *Table) CallersLocked() int { return len(tab.callers) }

// EachUsageLocked calls f with every caller's usage.
func (tab *Table) EachUsageLocked(f func(*Usage)) {
	for _, u := range tab.callers {
		f(u)
	}
}

// ByMemoryLocked finds the region of an engine memory id.
func (tab *Table) ByMemoryLocked(mem engines.MemoryID) (*Region, bool) {
	r, ok := tab.byMemory[mem]
	return r, ok
}

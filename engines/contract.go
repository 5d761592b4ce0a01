// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"math"
	"os"
	"time"
)

// Engine names, in the composite's fixed order of preference. Order is documentation, not a tie-break: engines
// are disjoint, so at most one of them claims any pair.
const (
	EngineXGMI   = "xgmi"
	EngineFabric = "fabric"
	EngineRDMA   = "rdma"
	EngineTCP    = "tcp"
)

// EngineRank returns the position of an engine name in the fixed order xgmi, fabric, rdma, tcp.
func EngineRank(name string) (int, bool) {
	switch name {
	case EngineXGMI:
		return 0, true
	case EngineFabric:
		return 1, true
	case EngineRDMA:
		return 2, true
	case EngineTCP:
		return 3, true
	}
	return 0, false
}

// DefaultTimeout bounds a transfer whose context has no deadline and whose SubmitOptions set no timeout.
const DefaultTimeout = 60 * time.Second

// MaxNotifyPayload is the largest notification payload a submission may carry.
const MaxNotifyPayload = 64 << 10

// MaxNotifyEntries bounds the regions one notification names: a transfer has at most 65,536 items, and a block
// transfer's pairs of layout regions are fewer (at most 4,096 a layout). A receiver refuses more before looking
// any up. Tags are not bounded by it: a block transfer planned item by item (one item, and tag, per block and
// region pair) has up to 65,536 times its regions' count.
const MaxNotifyEntries = 1 << 16

// MemoryID names a registered region. It is unique across the cluster: agents build it from their node name
// (for example "node-a/17"). At most 256 bytes of printable ASCII without spaces.
type MemoryID string

// Tag is the caller's key for an item; failures are reported by tag. Tags need not be unique.
type Tag uint64

// LocationKind says whether memory is host memory or GPU memory.
type LocationKind uint8

const (
	// LocationHost is host (CPU) memory.
	LocationHost LocationKind = 1
	// LocationGPU is device memory of one GPU.
	LocationGPU LocationKind = 2
)

func (k LocationKind) String() string {
	switch k {
	case LocationHost:
		return "host"
	case LocationGPU:
		return "gpu"
	}
	return "invalid"
}

// Vendor is the GPU vendor of device memory.
type Vendor string

const (
	VendorNVIDIA Vendor = "nvidia"
	VendorAMD    Vendor = "amd"
)

// Location says where memory lives. Device, Vendor and BusID are meaningful for GPU memory only.
type Location struct {
	Kind LocationKind
	// Device is the GPU index as the owning agent enumerates it (all GPUs visible, not a container's view).
	Device int
	Vendor Vendor
	// BusID is the GPU's PCI address (lowercase, "0000:c1:00.0"), so a peer can identify it across containers.
	BusID string
}

// MemoryDesc describes one registered region and every way to reach it. The zero value of a handle means "not
// reachable that way". Engines fill handles on Register and never clear handles another engine filled.
type MemoryDesc struct {
	ID MemoryID
	// Node is the name of the node (agent) that owns the memory.
	Node     string
	Location Location
	Size     uint64
	// FabricDomain is the scale-up domain key of the memory's GPU: "ualink:<ppod>/<vpod>" or
	// "nvlink:<clusterUUID>.<cliqueId>"; empty for host memory and GPUs outside any domain.
	FabricDomain string
	Handles      Handles
}

// Handles are the ways to reach a region, side by side. The first group is process-local: it is meaningful only
// inside the process that registered the memory and never leaves it ([MarshalDesc] drops it).
type Handles struct {
	// Ptr is the region's virtual address in the registering process (device address for GPU memory).
	Ptr uintptr
	// Host is a view of host memory (len == Size). Required for host memory registered locally; the registrant
	// keeps it alive and unmoved (mmap'd or pinned) until Deregister returns.
	Host []byte
	// VMM is a POSIX file descriptor for a VMM (cuMem/hipMem) shareable allocation.
	VMM *VMMHandle

	// IPC is a legacy CUDA/HIP IPC memory handle (64 bytes) of the allocation holding the region.
	IPC []byte
	// IPCOffset is the region's offset inside the IPC-exported allocation.
	IPCOffset uint64
	// Fabric is a fabric handle (NVIDIA IMEX / AMD UALink) of the allocation holding the region.
	Fabric *FabricHandle
	// RDMA holds one memory key per NIC the region is registered with.
	RDMA []RDMAKey
	// TCP is the host:port of the owning agent's data listener (the tcp engine).
	TCP string
}

// VMMHandle is the process-local VMM shareable handles (POSIX fds) of the allocations holding a region: one,
// or several of equal size that the owner maps back to back in one address range (PyTorch's expandable
// segments), which the importer maps the same way.
type VMMHandle struct {
	// FDs are the allocations from the lowest address up; FDs[0] is the only one of a single allocation.
	FDs []*os.File
	// Offset is the region's offset from the start of the first allocation; AllocSize is the size of each.
	Offset    uint64
	AllocSize uint64
}

// MaxVMMAllocations bounds the allocations one region may span: each is an open descriptor, an imported handle
// and a mapping in the agent. 8192 allocations of PyTorch's 20 MiB large-pool segments are 160 GiB.
const MaxVMMAllocations = 8192

// Span is the bytes the allocations cover together, and false when there are none, more than
// MaxVMMAllocations, or the size overflows.
func (v *VMMHandle) Span() (uint64, bool) {
	n := uint64(len(v.FDs))
	if n == 0 || n > MaxVMMAllocations || v.AllocSize == 0 || v.AllocSize > math.MaxUint64/n {
		return 0, false
	}
	return n * v.AllocSize, true
}

// FabricTokenSize is the size of a fabric shareable handle (CUmemFabricHandle, hipMemFabricHandle).
const FabricTokenSize = 64

// FabricHandle is a fabric shareable handle of the allocation holding a region.
type FabricHandle struct {
	Token [FabricTokenSize]byte
	// Offset is the region's offset inside the exported allocation; AllocSize is the allocation's size.
	Offset    uint64
	AllocSize uint64
}

// RDMAKey reaches a region through one NIC.
type RDMAKey struct {
	// Device is the verbs device name on the owning node ("mlx5_0").
	Device string
	Addr   uint64
	RKey   uint32
}

// Item asks for Size bytes to move from (Src, SrcOffset) to (Dst, DstOffset).
type Item struct {
	Src       MemoryID
	SrcOffset uint64
	Dst       MemoryID
	DstOffset uint64
	Size      uint64
	Tag       Tag
}

// Direction is which side of a plan is local.
type Direction uint8

const (
	// DirLocal: both regions belong to this node.
	DirLocal Direction = 1
	// DirWrite: local source, remote destination (push).
	DirWrite Direction = 2
	// DirRead: remote source, local destination (pull).
	DirRead Direction = 3
)

func (d Direction) String() string {
	switch d {
	case DirLocal:
		return "local"
	case DirWrite:
		return "write"
	case DirRead:
		return "read"
	}
	return "unknown"
}

// Segment is one contiguous copy inside a plan.
type Segment struct {
	SrcOffset uint64
	DstOffset uint64
	Size      uint64
}

// Plan is a group of segments between one source and one destination region, executed by one engine.
type Plan struct {
	Engine    string
	Direction Direction
	Src, Dst  MemoryID
	Segments  []Segment
	// Blocks, when set, is the plan in block form and Segments is empty (engines whose Limits set BlockPlans;
	// SegmentsOf expands it).
	Blocks *BlockList
	// Tags of every item that landed in this plan, in segment order.
	Tags  []Tag
	Bytes uint64

	// Registration generations of Src and Dst at planning; Submit refuses a plan whose region was
	// deregistered and registered again since (its bounds were checked against the old one).
	srcGen, dstGen uint64
}

// PlanSet is the outcome of planning. Every item added is in exactly one of Plans (by tag), Rejected or Dropped.
type PlanSet struct {
	Plans    []Plan
	Rejected []*ItemError
	// Dropped holds the tags of empty items.
	Dropped []Tag

	// owner identifies the registry (or composite) that planned the set and planner the engine it was planned
	// for; Submit refuses sets planned elsewhere, including by another engine sharing the registry.
	owner   any
	planner string
	// parts holds the per-engine plan sets of a composite plan set, in engine order (in onePart when one).
	parts   []*PlanSet
	onePart [1]*PlanSet
}

// Bytes returns the total size of all plans.
func (ps *PlanSet) Bytes() uint64 {
	var n uint64
	for i := range ps.Plans {
		n += ps.Plans[i].Bytes
	}
	return n
}

// PlanBuilder plans items one at a time. It is not safe for concurrent use.
type PlanBuilder interface {
	// Add accepts the item (nil), drops it when empty (nil, tag recorded in PlanSet.Dropped), or rejects it with
	// an *ItemError naming its tag (also recorded in PlanSet.Rejected). A rejected item changes nothing.
	Add(item Item) error
	// Build returns the plan set. Of items whose destination ranges overlap, the one that starts first in
	// destination order (at equal starts, the one added first) is kept and each item starting inside a kept
	// one's range is rejected here with ErrOverlap (segments run in any order and in parallel). The builder must
	// not be used afterwards.
	Build() *PlanSet
}

// SubmitOptions tune one submission.
type SubmitOptions struct {
	// Timeout bounds the transfer; the effective deadline is the earlier of the context's and now+Timeout.
	// With neither, DefaultTimeout applies.
	Timeout time.Duration
	// Notify, when non-nil, is delivered to the destination node's notification handler after every byte of
	// the submission has landed there: one Notification per destination node and engine (a composite
	// submission whose pairs to one node go through two engines delivers two, each naming its own regions and
	// tags). Failed submissions deliver none. At most MaxNotifyPayload bytes.
	Notify []byte
	// Waited says the submitter waits for the transfer at once (Wait or Drive). An engine may then leave
	// seeing the hardware finish to that waiting goroutine instead of handing it to one of its own: a GPU
	// copy of a few microseconds ends without a hand-off between threads. A wait that gives up, or none at
	// all within WaitedHandoff, hands the transfer to a goroutine, so it always completes.
	Waited bool
	// Share names whom the transfer is for (the agent's caller): engines whose workers several transfers share
	// hand them out in turns between shares (Slots), so one share's queue does not hold the others'.
	Share string

	// onDone is the composite's hook, told that part onDonePart finished: trackers call it after Done closes and
	// before unpinning regions, so the composite transfer is done before a Deregister waiting for those regions
	// returns. An interface and an index rather than a closure: nothing to allocate per transfer.
	onDone     partWatcher
	onDonePart int
}

// partWatcher is told when a part of a composite transfer finished.
type partWatcher interface {
	partFinished(part int)
}

// Driven is implemented by transfers whose completion the waiting goroutine can observe itself
// (SubmitOptions.Waited). Drive polls until the transfer is done, ctx ends or the engine's polling budget is
// spent, then returns whether it is done; the transfer goes on either way. Wait drives too.
type Driven interface {
	Drive(ctx context.Context) bool
}

// LandedDriven is implemented by transfers that can tell the goroutine driving them that every byte landed
// before their own bookkeeping (unpinning regions, metrics, closing Done) runs, so a waited call's answer
// leaves that much sooner. DriveLanded drives as Drive does; when the transfer succeeds while it drives, l is
// told once, before Done closes, and landed is true. Once DriveLanded returns, l is never told.
type LandedDriven interface {
	DriveLanded(ctx context.Context, l Lander) (done, landed bool)
}

// Lander is told that a transfer's bytes have all landed (LandedDriven); it must not wait for the transfer.
type Lander interface {
	Landed()
}

// Transfer is a submitted plan set.
type Transfer interface {
	// Done is closed when every plan has finished (succeeded, failed, cancelled or timed out).
	Done() <-chan struct{}
	// Wait blocks until Done or until ctx ends (then it returns ctx's error and the transfer goes on). Once Done,
	// it returns the same result on every call: nil, or a *TransferError with one Failure per failed plan.
	Wait(ctx context.Context) error
	// Cancel stops the transfer; unfinished plans fail with ErrCancelled. Safe to call at any time, repeatedly.
	Cancel()
	// Outcomes returns one Outcome per plan, in PlanSet order; valid once Done is closed.
	Outcomes() []Outcome
}

// Outcome is how one plan ended.
type Outcome struct {
	Err error
	// Elapsed is the time from submission to the plan's end.
	Elapsed time.Duration
}

// Notification tells a destination node that a submission's bytes have landed.
type Notification struct {
	// From is the node that submitted the transfer.
	From string
	// Regions are the destination regions written (on the receiving node), sorted, without duplicates.
	Regions []MemoryID
	// Tags are the tags of the items that landed there, in plan order.
	Tags    []Tag
	Payload []byte
}

// NotifyFunc receives notifications. It must not block for long: the sender waits for it to return.
type NotifyFunc func(Notification)

// NotifySender carries a notification to another node for engines that have no wire of their own (xgmi-style
// copies into memory another node owns, fabric). The agent implements it over its agent-to-agent channel and
// calls the receiving engine's handler on the other side.
type NotifySender interface {
	SendNotification(ctx context.Context, node string, n Notification) error
}

// Engine moves bytes for the pairs it claims. Every method is safe for concurrent use.
type Engine interface {
	// Name is one of EngineXGMI, EngineFabric, EngineRDMA, EngineTCP (the composite answers CompositeName).
	Name() string
	// Register adds local memory (desc.Node is this node) and returns desc with the handles this engine can
	// produce filled in; handles it cannot produce are left as they were. An engine that cannot reach the
	// memory at all still registers it (so it can answer CanHandle) and returns it unchanged.
	Register(ctx context.Context, desc MemoryDesc) (MemoryDesc, error)
	// Import adds another node's memory, as that node's MarshalDesc produced it.
	Import(ctx context.Context, desc MemoryDesc) error
	// Deregister removes a local or imported region. New plans and submissions that name it are refused at once.
	// Transfers in flight that use it are waited for until ctx ends; then they are cancelled (failing with
	// ErrDeregistered) and waited for a bounded grace period more. Deregister never returns nil while a copy may
	// still touch the memory: if the grace period runs out it returns ErrBusy and the region stays pinned
	// (refusing new work); the caller must not free the memory then, and may call Deregister again.
	Deregister(ctx context.Context, id MemoryID) error
	// CanHandle says whether this engine moves bytes between src and dst, and why not.
	CanHandle(src, dst *MemoryDesc) (ok bool, reason string)
	// NewPlan starts planning a batch.
	NewPlan() PlanBuilder
	// Submit starts a plan set built by this engine's NewPlan. It does not block on the wire. It returns an
	// error only when the set itself is unusable (planned by another engine, engine closed); per-plan problems
	// (a region deregistered since planning) are reported by the Transfer.
	Submit(ctx context.Context, plans *PlanSet, opts SubmitOptions) (Transfer, error)
	// SetNotifyHandler installs the handler for notifications addressed to this node (nil drops them).
	SetNotifyHandler(fn NotifyFunc)
	// Close cancels every transfer in flight, waits for them (bounded), and releases the engine's resources.
	Close() error
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package engines is fabricxfer's transfer layer: the contract every data-movement engine implements, the
// shared machinery that keeps engines honest (a region registry, a pure planner, a transfer tracker), and the
// composite engine that routes each (source, destination) pair to exactly one engine.
//
// # The model
//
// Memory is described by a [MemoryDesc]: an id, the node that owns it, where it lives (host or a GPU), its size,
// the fabric domain of its GPU, and every handle that can reach it side by side ([Handles]). An empty handle
// means "not reachable that way". Which handle is used is a property of the (source, destination) pair, never of
// one endpoint alone.
//
// Local memory enters an engine with [Engine.Register], which fills the handles that engine can produce;
// descriptors of another node's memory (received over the agent-to-agent channel, see [MarshalDesc] and
// [UnmarshalDesc]) enter with [Engine.Import]. [Engine.Deregister] removes either kind.
//
// A transfer is a list of [Item]s (source id and offset, destination id and offset, size, caller tag). Items go
// into a [PlanBuilder] one at a time; each is accepted or rejected on the spot with a typed error that names its
// tag ([ItemError]); empty items are dropped. [PlanBuilder.Build] returns a [PlanSet]: every accepted item sits in
// exactly one [Plan], adjacent segments are coalesced, segments are split at engine limits, and plans come out in
// a deterministic order. Bounds are checked once, here: on a GPU an overrun is silent corruption, not a crash.
//
// [Engine.Submit] starts a plan set without blocking on the wire and returns a [Transfer]. Every transfer has a
// deadline (the context's, [SubmitOptions.Timeout], or [DefaultTimeout]) and can be cancelled.
// [Transfer.Wait] waits for every plan, returns the same result on every call, and reports failures per plan,
// mapped back to the caller's tags ([TransferError], [Failure]). A plan set may be submitted again (a prepared
// batch); regions are re-validated on every submission.
//
// Direction follows from which side is local: both local is [DirLocal], local source and remote destination is
// [DirWrite] (push), remote source and local destination is [DirRead] (pull). Two remote sides are unplannable.
//
// A submission may carry a notification payload ([SubmitOptions.Notify]); once every byte has landed, the
// destination's node delivers a [Notification] to the handler installed with [Engine.SetNotifyHandler], and
// only then does the transfer succeed. Engines without a wire of their own send it through a [NotifySender]
// provided by the agent.
//
// # Errors
//
// Callers test errors with errors.Is against the sentinels ([ErrUnknownMemory], [ErrOutOfBounds],
// [ErrOverlap], [ErrUnplannable], [ErrPeerLost], [ErrDeadline], [ErrCancelled], [ErrDeregistered], ...) and with
// errors.As against [ItemError], [UnplannableError], [PeerLostError] and [TransferError].
//
// # Writing an engine
//
// An engine embeds a [Base] (its name, its region table, planning with its [Limits] and CanHandle, Import, the
// notification handler) and writes the rest: CanHandle, Register (its handles and private state), Deregister
// (releasing that state), Submit and Close. Its table is [Regions]; at submit time [Registry.Begin] validates
// the plan set, pins its regions for the life of the transfer and returns a [Tracker] to report each plan's
// outcome into. The contract suite in engines/enginetest checks an engine against every rule above.
//
// # One registry, one planning pass
//
// In the agent a node has one [Registry]: the composite's ([CompositeOptions.Registry]), on which every engine
// is built (each engine's Options.Registry). The composite alone adds and removes regions; on Deregister it
// drains a region across engines, then each engine releases its own state of it (memory registrations,
// mappings, staging, kept by MemoryID), then the region is removed. Engines answer CanHandle, fill handles in
// Register, and execute plan sets in Submit; the composite plans every batch once for them ([Planned]: it
// builds each engine's plans with the engine's [Limits] from the batch it checked). [Regions] makes an
// engine's Register, Import, Deregister and Close right whether its table is shared or its own: an engine used
// alone (tests, benchmarks) keeps a registry of its own and plans with its own planner.
//
// Engines restore any ambient state they touch on the caller's goroutine: a GPU engine that sets the current
// device or context (cudaSetDevice, cuCtxPushCurrent, hipSetDevice) restores the previous one before returning,
// and pins its OS thread (runtime.LockOSThread) for as long as such state is changed.
//
// This package imports no Kubernetes code, so GPU test binaries stay small and the layer can be embedded.
package engines

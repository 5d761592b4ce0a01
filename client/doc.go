// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package client is the Go client of the fabricxfer agent's sidecar socket: register memory, move it, wait.
//
//	c, err := client.Dial(ctx, "/var/run/fabricxfer/kv-pool/agent.sock")
//	shm, err := client.NewSharedMemory("kv", 1<<30)          // memfd the agent can map
//	kv, err := c.RegisterHost(ctx, shm.File, 0, shm.Size(), client.Segment("kv-0"))
//	st, err := c.Write(ctx, kv, 0, client.ToSegment("node-b", "kv-0"), 0, 4096)
//
// GPU memory of this process is named by one of its handles (RegisterGPU): a cudaIpcMemHandle_t, the POSIX fds
// of VMM allocations mapped back to back (any number, in address order), or a fabric handle.
//
// Transfers are asynchronous (Submit, then Transfer.Wait) or one round trip (Write, Read). Every call takes a
// context; its deadline bounds the call, and a waited transfer's too (the agent fails it then; copies already
// started may still land); TransferOptions.Timeout bounds the transfer itself. Cancelling a waited call's context
// ends the call at once and the agent stops its transfer once it notices (on the fast socket, when it sees the
// connection go), so its copies may go on landing for up to as long as the whole transfer takes: memory a
// cancelled call wrote to is not the caller's to reuse before Settle returned, which waits until the agent stopped
// every call cut short before it. An unwaited transfer (Submit) stops only by
// Transfer.Cancel, and WaitAll waits for many. A TransferError reads as its
// state (Code, and errors.Is with context.DeadlineExceeded or context.Canceled). Transfers and
// block transfers go over the agent's fast socket, their frames through shared memory both sides poll (a
// mailbox) where they fit; WithSpin bounds the client's polling, WithoutMailbox and WithoutFastPath turn the
// two off. A call the agent did not answer in time drops the fast connection; the client opens it again in the
// background, and calls go through gRPC until it is back.
//
// Regions belong to the client's connection. When the agent restarts, calls fail fast with ErrSessionLost
// (never hang): every call names the agent session its memory is in, and the agent refuses one that reaches
// another. Recover re-registers every region the client registered from its own memory (ids change, *Region
// and layout values stay valid: Recover registers the layouts again too; a Notifications stream ends with the
// session and is opened again by the caller), once however many goroutines call it, and
// only when the agent's instance or the connection's session changed. Pool slices cannot be recovered: their
// memory belonged to the old agent. Calls after Close fail with ErrClosed.
package client

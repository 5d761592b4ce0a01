// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// exampleSocket is where the shared test agent listens.
var exampleSocket string

func TestMain(m *testing.M) {
	// The example and the Python tests need an agent; an in-process one on a temporary socket stands in for
	// the node's.
	srv, stop, err := runLocalAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test agent:", err)
		os.Exit(1)
	}
	exampleSocket = srv.SocketPath()
	code := m.Run()
	stop()
	os.Exit(code)
}

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, exampleSocket, client.WithName("example"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Two regions of shared memory: one published as a segment peers (and this client) can name.
	src, _ := client.NewSharedMemory("src", 1<<20)
	dst, _ := client.NewSharedMemory("dst", 1<<20)
	defer src.Close()
	defer dst.Close()
	copy(src.Bytes, "a KV block")
	a, err := c.RegisterHost(ctx, src.File, 0, src.Size())
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, dst.File, 0, dst.Size(), client.Segment("kv-in")); err != nil {
		log.Fatal(err)
	}

	// One round trip: write 4 KiB into the segment and wait for it to land.
	st, err := c.Write(ctx, a, 0, client.ToSegment("", "kv-in"), 0, 4096)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, st.Bytes, bytes.HasPrefix(dst.Bytes, []byte("a KV block")))
	// Output: TRANSFER_STATE_SUCCEEDED 4096 true
}

// A KV cache on a GPU as a block layout: each layer's K and V tensor registered by the IPC handle of the
// cudaMalloc allocation it lives in (or RegisterGPU with VMMFiles for VMM memory), grouped as numbered blocks,
// and blocks moved to a layout another pod published on this node, one call for every layer. The handles come
// from the process's own CUDA bindings; the agent opens them from its own process.
func ExampleClient_RegisterLayout() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.DialDefault(ctx, client.WithName("decode"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	const layers, blockBytes, blocks = 32, 16 << 10, 1024
	var tensors [2 * layers]struct {
		ipcHandle []byte // cudaIpcGetMemHandle of the allocation holding the tensor
		offset    uint64 // the tensor's offset into that allocation
	}
	regions := make([]*client.Region, 0, len(tensors))
	for _, t := range tensors {
		r, err := c.RegisterGPU(ctx, client.GPUMemory{GPUIndex: 0, IPCHandle: t.ipcHandle, Offset: t.offset,
			Length: blocks * blockBytes})
		if err != nil {
			log.Fatal(err)
		}
		regions = append(regions, r)
	}
	kv, err := c.RegisterLayout(ctx, regions, blockBytes)
	if err != nil {
		log.Fatal(err)
	}
	// Blocks 3, 9 and 4 of every layer's K and V into blocks 0, 1 and 2 of the layout published as "prefill-kv".
	if _, err := c.TransferBlocks(ctx, client.Write, kv, []uint32{3, 9, 4}, client.ToLayoutSegment("", "prefill-kv"),
		[]uint32{0, 1, 2}, client.TransferOptions{}); err != nil {
		log.Fatal(err)
	}
	// The same blocks every step: pack the call once, run it each time.
	step, err := c.PrepareBlocks(client.Write, kv, []uint32{0}, client.ToLayoutSegment("", "prefill-kv"), []uint32{0},
		client.TransferOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := step.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

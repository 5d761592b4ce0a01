// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// A prefill process hands KV blocks to a decode process: the decode side waits for the prefill layout, checks
// its geometry, publishes its own and listens; the prefill side writes blocks into it with a notification that
// says what arrived. Two clients of one agent here; on two nodes, name the node in ToLayoutSegment and
// ResolveLayoutSegment.
func Example_prefillToDecode() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const blockBytes, blocks = 4096, 8
	// layout registers one region per name (a layer's K and V) of blocks blocks, in memory the agent can map.
	layout := func(c *client.Client, names []string, opts ...client.LayoutOption) (*client.Layout, []*client.SharedMemory) {
		var regions []*client.Region
		var mems []*client.SharedMemory
		for _, name := range names {
			m, err := client.NewSharedMemory(name, blockBytes*blocks)
			if err != nil {
				log.Fatal(err)
			}
			r, err := c.RegisterHost(ctx, m.File, 0, m.Size())
			if err != nil {
				log.Fatal(err)
			}
			regions, mems = append(regions, r), append(mems, m)
		}
		l, err := c.RegisterLayout(ctx, regions, blockBytes, opts...)
		if err != nil {
			log.Fatal(err)
		}
		return l, mems
	}
	decode, err := client.Dial(ctx, exampleSocket, client.WithName("decode"))
	if err != nil {
		log.Fatal(err)
	}
	defer decode.Close()
	prefill, err := client.Dial(ctx, exampleSocket, client.WithName("prefill"))
	if err != nil {
		log.Fatal(err)
	}
	defer prefill.Close()

	// Decode starts first: the prefill layout is not there yet.
	_, err = decode.ResolveLayoutSegment(ctx, "", "kv-prefill")
	fmt.Println("before prefill:", client.Code(err))

	kv, prefillMem := layout(prefill, []string{"k", "v"}, client.PublishLayout("kv-prefill"))
	copy(prefillMem[0].Bytes[3*blockBytes:], "block 3 of k")
	copy(prefillMem[1].Bytes[3*blockBytes:], "block 3 of v")

	g, err := decode.ResolveLayoutSegment(ctx, "", "kv-prefill")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("kv-prefill: %d regions of %d blocks of %d bytes\n", g.GetRegions(), g.GetBlocks(), g.GetBlockBytes())

	// Decode's own layout, of the same geometry, published for prefill to write into; listened to first, as
	// nothing that lands before the stream is open is told.
	_, decodeMem := layout(decode, []string{"k-in", "v-in"}, client.PublishLayout("kv-decode"))
	listen, stop := context.WithCancel(ctx)
	defer stop()
	notes, _, err := decode.Notifications(listen)
	if err != nil {
		log.Fatal(err)
	}

	// Prefill writes its block 3 of every region into decode's block 0, and says which request it was.
	if _, err := prefill.TransferBlocks(ctx, client.Write, kv, []uint32{3}, client.ToLayoutSegment("", "kv-decode"),
		[]uint32{0}, client.TransferOptions{Notify: []byte("req-7")}); err != nil {
		log.Fatal(err)
	}
	n := <-notes
	fmt.Printf("notified: %q, %d regions\n", n.GetPayload(), len(n.GetRegionIds()))
	fmt.Println("landed:", bytes.HasPrefix(decodeMem[0].Bytes, []byte("block 3 of k")),
		bytes.HasPrefix(decodeMem[1].Bytes, []byte("block 3 of v")))
	for _, m := range append(prefillMem, decodeMem...) {
		m.Close()
	}
	// Output:
	// before prefill: NotFound
	// kv-prefill: 2 regions of 8 blocks of 4096 bytes
	// notified: "req-7", 2 regions
	// landed: true true
}

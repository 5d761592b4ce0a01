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

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestItemTransfersPastTheAgentsLimitsAreRefusedWithThem: more items than the agent moves a call, or items whose
// request passes the 4 MiB the agent reads (long tags here), are refused with InvalidArgument naming the limit
// before anything is sent, on the fast socket and through gRPC alike; the memory is untouched and the client
// goes on working.
func TestItemTransfersPastTheAgentsLimitsAreRefusedWithThem(t *testing.T) {
	srv := startLocal(t)
	for _, opts := range [][]client.Option{nil, {client.WithoutFastPath()}} {
		c, ctx := dialLocal(t, srv, "limits", opts...)
		mem := sharedMemory(t, "limits", 4096)
		copy(mem.Bytes, bytes.Repeat([]byte("fabric"), 600))
		before := append([]byte(nil), mem.Bytes...)
		r, err := c.RegisterHost(ctx, mem.File, 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		most := int(c.Info().GetLimits().GetMaxItemsPerTransfer())
		many := make([]client.Item, most+1)
		for i := range many {
			many[i] = client.Item{Local: r, Remote: client.ToRegion(r), RemoteOffset: 2048, Length: 1}
		}
		wide := make([]client.Item, 5000)
		for i := range wide {
			wide[i] = client.Item{Local: r, Remote: client.ToRegion(r), RemoteOffset: 2048, Length: 1, Tag: strings.Repeat("t", 1000)}
		}
		for _, tc := range []struct {
			items []client.Item
			want  string
		}{{many, fmt.Sprintf("at most %d items a call", most)}, {wide, "requests of at most 4194304 bytes"}} {
			_, err := c.Do(ctx, client.Write, tc.items, client.TransferOptions{})
			if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%d items: %v (%v), want InvalidArgument saying %q", len(tc.items), err, client.Code(err), tc.want)
			}
		}
		if !bytes.Equal(mem.Bytes, before) {
			t.Fatal("a refused transfer moved bytes")
		}
		if _, err := c.Do(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToRegion(r), RemoteOffset: 2048, Length: 64}}, client.TransferOptions{}); err != nil {
			t.Fatalf("a transfer after the refusals: %v", err)
		}
		if !bytes.Equal(mem.Bytes[2048:2112], before[:64]) {
			t.Fatal("the transfer after the refusals did not land")
		}
	}
}

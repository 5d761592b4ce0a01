// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// A client busy on the fast socket alone makes no gRPC calls; a gRPC channel that may go idle then closes its
// connection, and the agent ends the session with it (regions, layouts and names gone, the next call
// ErrSessionLost though the agent never restarted). That is what a channel allowed to idle does within a second
// here; a client as Dial makes it keeps its session over the same calls. gRPC's default idle time is 30 minutes,
// which a prefill-side connector that only moved blocks met every half hour.
func TestAClientBusyOnTheFastSocketKeepsItsSession(t *testing.T) {
	srv := startLocal(t)
	mem := sharedMemory(t, "idle", 1<<16)
	for _, tc := range []struct {
		name     string
		opts     []client.Option
		keepsSes bool
	}{
		{"a channel allowed to idle", []client.Option{client.WithIdleAfter(300 * time.Millisecond)}, false},
		{"as Dial makes it", nil, true},
	} {
		c, ctx := dialLocal(t, srv, "idle", tc.opts...)
		r, err := c.RegisterHost(ctx, mem.File, 0, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		lay, err := c.RegisterLayout(ctx, []*client.Region{r}, 4096)
		if err != nil {
			t.Fatal(err)
		}
		var lost error
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end) && lost == nil; time.Sleep(100 * time.Millisecond) {
			copy(mem.Bytes[:4096], bytes.Repeat([]byte{byte(time.Now().UnixNano())}, 4096))
			if _, err := c.TransferBlocks(ctx, client.Write, lay, []uint32{0}, client.ToLayout(lay), []uint32{1}, client.TransferOptions{}); err != nil {
				lost = err
			} else if !bytes.Equal(mem.Bytes[:4096], mem.Bytes[4096:8192]) {
				t.Fatalf("%s: block 1 is not block 0 after the copy", tc.name)
			}
		}
		if tc.keepsSes && lost != nil {
			t.Fatalf("%s: a client calling on the fast socket every 100 ms: %v", tc.name, lost)
		}
		if !tc.keepsSes && !errors.Is(lost, client.ErrSessionLost) {
			t.Fatalf("%s: %v, want ErrSessionLost (else this test shows nothing of the idle channel)", tc.name, lost)
		}
		c.Close()
	}
}

// Dialling and closing clients, with a fast connection and its mailbox each, leaves no mapping behind: the
// mailbox was mapped by one package and unmapped through another, which refused it, and every fast connection
// (each Dial, reopen and Recover) left 64 KiB of shared memory mapped for the life of the process.
func TestClosedClientsLeaveNoMailboxMapped(t *testing.T) {
	srv := startLocal(t)
	mem := sharedMemory(t, "mailboxes", 1<<16)
	mailboxes := func() int {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(maps), "fabricxfer-mailbox")
	}
	before := mailboxes()
	for range 40 {
		c, ctx := dialLocal(t, srv, "mailboxes")
		r, err := c.RegisterHost(ctx, mem.File, 0, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		if on, _ := client.MailboxRequests(c); !on {
			t.Fatal("the client has no mailbox: this test shows nothing")
		}
		if _, err := c.Write(ctx, r, 0, client.ToRegion(r), 4096, 4096); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	after := mailboxes()
	t.Logf("mailbox mappings: %d before, %d after 40 clients", before, after)
	if after > before+2 {
		t.Fatalf("40 clients dialled and closed left %d mailbox mappings (%d before)", after, before)
	}
}

// A notification stream nobody reads ends when its client closes: its goroutine waited to hand over the next
// notification until the caller's context ended, which a context.Background() never does.
func TestAnUnreadNotificationStreamEndsWithItsClient(t *testing.T) {
	srv := startLocal(t)
	mem := sharedMemory(t, "unread", 1<<16)
	base := runtime.NumGoroutine()
	var waits []func() error
	for range 5 {
		c, ctx := dialLocal(t, srv, "unread")
		r, err := c.RegisterHost(ctx, mem.File, 0, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		_, wait, err := c.Notifications(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 70 { // past the channel's 64
			if _, err := c.Do(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToRegion(r), RemoteOffset: 4096, Length: 64}},
				client.TransferOptions{Notify: []byte{byte(i + 1)}}); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		waits = append(waits, wait)
	}
	for i, wait := range waits {
		done := make(chan error, 1)
		go func() { done <- wait() }()
		select {
		case err := <-done:
			if !errors.Is(err, client.ErrClosed) {
				t.Fatalf("stream %d of a closed client: %v, want ErrClosed", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("stream %d of a closed client, its channel unread: still open after 5 s", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		t.Fatalf("goroutines %d after 5 closed clients, %d before", n, base)
	}
}

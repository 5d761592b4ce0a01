// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// lockedBuffer is a log sink shared by the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The agent's logs, at the most verbose level, carry no capability: no fd token, no fast-path token, no
// segment key or descriptor (which holds the key and the memory's handles), however the calls went.
func TestLogsCarryNoTokensKeysOrHandles(t *testing.T) {
	var logs lockedBuffer
	opts := baseOptions(t, newProcFixture(t))
	opts.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.Level(-10)}))
	opts.Pool = newHostPool(t, 4<<20)
	opts.Limits = server.DefaultLimits
	opts.Limits.MaxRegions = 3
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)

	var secrets [][]byte
	fast, err := c.API().OpenFastPath(ctx, &agentv1.OpenFastPathRequest{})
	if err != nil {
		t.Fatal(err)
	}
	secrets = append(secrets, []byte(fast.Token))
	alloc, err := c.API().AllocateFromPool(ctx, &agentv1.AllocateFromPoolRequest{Length: 1 << 20, SegmentName: "kv-cache"})
	if err != nil {
		t.Fatal(err)
	}
	secrets = append(secrets, []byte(alloc.FdToken))
	src := shm(t, 1<<20)
	rs, err := c.RegisterHost(ctx, src.File, 0, 1<<20, client.Segment("weights"))
	if err != nil {
		t.Fatal(err)
	}
	for _, desc := range [][]byte{rs.Descriptor(), alloc.Region.Desc} {
		var sd agentv1.SegmentDescriptor
		if err := proto.Unmarshal(desc, &sd); err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, desc, sd.Key)
	}
	// Failures log too: a token never issued, a token used twice, a region over the limit, a forged key.
	if _, err := fdpass.Get(ctx, a.srv.FDSocketPath(), "0123456789abcdef0123456789abcdef"); err == nil {
		t.Error("an unknown fd token was honoured")
	}
	secrets = append(secrets, []byte("0123456789abcdef0123456789abcdef"))
	if f, err := fdpass.Get(ctx, a.srv.FDSocketPath(), alloc.FdToken); err == nil {
		f.Close()
	}
	if _, err := fdpass.Get(ctx, a.srv.FDSocketPath(), alloc.FdToken); err == nil {
		t.Error("an fd token was honoured twice")
	}
	_, _ = c.RegisterHost(ctx, src.File, 0, 4096)
	var sd agentv1.SegmentDescriptor
	_ = proto.Unmarshal(rs.Descriptor(), &sd)
	sd.Key = bytes.Repeat([]byte{0x5a}, len(sd.Key))
	forged, _ := proto.Marshal(&sd)
	_, _ = c.Write(ctx, rs, 0, client.ToDescriptor(forged), 0, 4096)
	secrets = append(secrets, forged, sd.Key)
	a.stop(t)

	out := logs.String()
	if !strings.Contains(out, `"msg"`) {
		t.Fatalf("the server logged nothing to check:\n%s", out)
	}
	for _, s := range secrets {
		if len(s) < 8 {
			continue
		}
		for _, enc := range []string{string(s), hex.EncodeToString(s), base64.StdEncoding.EncodeToString(s),
			base64.RawURLEncoding.EncodeToString(s)} {
			if strings.Contains(out, enc) {
				t.Errorf("the logs carry a secret (%.16s…):\n%s", enc, out)
			}
		}
	}
	for _, marker := range []string{"PRIVATE KEY", "BEGIN CERTIFICATE"} {
		if strings.Contains(out, marker) {
			t.Errorf("the logs carry %q", marker)
		}
	}
}

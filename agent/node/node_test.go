// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Bad options are refused with the flag they came from before the agent reaches the API server or the node: a
// detection option is checked before the kubeconfig is read, and standalone refuses the same values.
func TestBadOptionsAreRefusedBeforeAnythingStarts(t *testing.T) {
	missingKubeconfig := filepath.Join(t.TempDir(), "missing-kubeconfig")
	good := func() Options {
		return Options{Detection: DetectionOptions{HostRoot: filepath.Join(testdata, "rdma-only-node"), NodeName: "n-1"},
			Kubeconfig: missingKubeconfig, PoolNamespace: "inference", PoolName: "kv", Heartbeat: time.Second}
	}
	for name, c := range map[string]struct {
		change func(*Options)
		want   string
	}{
		"no node name":         {func(o *Options) { o.Detection.NodeName = "" }, "--node-name"},
		"zero heartbeat":       {func(o *Options) { o.Heartbeat = 0 }, "--heartbeat"},
		"negative heartbeat":   {func(o *Options) { o.Heartbeat = -time.Second }, "--heartbeat"},
		"unknown engine":       {func(o *Options) { o.Detection.Engines = "xgmi,ib" }, "--engines"},
		"no engine":            {func(o *Options) { o.Detection.Engines = "," }, "--engines"},
		"unknown disabled":     {func(o *Options) { o.Detection.DisableEngines = "nvlink" }, "--disable-engines"},
		"bad fabric domain":    {func(o *Options) { o.Detection.FabricDomain = "vpod-1" }, "--fabric-domain"},
		"missing NVML fixture": {func(o *Options) { o.Detection.NVMLFixture = filepath.Join(t.TempDir(), "none.json") }, "--nvml-fixture"},
		"missing host root":    {func(o *Options) { o.Detection.HostRoot = filepath.Join(t.TempDir(), "missing") }, "missing"},
		"the API's kubeconfig": {func(*Options) {}, "missing-kubeconfig"},
	} {
		o := good()
		c.change(&o)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := New(ctx, o, logr.Discard())
		cancel()
		if err == nil || n != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New returned %v, %v; want no agent and an error naming %q", name, n, err, c.want)
			continue
		}
		if strings.HasPrefix(c.want, "--") && c.want != "--node-name" && c.want != "--heartbeat" && strings.Contains(err.Error(), "kubeconfig") {
			t.Errorf("%s: the kubeconfig was read before the detection options were checked: %v", name, err)
		}
		if c.want == "--node-name" || c.want == "--heartbeat" || c.want == "missing-kubeconfig" {
			continue // standalone names the node after the host and has no heartbeat or kubeconfig
		}
		o.Transfer.SocketDir = t.TempDir()
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		n, err = NewStandalone(ctx, o, logr.Discard())
		cancel()
		if err == nil || n != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewStandalone returned %v, %v; want no agent and an error naming %q", name, n, err, c.want)
		}
	}
}

// Without the agent-to-agent channel the fabric engine's notifications fail, saying why.
func TestNotificationsWithoutTheChannelSayWhy(t *testing.T) {
	err := noChannel{}.SendNotification(context.Background(), "node-b", engines.Notification{})
	if err == nil || !strings.Contains(err.Error(), "node-b") || !strings.Contains(err.Error(), "--tls-dir") {
		t.Fatalf("notification without a channel: %v, want an error naming the node and --tls-dir", err)
	}
}

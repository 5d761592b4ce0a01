// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/rdmanics"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// rdmaEngine builds the rdma engine on the agent-to-agent channel pc: detection must have found a usable RDMA
// port (and the pool allow rdma), the pool's certificates must be mounted (pc is nil without them: queue
// pairs are exchanged over the channel) and libibverbs must load and see a detected device. The engine
// exchanges its queue pairs and sends its notifications over the channel and answers peers' exchanges; where
// it does not run, t.rdmaWhyNot says why and peers that ask are told so. fe, when running, claims the pairs
// whose remote side it can map; rdma leaves those to it. reg is the node's region table.
func (t *transferSide) rdmaEngine(cfg Config, reg *engines.Registry, pc *peers.Peers, fe *fabric.Engine) (*rdma.Engine, error) {
	provider, why := t.rdmaProvider(cfg)
	if why != "" {
		t.rdmaWhyNot = why
		if engineAllowed(t.report, engines.EngineRDMA) {
			t.log.Info("rdma engine not running", "reason", why)
		}
		if pc != nil {
			pc.SetQPAcceptor(nil, why)
		}
		return nil, nil
	}
	opts := rdma.Options{Node: cfg.NodeName, Provider: provider, NICs: rdmanics.FromReport(&t.report), Exchanger: pc, Notifier: pc,
		Registry: reg}
	if t.cudaDriver != nil {
		opts.DMABuf = rdma.CUDADMABuf{Driver: t.cudaDriver, PageSize: uint64(os.Getpagesize())}
	}
	if fe != nil {
		opts.Yield = func(src, dst *engines.MemoryDesc) bool { ok, _ := fe.CanHandle(src, dst); return ok }
	}
	e, err := rdma.New(opts)
	if err != nil {
		return nil, err
	}
	pc.SetQPAcceptor(e, "")
	t.rdmaRunning = true
	t.log.Info("rdma engine running", "dmaBuf", opts.DMABuf != nil, "yieldsToFabric", opts.Yield != nil)
	return e, nil
}

// rdmaProvider opens the RDMA devices when the rdma engine can run here (libibverbs unless Deps.RDMAProvider is
// given), or says why it cannot.
func (t *transferSide) rdmaProvider(cfg Config) (rdma.Provider, string) {
	e, ok := t.report.Engine(engines.EngineRDMA)
	switch {
	case !ok:
		return nil, "detection reported no rdma engine"
	case !e.Available:
		return nil, e.Reason
	case cfg.TLSDir == "":
		return nil, "needs the pool's agent certificates (--tls-dir): queue pairs are exchanged over the agent-to-agent channel"
	case t.deps.RDMAProvider != nil:
		return t.deps.RDMAProvider, ""
	}
	lib, err := verbs.Open(t.opts.Libibverbs)
	if err != nil {
		return nil, "libibverbs did not load: " + err.Error()
	}
	if t.opts.sysRoot != "" {
		lib.SysfsRoot = t.opts.sysRoot
	}
	seen, err := lib.DeviceNames()
	if err != nil {
		return nil, "libibverbs lists no devices: " + err.Error()
	}
	var detected []string
	for _, n := range t.report.NICs {
		if n.Usable() && !slices.Contains(detected, n.Name) {
			detected = append(detected, n.Name)
		}
	}
	for _, d := range detected {
		if slices.Contains(seen, d) {
			return rdma.VerbsProvider(lib), ""
		}
	}
	return nil, fmt.Sprintf("libibverbs sees none of the detected RDMA devices (%s); it sees [%s]",
		strings.Join(detected, ", "), strings.Join(seen, ", "))
}

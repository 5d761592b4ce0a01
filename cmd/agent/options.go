// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/fabricxfer/fabricxfer/topology"
	"github.com/fabricxfer/fabricxfer/topology/nvml"
	"github.com/fabricxfer/fabricxfer/topology/nvmlfake"
)

// errUsage means the flag package already printed what was wrong.
var errUsage = errors.New("usage")

// Environment variables that set defaults of the flags of the same meaning.
const (
	envNodeName       = "NODE_NAME"
	envDisableEngines = "FABRICXFER_DISABLE_ENGINES"
	envEngines        = "FABRICXFER_ENGINES"
	envFabricDomain   = "FABRICXFER_FABRIC_DOMAIN"
	envNVMLFixture    = "FABRICXFER_NVML_FIXTURE"
)

// detectionFlags are the flags detect and run share.
type detectionFlags struct {
	hostRoot       string
	nodeName       string
	disableEngines string
	engines        string
	fabricDomain   string
	nvmlFixture    string
	// declarations, when set, gives each detection the VPodTopologies that declare this node's GPUs.
	declarations func(ctx context.Context) []topology.Declaration
}

func (d *detectionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.hostRoot, "host-root", "/", "directory holding the node's /sys and /proc (the host's / mounted into the agent)")
	fs.StringVar(&d.nodeName, "node-name", os.Getenv(envNodeName), "name of the Node this agent runs on (default $"+envNodeName+")")
	fs.StringVar(&d.disableEngines, "disable-engines", os.Getenv(envDisableEngines), "comma-separated engines to report unavailable, e.g. fabric,rdma (default $"+envDisableEngines+")")
	fs.StringVar(&d.engines, "engines", os.Getenv(envEngines), "comma-separated engines the pool allows (the operator passes the pool's spec.engines); the others are reported unavailable (default $"+envEngines+", empty allows all)")
	fs.StringVar(&d.fabricDomain, "fabric-domain", os.Getenv(envFabricDomain), "pin every GPU's fabric domain key, ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId> (default $"+envFabricDomain+")")
	fs.StringVar(&d.nvmlFixture, "nvml-fixture", os.Getenv(envNVMLFixture), "answer NVML queries from this JSON file instead of the driver (fixture nodes and demos)")
}

// detector builds the detection function the flags describe, failing on bad input before anything runs.
func (d *detectionFlags) detector() (func(ctx context.Context) (topology.Report, error), error) {
	host, err := topology.NewDirHost(d.hostRoot)
	if err != nil {
		return nil, err
	}
	o, err := d.overrides()
	if err != nil {
		return nil, err
	}
	open := topology.OpenNVML(nvml.Open)
	if d.nvmlFixture != "" {
		m, err := nvmlfake.Load(d.nvmlFixture)
		if err != nil {
			return nil, fmt.Errorf("--nvml-fixture: %w", err)
		}
		open = m.Opener()
	}
	opts := topology.Options{OpenNVML: open, Overrides: o}
	declarations := d.declarations
	return func(ctx context.Context) (topology.Report, error) {
		opts := opts
		if declarations != nil {
			opts.Declarations = declarations(ctx)
		}
		return topology.Detect(ctx, host, opts)
	}, nil
}

// overrides merges the engine and domain flags: engines the pool does not allow and engines disabled on the
// node are both reported unavailable, each saying where that came from.
func (d *detectionFlags) overrides() (topology.Overrides, error) {
	o := topology.Overrides{FabricDomain: d.fabricDomain}
	disabled := map[string]bool{}
	var by []string
	if d.engines != "" {
		allowed, err := topology.ParseEngineList(d.engines)
		if err != nil {
			return o, fmt.Errorf("--engines: %w", err)
		}
		if len(allowed) == 0 {
			return o, fmt.Errorf("--engines %q names no engine", d.engines)
		}
		ok := map[string]bool{}
		for _, e := range allowed {
			ok[e] = true
		}
		for _, e := range topology.AllEngines() {
			if !ok[e] {
				disabled[e] = true
			}
		}
		by = append(by, "the pool's engines (--engines)")
	}
	if d.disableEngines != "" {
		off, err := topology.ParseEngineList(d.disableEngines)
		if err != nil {
			return o, fmt.Errorf("--disable-engines: %w", err)
		}
		for _, e := range off {
			disabled[e] = true
		}
		by = append(by, "agent configuration (--disable-engines)")
	}
	for _, e := range topology.AllEngines() {
		if disabled[e] {
			o.DisabledEngines = append(o.DisabledEngines, e)
		}
	}
	o.DisabledBy = strings.Join(by, " and ")
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("--fabric-domain: %w", err)
	}
	return o, nil
}

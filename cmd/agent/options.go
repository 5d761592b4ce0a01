package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

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
	envFabricDomain   = "FABRICXFER_FABRIC_DOMAIN"
	envNVMLFixture    = "FABRICXFER_NVML_FIXTURE"
)

// detectionFlags are the flags detect and run share.
type detectionFlags struct {
	hostRoot       string
	nodeName       string
	disableEngines string
	fabricDomain   string
	nvmlFixture    string
}

func (d *detectionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.hostRoot, "host-root", "/", "directory holding the node's /sys and /proc (the host's / mounted into the agent)")
	fs.StringVar(&d.nodeName, "node-name", os.Getenv(envNodeName), "name of the Node this agent runs on (default $"+envNodeName+")")
	fs.StringVar(&d.disableEngines, "disable-engines", os.Getenv(envDisableEngines), "comma-separated engines to report unavailable, e.g. fabric,rdma (default $"+envDisableEngines+")")
	fs.StringVar(&d.fabricDomain, "fabric-domain", os.Getenv(envFabricDomain), "pin every GPU's fabric domain key, ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId> (default $"+envFabricDomain+")")
	fs.StringVar(&d.nvmlFixture, "nvml-fixture", os.Getenv(envNVMLFixture), "answer NVML queries from this JSON file instead of the driver (fixture nodes and demos)")
}

// detector builds the detection function the flags describe, failing on bad input before anything runs.
func (d *detectionFlags) detector() (func(ctx contextLike) (topology.Report, error), error) {
	host, err := topology.NewDirHost(d.hostRoot)
	if err != nil {
		return nil, err
	}
	var o topology.Overrides
	if d.disableEngines != "" {
		if o.DisabledEngines, err = topology.ParseEngineList(d.disableEngines); err != nil {
			return nil, fmt.Errorf("--disable-engines: %w", err)
		}
		o.DisabledBy = "agent configuration (--disable-engines / " + envDisableEngines + ")"
	}
	o.FabricDomain = d.fabricDomain
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("--fabric-domain: %w", err)
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
	return func(ctx contextLike) (topology.Report, error) {
		return topology.Detect(ctx, host, opts)
	}, nil
}

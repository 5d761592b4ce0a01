// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"fmt"
	"sort"
	"strings"
)

// Engine names, in the order the composite engine tries them.
const (
	EngineXGMI   = "xgmi"
	EngineFabric = "fabric"
	EngineRDMA   = "rdma"
	EngineTCP    = "tcp"
)

// AllEngines lists every engine in the composite's order.
func AllEngines() []string { return []string{EngineXGMI, EngineFabric, EngineRDMA, EngineTCP} }

// GPU vendors and fabric kinds, spelled as the TransferNode API spells them.
const (
	VendorAMD    = "amd"
	VendorNVIDIA = "nvidia"

	FabricUALink = "ualink"
	FabricNVLink = "nvlink"
)

// PCIe distance levels between a GPU and a NIC, named as nvidia-smi topo names them, nearest first.
type Level int

const (
	LevelPIX  Level = iota // through at most one PCIe switch
	LevelPXB               // through several PCIe bridges, not the host bridge
	LevelPHB               // through the PCIe host bridge
	LevelNODE              // between host bridges of one NUMA node
	LevelSYS               // across NUMA nodes (the SMP interconnect)
)

func (l Level) String() string {
	switch l {
	case LevelPIX:
		return "PIX"
	case LevelPXB:
		return "PXB"
	case LevelPHB:
		return "PHB"
	case LevelNODE:
		return "NODE"
	case LevelSYS:
		return "SYS"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// Unreadable is a fact the detector could not read, and why.
type Unreadable struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

// Fabric is a GPU's scale-up domain that spans nodes.
type Fabric struct {
	Kind   string `json:"kind"`
	Domain string `json:"domain"`
	// Pinned is true when the domain came from an override or a declaration rather than the hardware.
	Pinned bool `json:"pinned,omitempty"`
	// Source is SourceDiscovered, SourceDeclared or SourceOverride.
	Source string `json:"source"`
	// Declaration names the declaration that placed the GPU (SourceDeclared).
	Declaration string `json:"declaration,omitempty"`
	// Size is how many GPUs the hardware says the domain holds (UALink vpod_size); 0 when it does not say.
	Size int `json:"size,omitempty"`
}

// NICRank is one NIC port as seen from a GPU.
type NICRank struct {
	NIC   string `json:"nic"`
	Port  int    `json:"port"`
	Level Level  `json:"level"`
	// Hops is the number of PCIe components between the two devices below their common bridge; it breaks
	// ties within a level.
	Hops int `json:"hops"`
}

// GPU is one GPU, or one partition of a GPU.
type GPU struct {
	Index       int    `json:"index"`
	Vendor      string `json:"vendor"`
	Model       string `json:"model,omitempty"`
	UUID        string `json:"uuid,omitempty"`
	PCIBusID    string `json:"pciBusID"`
	NUMANode    int    `json:"numaNode"`
	MemoryBytes int64  `json:"memoryBytes,omitempty"`
	// XGMIPeers are indexes of GPUs of this node reachable over XGMI (AMD) or NVLink (NVIDIA) peer links.
	XGMIPeers []int `json:"xgmiPeers,omitempty"`
	// XGMIHive is amdgpu's xgmi_hive_id for the GPU's PCI device (secondary evidence; KFD links decide).
	XGMIHive string `json:"xgmiHive,omitempty"`
	// Partition and Partitions place a GPU partition (KFD node) within its physical GPU: partitions share
	// the GPU's unique_id. Both are 0 for a GPU that is not partitioned.
	Partition  int `json:"partition,omitempty"`
	Partitions int `json:"partitions,omitempty"`
	// ActiveNVLinks counts the NVIDIA GPU's NVLinks in state enabled (0 for AMD GPUs or where unknown).
	ActiveNVLinks int     `json:"activeNVLinks,omitempty"`
	Fabric        *Fabric `json:"fabric,omitempty"`
	// FabricNote says why the GPU has no fabric domain (or how it got one); empty when nothing to say.
	FabricNote string `json:"fabricNote,omitempty"`
	// NICs ranks every RDMA port by PCIe distance from this GPU, nearest first.
	NICs       []NICRank    `json:"nics,omitempty"`
	Unreadable []Unreadable `json:"unreadable,omitempty"`

	kfdNode int // KFD topology node id (AMD), -1 otherwise
}

// NIC is one port of an RDMA device.
type NIC struct {
	Name      string `json:"name"`
	Port      int    `json:"port"`
	State     string `json:"state"`
	LinkLayer string `json:"linkLayer"`
	RoCEv2    bool   `json:"roceV2"`
	RateGbps  int    `json:"rateGbps,omitempty"`
	PCIBusID  string `json:"pciBusID,omitempty"`
	NUMANode  int    `json:"numaNode"`
	// NetDev is the network interface the port's RoCE v2 GID belongs to (Ethernet only).
	NetDev string `json:"netDev,omitempty"`
	// NearestGPUs are the GPUs at this NIC's smallest PCIe distance, in index order.
	NearestGPUs []int `json:"nearestGPUs,omitempty"`
	// NearestLevel is the PCIe distance to NearestGPUs.
	NearestLevel string       `json:"nearestLevel,omitempty"`
	Unreadable   []Unreadable `json:"unreadable,omitempty"`

	pciPath string // node-absolute realpath of the PCI function, "" when unreadable
}

// Active is true when the port can carry traffic.
func (n NIC) Active() bool { return n.State == "ACTIVE" }

// Usable is true when the port is active and speaks a transport the rdma engine uses: InfiniBand, or
// Ethernet with a RoCE v2 GID.
func (n NIC) Usable() bool {
	return n.Active() && (n.LinkLayer == "InfiniBand" || (n.LinkLayer == "Ethernet" && n.RoCEv2))
}

// GPUDirect says how NICs may reach GPU memory without staging through host memory.
type GPUDirect struct {
	DMABuf  bool `json:"dmaBuf"`
	PeerMem bool `json:"peerMem"`
	// Evidence names what was found (or looked for), for the engine reason and the table.
	Evidence string `json:"evidence,omitempty"`
}

// Engine says whether one transfer engine can run on the node, and why (not).
type Engine struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// Report is everything detected on one node.
type Report struct {
	GPUs      []GPU     `json:"gpus"`
	NICs      []NIC     `json:"nics"`
	Engines   []Engine  `json:"engines"`
	GPUDirect GPUDirect `json:"gpuDirect"`
	// IMEXRegistered is true when the NVIDIA driver registered its IMEX channel region (/proc/devices).
	IMEXRegistered bool `json:"imexRegistered,omitempty"`
	// IMEXChannels counts the IMEX channel devices in /dev/nvidia-caps-imex-channels; importing NVLink
	// fabric memory from another node needs one.
	IMEXChannels int `json:"imexChannels,omitempty"`
	// NVIDIADriver is the first line of /proc/driver/nvidia/version, when present.
	NVIDIADriver string `json:"nvidiaDriver,omitempty"`
	// NVSwitches counts NVSwitch PCI functions (HGX boards; GB200 trays do not show theirs).
	NVSwitches int          `json:"nvSwitches,omitempty"`
	Unreadable []Unreadable `json:"unreadable,omitempty"`
	// Declarations are the declarations that name this node and what was taken of each.
	Declarations []DeclarationResult `json:"declarations,omitempty"`
}

// Engine returns the named engine's entry.
func (r Report) Engine(name string) (Engine, bool) {
	for _, e := range r.Engines {
		if e.Name == name {
			return e, true
		}
	}
	return Engine{}, false
}

// Overrides are what an operator forces on new or misreporting hardware, from flags, the environment or the
// pool spec.
type Overrides struct {
	// DisabledEngines are reported unavailable whatever the hardware offers.
	DisabledEngines []string
	// DisabledBy says where the disabling came from, for the reason ("pool spec", "--disable-engines").
	DisabledBy string
	// FabricDomain pins the fabric domain key of every GPU (ualink:<ppod>/<vpod> or
	// nvlink:<clusterUUID>.<cliqueId>).
	FabricDomain string
}

// Validate rejects overrides that name no engine or no domain kind.
func (o Overrides) Validate() error {
	known := map[string]bool{}
	for _, e := range AllEngines() {
		known[e] = true
	}
	for _, e := range o.DisabledEngines {
		if !known[e] {
			return fmt.Errorf("disabled engine %q: want one of %s", e, strings.Join(AllEngines(), ", "))
		}
	}
	if o.FabricDomain != "" {
		if _, err := domainKind(o.FabricDomain); err != nil {
			return err
		}
	}
	return nil
}

// ParseEngineList splits a comma-separated engine list ("fabric,rdma"), as flags and the environment
// spell it, and rejects unknown names.
func ParseEngineList(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		if part == "" {
			continue
		}
		out = append(out, part)
	}
	sort.Strings(out)
	if err := (Overrides{DisabledEngines: out}).Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

func domainKind(key string) (string, error) {
	kind, rest, ok := strings.Cut(key, ":")
	if ok && rest != "" && (kind == FabricUALink || kind == FabricNVLink) {
		return kind, nil
	}
	return "", fmt.Errorf("fabric domain %q: want ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId>", key)
}

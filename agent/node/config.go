// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/server"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// EnvPodIP names the pod IP (downward API); advertised addresses default to it.
const EnvPodIP = "POD_IP"

// Config is the transfer side's configuration.
type Config struct {
	SocketDir     string
	PoolNamespace string
	PoolName      string
	NodeName      string
	// HostRoot is where the host's / is mounted; callers' cgroups are read from HostRoot/proc.
	HostRoot   string
	AllowLocal bool
	SocketGID  int

	// PeerListen and DataListen are the agent-to-agent (gRPC) and tcp-engine (bulk bytes) listen addresses;
	// the Advertise forms are what peers dial (default: $POD_IP with the listen port).
	PeerListen, PeerAdvertise string
	DataListen, DataAdvertise string
	// TLSDir holds the pool's tls.crt, tls.key and ca.crt. Empty: single-node mode, no peers, no tcp engine.
	TLSDir string
	// NodeCert: TLSDir holds only the pool's ca.crt and this node's own certificate is obtained through
	// Deps.NodeCertificate (the operator signs it) and renewed before it expires. While the pool moves from
	// the pool-wide certificate of earlier versions, the operator says in TLSDir until when peers on it pass.
	NodeCert bool
	// StaticPeers is "node=host:port,..." for running outside Kubernetes; otherwise TransferNodes are read.
	StaticPeers string
	// DisableTCP keeps the tcp engine off (a pool that disallows it).
	DisableTCP bool
	// TCPStagingBytes bounds the pinned host memory the tcp engine stages GPU memory through, per peer and side
	// (0: the engine's default, 64 MiB).
	TCPStagingBytes int64
	// TCPConnsPerPeer is the number of tcp data connections to each peer (0: the engine's default, 4); each
	// encrypts and decrypts on its own goroutines, so more of them use more cores for one peer.
	TCPConnsPerPeer int
	// PreconnectPeers bounds how many peers get tcp data connections before first use (0: the default, 64;
	// negative: none).
	PreconnectPeers int

	// FastSpin is how long the fast socket polls for a caller's next request before sleeping.
	FastSpin time.Duration
	// FastSpinners bounds the fast connections polling at once.
	FastSpinners int

	PoolHostBytes uint64
	// PoolGPUBytes is device memory allocated on each NVIDIA GPU and lent to callers; on a node where it
	// cannot be (no GPUs, no driver) PoolHostBytes is lent instead.
	PoolGPUBytes uint64
	// PoolSlabBytes is the GPU pool's slab: the unit of device memory lent to one caller at a time (0: an
	// eighth of PoolGPUBytes).
	PoolSlabBytes      uint64
	MaxRegions         int
	MaxRegisteredBytes uint64
	MaxInFlight        int
}

// RegisterFlags adds the transfer side's own flags to fs. The pool, the node, the host root and the advertised
// peer endpoint are the agent's general flags; the caller copies them into Config.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.SocketDir, "socket-dir", fxv1.DefaultSocketDir, "host directory of the pool's sockets (the socket is <dir>/<pool>/agent.sock)")
	fs.BoolVar(&c.AllowLocal, "allow-local", false, "admit socket callers that are in no pod (demo, development); never on a shared cluster")
	fs.IntVar(&c.SocketGID, "socket-gid", -1, "group given the socket directory (mode 0750) and the sockets (mode 0660); -1 keeps the agent's group")
	fs.StringVar(&c.PeerListen, "peer-listen", ":7470", "listen address of the agent-to-agent channel (mTLS gRPC)")
	fs.StringVar(&c.DataListen, "data-listen", ":7471", "listen address of the tcp engine's data path")
	fs.StringVar(&c.DataAdvertise, "data-advertise", "", "address peers dial for the tcp engine (default $"+EnvPodIP+" with the listen port)")
	fs.StringVar(&c.TLSDir, "tls-dir", "/etc/fabricxfer/tls", "directory with the pool's tls.crt, tls.key and ca.crt (outside Kubernetes \"agent certs --dir DIR\" writes them); empty runs this node alone (no peers, no tcp engine)")
	fs.BoolVar(&c.NodeCert, "node-cert", false, "obtain this node's own agent-to-agent certificate from the operator (a CertificateSigningRequest); --tls-dir then holds only ca.crt")
	fs.StringVar(&c.StaticPeers, "peers", "", "static peer list node=host:port,... (outside Kubernetes; otherwise TransferNode endpoints are used)")
	fs.BoolVar(&c.DisableTCP, "disable-tcp", false, "keep the tcp engine off")
	fs.Int64Var(&c.TCPStagingBytes, "tcp-staging-bytes", 0, "pinned host memory the tcp engine stages GPU memory through, per peer node and side, in 4 MiB slots (0: 64 MiB; at least 8 MiB)")
	fs.IntVar(&c.TCPConnsPerPeer, "tcp-conns-per-peer", 0, "tcp data connections to each peer, 1 to 64 (0: 4)")
	fs.IntVar(&c.PreconnectPeers, "preconnect-peers", 64, "open tcp data connections ahead of use to at most this many peers (each agent picks its own subset; -1: none)")
	fs.DurationVar(&c.FastSpin, "fast-spin", server.DefaultFastSpin, "how long a fast-socket connection polls for its caller's next request before sleeping (0 never polls)")
	fs.IntVar(&c.FastSpinners, "fast-spinners", 0, "fast-socket connections that may poll at once, the cores kept busy for latency while callers are active (0: 2, or 1 below 16 cores)")
	fs.Uint64Var(&c.PoolHostBytes, "pool-host-bytes", 0, "host shared memory the agent lends to callers (AllocateFromPool); 0 lends none")
	fs.Uint64Var(&c.PoolGPUBytes, "pool-gpu-bytes", 0, "device memory per NVIDIA GPU the agent lends to callers (AllocateFromPool), fabric-exportable where the driver allows; 0 lends none")
	fs.Uint64Var(&c.PoolSlabBytes, "pool-slab-bytes", 0, "GPU pool memory is lent in slabs of this many bytes, each to one caller at a time (rounded up to the VMM granularity; 0: an eighth of --pool-gpu-bytes); it bounds one allocation")
	fs.IntVar(&c.MaxRegions, "max-regions", server.DefaultLimits.MaxRegions, "regions one caller (pod) may hold")
	fs.Uint64Var(&c.MaxRegisteredBytes, "max-registered-bytes", server.DefaultLimits.MaxRegisteredBytes, "bytes one caller may hold registered (spec.memory.maxRegisteredPerCaller)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", server.DefaultLimits.MaxInFlight, "transfers one caller may have in flight")
}

// CheckPoolRef refuses a pool namespace and name that no TransferPool can have. The socket's folder is <socket
// dir>/<pool>, where a name with a slash or ".." put it elsewhere; certificates name the pool in their SANs, which
// an agent given a name it refuses would never present.
func CheckPoolRef(namespace, name string) error {
	var errs []error
	if namespace == "" || name == "" {
		return errors.New("the pool's namespace and name are required")
	}
	if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--pool-namespace %.80q is no namespace: %s", namespace, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--pool-name %.80q is no TransferPool name: %s", name, strings.Join(msgs, "; ")))
	}
	return errors.Join(errs...)
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	var errs []error
	if err := CheckPoolRef(c.PoolNamespace, c.PoolName); err != nil {
		errs = append(errs, err)
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.SocketDir == "" || !filepath.IsAbs(c.SocketDir) {
		errs = append(errs, fmt.Errorf("--socket-dir %q must be an absolute path", c.SocketDir))
	}
	// The operator writes 1..2147483647 (spec.socketGroup); 0 is allowed here for a hand-run agent. Above the
	// bound a chown would wrap or reach (gid_t)-1, which the kernel reads as "leave the group".
	if c.SocketGID < -1 || c.SocketGID > fxv1.MaxSocketGroup {
		errs = append(errs, fmt.Errorf("--socket-gid %d must be -1 (the agent's group) or a group ID from 0 to %d", c.SocketGID, fxv1.MaxSocketGroup))
	}
	if _, err := ParsePeers(c.StaticPeers); err != nil {
		errs = append(errs, err)
	} else if c.StaticPeers != "" && c.TLSDir == "" {
		// Without certificates the node runs alone: the peers would be ignored, and transfers to them fail later.
		errs = append(errs, errors.New("--peers needs the pool's certificates in --tls-dir (\"agent certs --dir DIR\" writes them; every agent of the pool gets the same)"))
	}
	if c.TCPConnsPerPeer < 0 || c.TCPConnsPerPeer > 64 {
		errs = append(errs, fmt.Errorf("--tcp-conns-per-peer %d must be 0 (the default) or from 1 to 64", c.TCPConnsPerPeer))
	}
	if c.TCPStagingBytes != 0 && (c.TCPStagingBytes < 8<<20 || c.TCPStagingBytes > 64<<30) {
		errs = append(errs, fmt.Errorf("--tcp-staging-bytes %d must be 0 (the default) or from 8 MiB to 64 GiB", c.TCPStagingBytes))
	}
	return errors.Join(errs...)
}

// ParsePeers reads "node=host:port,...".
func ParsePeers(s string) (peers.StaticDirectory, error) {
	out := peers.StaticDirectory{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		node, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || node == "" {
			return nil, fmt.Errorf("--peers: %q is not node=host:port", part)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--peers: node %s: %w", node, err)
		}
		out[node] = addr
	}
	return out, nil
}

func advertise(explicit string, ln net.Listener) string {
	if explicit != "" {
		return explicit
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := os.Getenv(EnvPodIP); ip != "" {
		return net.JoinHostPort(ip, port)
	}
	return ln.Addr().String()
}

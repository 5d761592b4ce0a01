// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/bytesize"
)

// socketFlags locate an agent socket.
type socketFlags struct {
	socket  string
	timeout time.Duration
}

func (s *socketFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.socket, "socket", client.SocketPath(""), "agent socket (default: $FABRICXFER_SOCKET, else a pod's "+
		client.DefaultSocket+", else the one pool socket under "+fxv1.DefaultSocketDir+", as the clients find it)")
	fs.DurationVar(&s.timeout, "timeout", 30*time.Second, "deadline of the whole command")
}

func (s *socketFlags) dial(ctx context.Context) (*client.Client, context.Context, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	c, err := client.Dial(ctx, s.socket, client.WithName("xferctl"))
	if err != nil {
		cancel()
		return nil, nil, nil, socketHint(s.socket, err)
	}
	return c, ctx, cancel, nil
}

// socketHint explains a failed dial of path when nothing is there: which pools' sockets its folder's parent
// holds (an agent serves <socket dir>/<pool>/agent.sock), and how to name one.
func socketHint(path string, err error) error {
	if _, serr := os.Stat(path); serr == nil {
		return err
	}
	var pools []string
	for _, dir := range []string{filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if sock := filepath.Join(dir, e.Name(), "agent.sock"); e.IsDir() && isSocket(sock) {
				pools = append(pools, sock)
			}
		}
		if len(pools) > 0 {
			break
		}
	}
	if len(pools) == 0 {
		return fmt.Errorf("no agent socket at %s (is the agent running? pass --socket <socket dir>/<pool>/agent.sock or set FABRICXFER_SOCKET): %w", path, err)
	}
	return fmt.Errorf("no agent socket at %s; agents listen at %s: pass one as --socket or FABRICXFER_SOCKET: %w", path, strings.Join(pools, ", "), err)
}

func isSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// parseSize reads "4096", "4Ki", "1MiB", "2G" (2·10⁹), as every command does (bytesize.Parse).
func parseSize(s string) (uint64, error) { return bytesize.Parse(s, 0) }

// parseSegmentRef reads "[node/]segment".
func parseSegmentRef(s string) (node, segment string, err error) {
	if s == "" {
		return "", "", fmt.Errorf("segment reference is empty (want [node/]segment)")
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		node, segment = s[:i], s[i+1:]
	} else {
		segment = s
	}
	if segment == "" || strings.Contains(segment, "/") {
		return "", "", fmt.Errorf("segment reference %q: want [node/]segment", s)
	}
	return node, segment, nil
}

func infoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf socketFlags
	sf.register(fs)
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	c, _, cancel, err := sf.dial(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	i := c.Info()
	fmt.Fprintf(stdout, "agent %s (API %s) on node %s, pool %s/%s, at %s\n", i.AgentVersion, i.ApiVersion, i.NodeName, i.PoolNamespace, i.PoolName, sf.socket)
	fmt.Fprintf(stdout, "caller: %s (pid %d, uid %d)\n", i.Caller.Identity, i.Caller.Pid, i.Caller.Uid)
	for _, e := range i.Engines {
		state := "available"
		if !e.Available {
			state = "unavailable"
		}
		fmt.Fprintf(stdout, "engine %-6s %s %s\n", e.Name, state, e.Reason)
	}
	fmt.Fprintf(stdout, "limits: %d regions, %d bytes, %d in flight, %d items per transfer\n", i.Limits.MaxRegions,
		i.Limits.MaxRegisteredBytes, i.Limits.MaxInFlight, i.Limits.MaxItemsPerTransfer)
	if pm := i.PoolMemory; pm != nil {
		fmt.Fprintf(stdout, "pool memory: %s, %d of %d bytes free\n", pm.Kind, pm.FreeBytes, pm.TotalBytes)
		for _, g := range pm.Gpus {
			fabric := "fabric-exportable"
			if !g.FabricExportable {
				fabric = "not fabric-exportable: " + g.FabricReason
			}
			fmt.Fprintf(stdout, "  GPU %d (%s): %d of %d bytes free, %s\n", g.Index, g.BusId, g.FreeBytes, g.TotalBytes, fabric)
		}
	}
	return nil
}

func explainCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf socketFlags
	sf.register(fs)
	from := fs.String("from", "", "source segment, [node/]segment")
	to := fs.String("to", "", "destination segment, [node/]segment")
	fromGPU := fs.String("from-gpu", "", "instead of segments: GPU memory on node/index, routed from the nodes' TransferNodes (needs --to-gpu)")
	toGPU := fs.String("to-gpu", "", "destination GPU, node/index (with --from-gpu)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster, for --from-gpu/--to-gpu")
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	if *fromGPU != "" || *toGPU != "" {
		return explainGPUs(ctx, *kubeconfig, *fromGPU, *toGPU, stdout)
	}
	fn, fseg, err := parseSegmentRef(*from)
	if err != nil {
		return fmt.Errorf("--from: %w", err)
	}
	tn, tseg, err := parseSegmentRef(*to)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	c, ctx, cancel, err := sf.dial(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	resp, err := c.API().Explain(ctx, &agentv1.ExplainRequest{
		Source:      &agentv1.Endpoint{Node: fn, Target: &agentv1.Endpoint_Segment{Segment: fseg}},
		Destination: &agentv1.Endpoint{Node: tn, Target: &agentv1.Endpoint_Segment{Segment: tseg}}})
	if err != nil {
		return err
	}
	if resp.Engine != "" {
		fmt.Fprintf(stdout, "%s -> %s: %s\n", *from, *to, resp.Engine)
	} else {
		fmt.Fprintf(stdout, "%s -> %s: no engine (%s)\n", *from, *to, resp.Reason)
	}
	asked := map[string]bool{}
	for _, v := range resp.Verdicts {
		asked[v.Engine] = true
		mark := "no "
		if v.CanHandle {
			mark = "yes"
		}
		fmt.Fprintf(stdout, "  %-9s %s  %s\n", v.Engine, mark, v.Reason)
	}
	// Engines that never saw the pair: unavailable on this node or not allowed by the pool; say why.
	info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		return fmt.Errorf("asking the agent which engines it runs: %w", err)
	}
	for _, e := range info.Engines {
		if !asked[e.Name] && !e.Available {
			fmt.Fprintf(stdout, "  %-9s no   not running on this node: %s\n", e.Name, e.Reason)
		}
	}
	return nil
}

func registerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("register", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf socketFlags
	sf.register(fs)
	size := fs.String("size", "1Mi", "bytes of shared memory to register")
	segment := fs.String("segment", "", "segment name to publish (required)")
	hold := fs.Duration("hold", 0, "how long to keep the region registered (0: until interrupted)")
	fill := fs.String("fill", "", "fill the memory with this repeated text (default random bytes)")
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	n, err := parseSize(*size)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	if *segment == "" {
		return fmt.Errorf("--segment is required (regions without a name cannot be reached by another process)")
	}
	c, err := client.Dial(ctx, sf.socket, client.WithName("xferctl"))
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := client.NewSharedMemory(*segment, n)
	if err != nil {
		return err
	}
	defer m.Close()
	if *fill != "" {
		for off := 0; off < len(m.Bytes); off += copy(m.Bytes[off:], *fill) {
		}
	} else if _, err := rand.Read(m.Bytes); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, sf.timeout)
	r, err := c.RegisterHost(rctx, m.File, 0, n, client.Segment(*segment))
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "registered %d bytes as segment %q on node %s (region %d), sha256 %x\n", n, *segment,
		c.Info().NodeName, r.ID(), sha256.Sum256(m.Bytes))
	if *hold > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(*hold):
		}
	} else {
		<-ctx.Done()
	}
	fmt.Fprintf(stdout, "final sha256 %x\n", sha256.Sum256(m.Bytes))
	return nil
}

func transferCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("transfer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf socketFlags
	sf.register(fs)
	to := fs.String("to", "", "target segment, [node/]segment")
	size := fs.String("size", "1Mi", "bytes to move")
	offset := fs.String("offset", "0", "offset in the target segment (bytes, or a quantity such as 3Mi)")
	read := fs.Bool("read", false, "read from the segment instead of writing to it")
	verify := fs.Bool("verify", true, "after a write, read the bytes back and compare checksums")
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	node, seg, err := parseSegmentRef(*to)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	n, err := parseSize(*size)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	var off uint64
	if strings.TrimSpace(*offset) != "0" {
		if off, err = parseSize(*offset); err != nil {
			return fmt.Errorf("--offset: %w", err)
		}
	}
	c, ctx, cancel, err := sf.dial(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	m, err := client.NewSharedMemory("xferctl", 2*n)
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := rand.Read(m.Bytes[:n]); err != nil {
		return err
	}
	r, err := c.RegisterHost(ctx, m.File, 0, 2*n)
	if err != nil {
		return err
	}
	remote := client.ToSegment(node, seg)
	op, verb := client.Write, "wrote"
	if *read {
		op, verb = client.Read, "read"
	}
	st, err := c.Do(ctx, op, []client.Item{{Local: r, Remote: remote, RemoteOffset: off, Length: n, Tag: "smoke"}}, client.TransferOptions{})
	if err != nil {
		return err
	}
	el := st.Elapsed.AsDuration()
	fmt.Fprintf(stdout, "%s %d bytes %s %s in %s (%.1f MB/s)\n", verb, n, map[bool]string{true: "from", false: "to"}[*read], *to,
		el, float64(n)/el.Seconds()/1e6)
	if *read || !*verify {
		return nil
	}
	if _, err := c.Do(ctx, client.Read, []client.Item{{Local: r, LocalOffset: n, Remote: remote, RemoteOffset: off, Length: n, Tag: "verify"}},
		client.TransferOptions{}); err != nil {
		return fmt.Errorf("reading back: %w", err)
	}
	if !bytes.Equal(m.Bytes[:n], m.Bytes[n:]) {
		return fmt.Errorf("read back different bytes: sha256 %x written, %x read", sha256.Sum256(m.Bytes[:n]), sha256.Sum256(m.Bytes[n:]))
	}
	fmt.Fprintf(stdout, "verified: read back %d bytes, sha256 %x\n", n, sha256.Sum256(m.Bytes[n:]))
	return nil
}

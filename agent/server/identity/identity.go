// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package identity

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// PeerCred is what the kernel says about the process at the other end of a Unix socket (SO_PEERCRED).
type PeerCred struct {
	PID, UID, GID int32
}

// PeerCredOf reads SO_PEERCRED from a Unix socket connection.
func PeerCredOf(conn *net.UnixConn) (PeerCred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return PeerCred{}, fmt.Errorf("getting the raw socket: %w", err)
	}
	var (
		cred *syscall.Ucred
		serr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return PeerCred{}, fmt.Errorf("reading SO_PEERCRED: %w", err)
	}
	if serr != nil {
		return PeerCred{}, fmt.Errorf("reading SO_PEERCRED: %w", serr)
	}
	return PeerCred{PID: cred.Pid, UID: int32(cred.Uid), GID: int32(cred.Gid)}, nil
}

// Caller is an identified client of the socket. Key is what regions, grants and limits are keyed by: every
// connection from one pod shares it.
type Caller struct {
	Cred      PeerCred
	PodUID    string
	Namespace string
	PodName   string
	// Local is set for a process outside any pod, admitted because the agent allows local callers.
	Local bool
	Key   string
}

func (c Caller) String() string {
	if c.Local {
		return fmt.Sprintf("local process %d (uid %d)", c.Cred.PID, c.Cred.UID)
	}
	return fmt.Sprintf("pod %s/%s (uid %s, pid %d)", c.Namespace, c.PodName, c.PodUID, c.Cred.PID)
}

// PodRef is what the API server says about a pod UID.
type PodRef struct {
	Namespace, Name string
}

// PodResolver maps a pod UID to its namespace and name (backed by the API server in the agent).
type PodResolver interface {
	PodByUID(ctx context.Context, uid string) (PodRef, error)
}

// ErrPodNotFound is returned by resolvers that know no pod with the UID.
var ErrPodNotFound = errors.New("no pod with that UID")

// Identifier turns socket credentials into a Caller.
type Identifier struct {
	// ProcRoot is where /proc is mounted ("/proc" or a fixture tree in tests).
	ProcRoot string
	Pods     PodResolver
	// AllowLocal admits processes that are in no pod (the demo, a developer's shell) as local callers.
	AllowLocal bool
}

// podUIDPattern finds anything that looks like a pod UID in a cgroup path component (either driver's
// spelling); such a path must then be one of the kubelet's layouts, or the caller is refused.
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

var (
	// systemd driver: the pod's slice, named after its whole ancestry ("kubepods-burstable-pod<uid_>.slice").
	systemdPodSlice = regexp.MustCompile(`^((?:[a-z0-9]+-)*)pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice$`)
	// cgroupfs driver: the pod's directory.
	cgroupfsPodDir = regexp.MustCompile(`^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)
	// Where a node runs inside a container (kind, docker-in-docker) with the host's cgroup namespace, the
	// kubelet's hierarchy sits under the node container's cgroup.
	nodeContainerPrefixes = [][]*regexp.Regexp{
		{regexp.MustCompile(`^docker$`), regexp.MustCompile(`^[0-9a-f]{64}$`)},
		{regexp.MustCompile(`^system\.slice$`), regexp.MustCompile(`^docker-[0-9a-f]{64}\.scope$`)},
	}
)

// kubeletRoots are the kubelet --cgroup-root values whose hierarchies are accepted: the default ("/") and
// "/kubelet" (kind, minikube). Under the systemd driver a root's parts prefix every slice name.
var kubeletRoots = [][]string{nil, {"kubelet"}}

// PodUIDFromCgroup returns the pod UID in /proc/<pid>/cgroup content, or "" when the process is in no pod or
// its cgroup is not one the kubelet made (see podUIDFromCgroup).
func PodUIDFromCgroup(content string) string {
	uid, _ := podUIDFromCgroup(content)
	return uid
}

// podUIDFromCgroup finds the pod of a process from its cgroup lines. A pod is recognised only in the
// kubelet's own layouts, at their place in the path:
//
//	systemd   /kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_with_underscores>.slice/...
//	cgroupfs  /kubepods[/<qos>]/pod<uid>/...
//
// (qos burstable or besteffort; guaranteed pods have no qos level), anchored at the cgroup root, under a
// kubelet --cgroup-root of kubeletRoots, or under a node container's cgroup (nodeContainerPrefixes). A path
// that starts with ".." is relative to the agent's own cgroup namespace: the kernel shows the way up to the
// common ancestor, which is then an ancestor of the agent's own pod cgroup, so the path may start anywhere
// along the kubelet's hierarchy but must follow it from there. Anything else that names a pod UID (a
// delegated subtree such as /rt-user-65534/pod<uid>, a user's systemd manager, a chain whose slice names do
// not match their parents) is an error: it is not where the kubelet puts pods. Lines that name different pods
// are an error too.
func podUIDFromCgroup(content string) (string, error) {
	var found string
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; the path may itself contain ':' (rare), so split at most twice.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		uid, err := podUIDFromPath(parts[2])
		if err != nil {
			return "", err
		}
		if uid == "" {
			continue
		}
		if found != "" && found != uid {
			return "", fmt.Errorf("cgroup lines name two pods (%s and %s)", found, uid)
		}
		found = uid
	}
	return found, nil
}

func podUIDFromPath(path string) (string, error) {
	comps := strings.Split(strings.Trim(path, "/"), "/")
	up := 0
	for up < len(comps) && comps[up] == ".." {
		up++
	}
	rest := comps[up:]
	for i, c := range rest {
		if m := systemdPodSlice.FindStringSubmatch(c); m != nil {
			uid := strings.ReplaceAll(m[2], "_", "-")
			if systemdChainOK(rest[:i], strings.Split(strings.TrimSuffix(m[1], "-"), "-"), up > 0) {
				return uid, nil
			}
			return "", fmt.Errorf("cgroup %s names pod %s outside the kubelet's systemd hierarchy", path, uid)
		}
		if m := cgroupfsPodDir.FindStringSubmatch(c); m != nil {
			if cgroupfsChainOK(rest[:i], up > 0) {
				return m[1], nil
			}
			return "", fmt.Errorf("cgroup %s names pod %s outside the kubelet's cgroupfs hierarchy", path, m[1])
		}
		if m := podUIDPattern.FindStringSubmatch(c); m != nil || c == ".." {
			return "", fmt.Errorf("cgroup %s is not one of the kubelet's pod layouts", path)
		}
	}
	return "", nil
}

// qosLevels reports whether levels (what lies between kubepods and the pod) is a kubelet QoS level.
func qosLevels(levels []string) bool {
	return len(levels) == 0 || len(levels) == 1 && (levels[0] == "burstable" || levels[0] == "besteffort")
}

// kubeletPrefix splits segs (a pod's ancestry) into a kubelet root, "kubepods" and the QoS level.
func kubeletPrefix(segs []string) bool {
	for _, root := range kubeletRoots {
		if len(segs) > len(root) && slices.Equal(segs[:len(root)], root) && segs[len(root)] == "kubepods" &&
			qosLevels(segs[len(root)+1:]) {
			return true
		}
	}
	return false
}

// systemdChainOK checks the slices above a pod slice whose name carries ancestry segs: they must be exactly
// the slices systemd names for that ancestry (all of them from the root, after a node-container prefix; a
// trailing part of them when the path is relative).
func systemdChainOK(above []string, segs []string, relative bool) bool {
	if !kubeletPrefix(segs) {
		return false
	}
	chain := make([]string, len(segs))
	for i := range segs {
		chain[i] = strings.Join(segs[:i+1], "-") + ".slice"
	}
	if relative {
		return len(above) <= len(chain) && slices.Equal(above, chain[len(chain)-len(above):])
	}
	return slices.Equal(stripNodeContainer(above), chain)
}

// cgroupfsChainOK checks the directories above a cgroupfs pod directory.
func cgroupfsChainOK(above []string, relative bool) bool {
	if relative {
		// A trailing part of <root>/kubepods/<qos>: with the top cut off, a lone QoS level or nothing.
		for _, root := range kubeletRoots {
			for _, qos := range [][]string{nil, {"burstable"}, {"besteffort"}} {
				full := append(append(slices.Clone(root), "kubepods"), qos...)
				if len(above) <= len(full) && slices.Equal(above, full[len(full)-len(above):]) {
					return true
				}
			}
		}
		return false
	}
	return kubeletPrefix(stripNodeContainer(above))
}

func stripNodeContainer(comps []string) []string {
	for _, prefix := range nodeContainerPrefixes {
		if len(comps) < len(prefix) {
			continue
		}
		ok := true
		for i, re := range prefix {
			ok = ok && re.MatchString(comps[i])
		}
		if ok {
			return comps[len(prefix):]
		}
	}
	return comps
}

// HolderOf is whom a connection not identified yet counts against for a socket's limits: its pod, named from its
// cgroup without asking the API server ("pod/<uid>", as Caller.Key), "uid=<uid>" for a process in no pod, and
// "unreadable" for one whose cgroup cannot be read or parsed (gone already: a pod's process that connects and
// exits must not count as some uid's, which it could pick). Pods often all run as uid 0, so counting by uid let
// one pod's silent connections refuse every other pod's. A process that exited before its cgroup was read is
// "unreadable" too: its pid may be another pod's by then (PeerAlive).
func (id Identifier) HolderOf(conn *net.UnixConn, cred PeerCred) string {
	switch uid, _, err := id.podOf(cred.PID); {
	case err != nil, PeerAlive(conn) != nil:
		return "unreadable"
	case uid != "":
		return "pod/" + uid
	}
	return fmt.Sprintf("uid=%d", cred.UID)
}

// podOf reads the pod UID of process pid from its cgroup ("" for a process in no pod) and says which file it read.
func (id Identifier) podOf(pid int32) (uid, path string, err error) {
	procRoot := id.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	path = filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup")
	content, err := os.ReadFile(path)
	if err != nil {
		return "", path, fmt.Errorf("reading the cgroup of pid %d (%s): %w", pid, path, err)
	}
	if uid, err = podUIDFromCgroup(string(content)); err != nil {
		return "", path, fmt.Errorf("pid %d: %w; refusing it", pid, err)
	}
	return uid, path, nil
}

// Identify resolves who is behind cred.
func (id Identifier) Identify(ctx context.Context, cred PeerCred) (Caller, error) {
	uid, path, err := id.podOf(cred.PID)
	if err != nil {
		return Caller{}, err
	}
	if uid == "" {
		if !id.AllowLocal {
			return Caller{}, fmt.Errorf("pid %d is not in a Kubernetes pod (no pod UID in %s) and this agent does not admit local callers (--allow-local)", cred.PID, path)
		}
		return Caller{Cred: cred, Local: true, Key: fmt.Sprintf("local/uid=%d", cred.UID)}, nil
	}
	if id.Pods == nil {
		return Caller{}, fmt.Errorf("pid %d is in pod %s but this agent has no API server access to find its namespace", cred.PID, uid)
	}
	ref, err := id.Pods.PodByUID(ctx, uid)
	if err != nil {
		return Caller{}, fmt.Errorf("finding the namespace of pod %s (pid %d): %w", uid, cred.PID, err)
	}
	return Caller{Cred: cred, PodUID: uid, Namespace: ref.Namespace, PodName: ref.Name, Key: "pod/" + uid}, nil
}

// NamespaceAllowed applies a pool's allowedNamespaces: empty admits only the pool's own namespace, "*"
// admits every namespace.
func NamespaceAllowed(poolNamespace string, allowed []string, namespace string) bool {
	if len(allowed) == 0 {
		return namespace == poolNamespace
	}
	for _, a := range allowed {
		if a == "*" || a == namespace {
			return true
		}
	}
	return false
}

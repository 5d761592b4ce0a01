package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
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

// podUIDPattern finds the pod UID in a cgroup path, for both cgroup drivers:
// systemd  ".../kubepods-burstable-pod1b2c..._..._....slice/cri-containerd-<id>.scope"
// cgroupfs ".../kubepods/burstable/pod1b2c...-...-.../<container id>"
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// PodUIDFromCgroup returns the pod UID in /proc/<pid>/cgroup content, or "" when the process is in no pod.
func PodUIDFromCgroup(content string) string {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; the path may itself contain ':' (rare), so split at most twice.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if m := podUIDPattern.FindStringSubmatch(parts[2]); m != nil {
			return strings.ReplaceAll(m[1], "_", "-")
		}
	}
	return ""
}

// Identify resolves who is behind cred.
func (id Identifier) Identify(ctx context.Context, cred PeerCred) (Caller, error) {
	procRoot := id.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	path := filepath.Join(procRoot, strconv.Itoa(int(cred.PID)), "cgroup")
	content, err := os.ReadFile(path)
	if err != nil {
		return Caller{}, fmt.Errorf("reading the cgroup of pid %d (%s): %w", cred.PID, path, err)
	}
	uid := PodUIDFromCgroup(string(content))
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

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// The operator checks a pool again before it writes anything from it: the CRD's rules can be older than the
// operator (a CRD not upgraded with the chart), an admin's prefix or image allowlist is not in the CRD at all,
// and a flag the agent misreads is worse than a pool that waits with a condition saying why.

// ErrImageNotAllowed marks a pool whose agent image is neither the operator's nor on the admin's allowlist.
var ErrImageNotAllowed = errors.New("agent image not allowed")

// InvalidPoolError lists what is wrong with a pool's spec; the pool's conditions show it.
type InvalidPoolError struct {
	Problems []string
	// ImageNotAllowed is set when one problem is the agent image.
	ImageNotAllowed bool
}

func (e *InvalidPoolError) Error() string { return strings.Join(e.Problems, "; ") }

// Unwrap lets errors.Is find ErrImageNotAllowed.
func (e *InvalidPoolError) Unwrap() error {
	if e.ImageNotAllowed {
		return ErrImageNotAllowed
	}
	return nil
}

// segment is one directory name under the socket prefix: no '.', '..' or hidden directory, as in the CRD.
const segment = `/[A-Za-z0-9_-][A-Za-z0-9._-]*`

var prefixPattern = regexp.MustCompile(`^(` + segment + `)+$`)

// ValidateSocketDirPrefix checks an admin's socket directory prefix: absolute, in normal form, not the root.
func ValidateSocketDirPrefix(prefix string) error {
	if !normalDir(prefix) {
		return fmt.Errorf("socket directory prefix %q: want an absolute directory other than /, written without '.', '..', '//' or a trailing '/'", prefix)
	}
	return nil
}

// normalDir reports whether dir is an absolute directory other than / in normal form, of the names a CRD's
// socketDir rule allows.
func normalDir(dir string) bool {
	return prefixPattern.MatchString(dir) && path.Clean(dir) == dir
}

// ValidateMPSDirs checks an admin's MPS folders (AgentSettings.MPSPipeDir, MPSShmDir): each empty or an absolute
// directory other than / in normal form, and a shared memory folder only with a pipe folder.
func ValidateMPSDirs(pipeDir, shmDir string) error {
	for _, d := range []struct{ what, dir string }{{"MPS pipe folder", pipeDir}, {"MPS shared memory folder", shmDir}} {
		if d.dir != "" && !normalDir(d.dir) {
			return fmt.Errorf("%s %q: want an absolute directory other than /, written without '.', '..', '//' or a trailing '/'", d.what, d.dir)
		}
	}
	// The pipe folder is mounted at its host path: not over, inside or around a folder the agent mounts already.
	for _, m := range []string{agentHostRootMount, agentSocketMount, agentTLSMount, agentKernelCache, "/dev"} {
		if pipeDir != "" && (pipeDir == m || strings.HasPrefix(pipeDir, m+"/") || strings.HasPrefix(m, pipeDir+"/")) {
			return fmt.Errorf("MPS pipe folder %q: the agent mounts %s itself", pipeDir, m)
		}
	}
	if shmDir != "" && pipeDir == "" {
		return fmt.Errorf("MPS shared memory folder %q without an MPS pipe folder: the agent would not join MPS", shmDir)
	}
	return nil
}

// socketDirUnder reports whether dir is prefix or a directory under it, in normal form.
func socketDirUnder(dir, prefix string) bool {
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `(` + segment + `)*$`).MatchString(dir) {
		return false
	}
	return path.Clean(dir) == dir
}

// byteCount is q as a whole number of bytes within [lo, hi] (or 0 where zero is allowed). Value() alone would
// round a fraction up and clamp an overflow to 2^63-1, writing a flag nobody asked for.
func byteCount(field string, q *resource.Quantity, lo, hi int64, zeroAllowed bool) (int64, error) {
	if q == nil {
		return 0, nil
	}
	if zeroAllowed && q.IsZero() {
		return 0, nil
	}
	if q.Cmp(*resource.NewQuantity(lo, resource.BinarySI)) < 0 || q.Cmp(*resource.NewQuantity(hi, resource.BinarySI)) > 0 {
		want := fmt.Sprintf("between %d and %d bytes", lo, hi)
		if zeroAllowed {
			want = "0 or " + want
		}
		return 0, fmt.Errorf("%s %s: must be %s", field, q.String(), want)
	}
	v := q.Value()
	if q.Cmp(*resource.NewQuantity(v, resource.BinarySI)) != 0 {
		return 0, fmt.Errorf("%s %s: must be a whole number of bytes", field, q.String())
	}
	return v, nil
}

// agentMemoryBesidesPool is the least memory a given limit must leave an agent besides the host pool memory it
// lends (the default limit leaves it 512Mi).
const agentMemoryBesidesPool = 128 << 20

// poolBytes are a pool's memory quantities as the byte counts the agent's flags take (0: flag not written).
type poolBytes struct {
	perGPU, hostStaging, maxRegistered int64
}

func memoryBytes(m fxv1.PoolMemory) (poolBytes, error) {
	var b poolBytes
	var err1, err2, err3 error
	b.perGPU, err1 = byteCount("spec.memory.perGPU", m.PerGPU, fxv1.MinPoolGPUBytes, fxv1.MaxPoolGPUBytes, true)
	b.hostStaging, err2 = byteCount("spec.memory.hostStaging", m.HostStaging, fxv1.MinHostStagingBytes, fxv1.MaxHostStagingBytes, false)
	b.maxRegistered, err3 = byteCount("spec.memory.maxRegisteredPerCaller", m.MaxRegisteredPerCaller, fxv1.MinRegisteredPerCaller, fxv1.MaxRegisteredPerCaller, false)
	return b, errors.Join(err1, err2, err3)
}

// imageAllowed reports whether the agent image is the operator's or on the allowlist: an entry is an exact
// reference, or ends in '*' and matches every reference that starts with what precedes it.
func imageAllowed(image string, settings AgentSettings) bool {
	if image == "" || image == settings.Image {
		return true
	}
	for _, entry := range settings.ImageAllowlist {
		if prefix, wildcard := strings.CutSuffix(entry, "*"); wildcard && strings.HasPrefix(image, prefix) || entry == image {
			return true
		}
	}
	return false
}

// ValidatePool returns an *InvalidPoolError when the operator must not write anything from the pool's spec.
func ValidatePool(pool *fxv1.TransferPool, settings AgentSettings) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	spec := &pool.Spec
	if errs := validation.IsDNS1123Label(pool.Name); len(errs) > 0 {
		add("pool name %q: %s", pool.Name, strings.Join(errs, ", "))
	}
	prefix := settings.socketDirPrefix()
	if spec.SocketDir != "" && !socketDirUnder(spec.SocketDir, prefix) {
		add("spec.socketDir %q: must be %s or a directory under it, in normal form", spec.SocketDir, prefix)
	}
	if g := spec.SocketGroup; g != nil && (*g < fxv1.MinSocketGroup || *g > fxv1.MaxSocketGroup) {
		add("spec.socketGroup %d: must be a group ID between %d and %d", *g, fxv1.MinSocketGroup, fxv1.MaxSocketGroup)
	}
	mem, memErr := memoryBytes(spec.Memory)
	if memErr != nil {
		for _, e := range strings.Split(memErr.Error(), "\n") {
			add("%s", e)
		}
	}
	if r := spec.Agent.Resources; memErr == nil && mem.hostStaging > 0 && r != nil {
		// Host pool memory is shared memory charged to the agent's cgroup: a limit below it has the agent
		// killed for memory once callers borrow it (the default limit makes room for it; a given one replaces it).
		if q, ok := r.Limits[corev1.ResourceMemory]; ok && q.Value() < mem.hostStaging+agentMemoryBesidesPool {
			add("spec.agent.resources.limits.memory %s: must leave room for spec.memory.hostStaging %s, which is charged to the agent (at least %s)",
				q.String(), spec.Memory.HostStaging.String(), resource.NewQuantity(mem.hostStaging+agentMemoryBesidesPool, resource.BinarySI).String())
		}
	}
	for k, v := range spec.NodeSelector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			add("spec.nodeSelector key %q: %s", k, strings.Join(errs, ", "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			add("spec.nodeSelector[%q] value %q: %s", k, v, strings.Join(errs, ", "))
		}
	}
	if p := spec.Agent.Port; p != 0 && (p < 1024 || p > 65533) {
		add("spec.agent.port %d: must be between 1024 and 65533 (the agent also listens on port+1 and port+2)", p)
	}
	if r := spec.Agent.Resources; r != nil {
		for _, list := range []struct {
			name string
			m    map[string]resource.Quantity
		}{{"requests", toMap(r.Requests)}, {"limits", toMap(r.Limits)}} {
			for name, q := range list.m {
				switch name {
				case "cpu", "ephemeral-storage":
				case "memory":
					if _, err := byteCount("spec.agent.resources."+list.name+".memory", &q, fxv1.MinAgentMemoryBytes, fxv1.MaxAgentMemoryBytes, false); err != nil {
						add("%v", err)
					}
				default:
					add("spec.agent.resources.%s names %q: only cpu, memory and ephemeral-storage", list.name, name)
				}
			}
		}
		if len(r.Claims) > 0 {
			add("spec.agent.resources.claims: not supported, the agent's devices come from the host")
		}
	}
	image := spec.Agent.Image
	notAllowed := !imageAllowed(image, settings)
	if notAllowed {
		add("spec.agent.image %q: not the operator's agent image and not on its --agent-image-allowlist; ask the cluster admin", image)
	}
	if len(problems) == 0 {
		return nil
	}
	slices.Sort(problems)
	return &InvalidPoolError{Problems: problems, ImageNotAllowed: notAllowed}
}

func toMap(l corev1.ResourceList) map[string]resource.Quantity {
	m := make(map[string]resource.Quantity, len(l))
	for k, v := range l {
		m[string(k)] = v
	}
	return m
}

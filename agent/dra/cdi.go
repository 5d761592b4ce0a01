// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// CDIKind is the CDI vendor/class of the devices a prepared claim names (fabricxfer.io/socket=<claim UID>).
const CDIKind = DriverName + "/socket"

// cdiVersion is the CDI specification version the files are written in (spec annotations need 0.6.0).
const cdiVersion = "0.6.0"

// Annotations of a claim's CDI spec: which claim it was prepared for and which devices it holds, so a restarted
// agent knows what is in use without state of its own.
const (
	annClaim   = DriverName + "/claim"
	annDevices = DriverName + "/devices"
)

// CDIDeviceID is the fully qualified CDI device a claim's containers get.
func CDIDeviceID(claim types.UID) string { return CDIKind + "=" + string(claim) }

// cdiFileName is the claim's spec file: unique per claim, so a runtime's cache never serves a stale one.
func cdiFileName(claim types.UID) string { return DriverName + "-" + string(claim) + ".json" }

// maxClaimUID is the longest claim UID taken; the API server's are UUIDs (36 characters).
const maxClaimUID = 64

// validClaimUID reports whether uid has the form of a Kubernetes UID: lowercase letters, digits and dashes,
// not starting with a dash. The kubelet's unprepare request carries the UID as sent, and it becomes part of a
// file name, so a separator or ".." must never get that far.
func validClaimUID(uid types.UID) bool {
	if len(uid) == 0 || len(uid) > maxClaimUID || uid[0] == '-' {
		return false
	}
	for _, r := range uid {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// maxSpecBytes bounds what is read of one spec file: the agent's own are under 2 KiB (128 devices), and the
// directory is shared with every other CDI writer on the node.
const maxSpecBytes = 64 << 10

// cdiStore writes and removes the CDI specs of prepared claims in one directory.
type cdiStore struct {
	dir string
	log logr.Logger
}

// path is the claim's spec file, refused for a UID that is not one or would leave the directory.
func (s cdiStore) path(claim types.UID) (string, error) {
	if !validClaimUID(claim) {
		return "", fmt.Errorf("claim UID %.80q is not a Kubernetes UID", string(claim))
	}
	p := filepath.Join(s.dir, cdiFileName(claim))
	if filepath.Dir(p) != filepath.Clean(s.dir) {
		return "", fmt.Errorf("the CDI spec of claim UID %s would be outside %s", claim, s.dir)
	}
	return p, nil
}

// write (over)writes the claim's spec atomically: the socket directory mounted at ContainerSocketDir and
// FABRICXFER_SOCKET set, for every container that names the device.
func (s cdiStore) write(claim types.UID, claimRef string, devices []string, hostSocketDir string) error {
	spec := cdispec.Spec{
		Version:     cdiVersion,
		Kind:        CDIKind,
		Annotations: map[string]string{annClaim: claimRef, annDevices: strings.Join(devices, ",")},
		Devices: []cdispec.Device{{
			Name: string(claim),
			ContainerEdits: cdispec.ContainerEdits{
				Env: []string{SocketEnv + "=" + ContainerSocket},
				// The directory, not the socket: the agent recreates its sockets when it restarts. The mount keeps
				// the directory's group and mode (the pool's socketGroup); the spec adds no group to the container,
				// so a non-root container connects only when its pod's securityContext puts it in that group.
				Mounts: []*cdispec.Mount{{HostPath: hostSocketDir, ContainerPath: ContainerSocketDir, Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"}}},
			},
		}},
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the CDI spec of claim %s: %w", claimRef, err)
	}
	path, err := s.path(claim)
	if err != nil {
		return fmt.Errorf("writing the CDI spec of claim %s: %w", claimRef, err)
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("creating the CDI directory: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, ".tmp-"+DriverName+"-*")
	if err != nil {
		return fmt.Errorf("writing the CDI spec of claim %s: %w", claimRef, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("installing %s: %w", path, err)
	}
	return nil
}

// remove deletes the claim's spec; a claim never prepared (or already unprepared) is not an error. The spec
// must be the one prepared for claimRef (namespace/name): a request naming another claim's UID leaves that
// claim's spec in place and fails.
func (s cdiStore) remove(claim types.UID, claimRef string) error {
	path, err := s.path(claim)
	if err != nil {
		return fmt.Errorf("unpreparing claim %s: %w", claimRef, err)
	}
	spec, err := readSpec(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unpreparing claim %s: %w; the file is kept", claimRef, err)
	}
	if owner := spec.Annotations[annClaim]; owner != claimRef || spec.Devices[0].Name != string(claim) {
		return fmt.Errorf("unpreparing claim %s: the CDI spec of UID %s was prepared for claim %q; the file is kept", claimRef, claim, owner)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the CDI spec of claim %s: %w", claimRef, err)
	}
	return nil
}

// readSpec reads one claim's spec from path without following a link, blocking on a FIFO or reading more than
// maxSpecBytes: anyone who writes the CDI directory can put any kind of file under one of our names.
func readSpec(path string) (*cdispec.Spec, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("reading %s: a symbolic link, not a spec", path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("reading %s: not a regular file (%s)", path, info.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > maxSpecBytes {
		return nil, fmt.Errorf("reading %s: larger than %d bytes", path, maxSpecBytes)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("reading %s: not CDI JSON: %w", path, err)
	}
	if len(spec.Devices) != 1 {
		return nil, fmt.Errorf("reading %s: %d devices, a claim's spec has one", path, len(spec.Devices))
	}
	return &spec, nil
}

// holders maps each device of a prepared claim to that claim (its UID and namespace/name), read from the specs.
// An entry that is no readable spec of ours is logged and skipped: it must not stop every claim's Prepare.
func (s cdiStore) holders() (map[string]holder, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]holder{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the CDI directory: %w", err)
	}
	out := map[string]holder{}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), DriverName+"-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		if !e.Type().IsRegular() {
			s.log.Info("skipping a CDI directory entry that is not a regular file", "name", e.Name(), "type", e.Type().String())
			continue
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		spec, err := readSpec(filepath.Join(s.dir, n))
		if err != nil {
			s.log.Info("skipping a CDI directory entry that is not a claim's spec", "name", n, "reason", err.Error())
			continue
		}
		h := holder{uid: types.UID(spec.Devices[0].Name), ref: spec.Annotations[annClaim]}
		for _, d := range strings.Split(spec.Annotations[annDevices], ",") {
			if d != "" {
				out[d] = h
			}
		}
	}
	return out, nil
}

type holder struct {
	uid types.UID
	ref string
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

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

// cdiStore writes and removes the CDI specs of prepared claims in one directory.
type cdiStore struct {
	dir string
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
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("creating the CDI directory: %w", err)
	}
	path := filepath.Join(s.dir, cdiFileName(claim))
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

// remove deletes the claim's spec; a claim never prepared (or already unprepared) is not an error.
func (s cdiStore) remove(claim types.UID) error {
	err := os.Remove(filepath.Join(s.dir, cdiFileName(claim)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the CDI spec of claim %s: %w", claim, err)
	}
	return nil
}

// holders maps each device of a prepared claim to that claim (its UID and namespace/name), read from the specs.
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
		if strings.HasPrefix(e.Name(), DriverName+"-") && strings.HasSuffix(e.Name(), ".json") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(s.dir, n))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", n, err)
		}
		var spec cdispec.Spec
		if err := json.Unmarshal(b, &spec); err != nil || len(spec.Devices) != 1 {
			continue // not one of ours after all
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

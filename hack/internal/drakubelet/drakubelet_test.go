// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package drakubelet

import (
	"os"
	"path/filepath"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestHostPathMapsThroughTheLongestMount(t *testing.T) {
	mounts := []cdispec.Mount{{HostPath: "/h/run", ContainerPath: "/run"}, {HostPath: "/h/fx", ContainerPath: "/run/fabricxfer"}}
	for in, want := range map[string]string{
		"/run/fabricxfer/agent.sock": "/h/fx/agent.sock",
		"/run/fabricxfer":            "/h/fx",
		"/run/other":                 "/h/run/other",
		"/run/fabricxferx":           "/h/run/fabricxferx",
		"/etc/x":                     "/etc/x",
	} {
		if got := HostPath(in, mounts); got != want {
			t.Errorf("HostPath(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestEditsOfTheNamedDevicesOnly(t *testing.T) {
	dir := t.TempDir()
	spec := `{"cdiVersion":"0.6.0","kind":"fabricxfer.io/socket","devices":[{"name":"u1","containerEdits":{"env":["FABRICXFER_SOCKET=/run/fabricxfer/agent.sock"],"mounts":[{"hostPath":"/var/run/fabricxfer/kv","containerPath":"/run/fabricxfer"}]}}]}`
	other := `{"cdiVersion":"0.6.0","kind":"fabricxfer.io/socket","devices":[{"name":"u2","containerEdits":{"env":["X=1"]}}]}`
	for n, s := range map[string]string{"a.json": spec, "b.json": other} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env, mounts, err := Edits(dir, []string{"fabricxfer.io/socket=u1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(env) != 1 || env[0] != "FABRICXFER_SOCKET=/run/fabricxfer/agent.sock" || len(mounts) != 1 || mounts[0].HostPath != "/var/run/fabricxfer/kv" {
		t.Fatalf("edits %v %v", env, mounts)
	}
	if _, _, err := Edits(dir, []string{"fabricxfer.io/socket=missing"}); err == nil {
		t.Fatal("a device without a spec was accepted")
	}
}

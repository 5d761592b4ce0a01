// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestAmd64ImagesRunVersionUnpacked builds both amd64 images, writes them as make images does, reads the
// tarballs back, unpacks each filesystem and runs its entrypoint's `version` inside it: the operator's static
// binary directly, the agent's through the loader and glibc of the unpacked root (nothing of the host's), as a
// container runtime would after chroot.
func TestAmd64ImagesRunVersionUnpacked(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	const version = "v9.8.7-test"
	written, notes, err := Run(ctx, RunOptions{
		Options:  Options{Root: root, Version: version, WorkDir: filepath.Join(out, ".build"), Epoch: time.Unix(1700000000, 0).UTC()},
		OutDir:   out,
		Registry: "example.test/fabricxfer",
		Arches:   []string{"amd64"},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(notes) != 0 {
		t.Fatalf("amd64 left something out: %v", notes)
	}
	if len(written) != 4 {
		t.Fatalf("written %v, want a tarball and a layout per component", written)
	}
	for _, c := range []Component{Operator(), Agent()} {
		t.Run(c.Name, func(t *testing.T) {
			img, err := tarball.ImageFromPath(filepath.Join(out, c.Name+"-linux-amd64.tar"), nil)
			if err != nil {
				t.Fatalf("reading the tarball: %v", err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Architecture != "amd64" || cf.OS != "linux" || cf.Config.User != c.User ||
				len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != BinaryPath(c) ||
				cf.Config.Labels["org.opencontainers.image.version"] != version || !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
				t.Fatalf("config: %+v %+v", cf, cf.Config)
			}
			idx, err := layout.ImageIndexFromPath(filepath.Join(out, c.Name))
			if err != nil {
				t.Fatalf("reading the OCI layout: %v", err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != "amd64" {
				t.Fatalf("layout index %+v, want one linux/amd64 manifest", im.Manifests)
			}

			rootfs := t.TempDir()
			if err := Unpack(img, rootfs); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(rootfs, BinaryPath(c))
			var cmd *exec.Cmd
			if c.Cgo {
				loader := filepath.Join(rootfs, Amd64().Interp)
				libs := filepath.Join(rootfs, "lib", Amd64().Triplet)
				// --inhibit-cache: the host's ld.so.cache must not hand out the host's libraries.
				cmd = exec.CommandContext(ctx, loader, "--inhibit-cache", "--library-path", libs, bin, "version")
				if _, err := os.Stat(filepath.Join(libs, "libc.so.6")); err != nil {
					t.Fatalf("the agent image carries no libc: %v", err)
				}
			} else {
				cmd = exec.CommandContext(ctx, bin, "version")
			}
			cmd.Env = []string{"PATH=/usr/local/bin"}
			b, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s version in the unpacked image: %v\n%s", c.Name, err, b)
			}
			if got := strings.TrimSpace(string(b)); got != version {
				t.Fatalf("%s version printed %q, want %q", c.Name, got, version)
			}
			passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
			if err != nil || !strings.Contains(string(passwd), "nonroot:x:65532:65532") {
				t.Fatalf("/etc/passwd of the image: %q, %v", passwd, err)
			}
		})
	}
}

// TestCheckELFRefusesAMismatchedBinary: a static image refuses a binary that needs a loader, a cgo image one
// built for another architecture.
func TestCheckELFRefusesAMismatchedBinary(t *testing.T) {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	// The test binary is dynamically linked when cgo is on, which it is for go-nvml's sake.
	if err := checkELF(self, Agent(), Arm64()); err == nil || !strings.Contains(err.Error(), "built for") {
		t.Fatalf("an amd64 binary for an arm64 image: %v", err)
	}
	if err := checkELF([]byte("not elf"), Operator(), Amd64()); err == nil {
		t.Fatal("garbage accepted as a binary")
	}
}

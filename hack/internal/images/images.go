// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package images

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the uid and gid images run as where they can (distroless' "nonroot").
const NonRoot = 65532

// Component is one binary shipped as an image.
type Component struct {
	// Name is the image's short name (operator, agent) and the binary's name inside it.
	Name string
	// Package is the Go package of the binary (./cmd/operator).
	Package string
	// Cgo builds with cgo and puts the target's glibc (loader, libc and the libraries dlopen'ed GPU and verbs
	// libraries need) into the image; without it the binary is static.
	Cgo bool
	// User is the image's user ("65532:65532"; "0:0" for the agent, which needs its host's devices).
	User string
	// Env is the image's environment.
	Env []string
}

// Operator is the operator's image: a static binary, run as nonroot.
func Operator() Component {
	return Component{Name: "operator", Package: "./cmd/operator", User: fmt.Sprintf("%d:%d", NonRoot, NonRoot)}
}

// Agent is the agent's image: cgo (go-nvml) on glibc, run as root (its DaemonSet is privileged for the
// host's GPU and verbs devices).
func Agent() Component {
	return Component{
		Name: "agent", Package: "./cmd/agent", Cgo: true, User: "0:0",
		Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "LD_LIBRARY_PATH=/opt/rocm/lib"},
	}
}

// Arch is one target architecture and where its glibc comes from.
type Arch struct {
	// GOARCH and the OCI architecture name (the same for amd64 and arm64).
	GOARCH string
	// CC is the C compiler for cgo builds (gcc, aarch64-linux-gnu-gcc).
	CC string
	// Triplet is the Debian multiarch directory name (x86_64-linux-gnu).
	Triplet string
	// Interp is the ELF interpreter path inside the image (/lib64/ld-linux-x86-64.so.2).
	Interp string
	// LibDirs are the host folders searched for this architecture's glibc files, in order.
	LibDirs []string
}

// Amd64 takes glibc from the build host (a Debian amd64 machine).
func Amd64() Arch {
	return Arch{GOARCH: "amd64", CC: "gcc", Triplet: "x86_64-linux-gnu", Interp: "/lib64/ld-linux-x86-64.so.2",
		LibDirs: []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64"}}
}

// Arm64 takes glibc from Debian's cross toolchain (gcc-aarch64-linux-gnu brings libc6-arm64-cross).
func Arm64() Arch {
	return Arch{GOARCH: "arm64", CC: "aarch64-linux-gnu-gcc", Triplet: "aarch64-linux-gnu", Interp: "/lib/ld-linux-aarch64.so.1",
		LibDirs: []string{"/usr/aarch64-linux-gnu/lib", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"}}
}

// glibcFiles are the shared objects a cgo image carries besides the loader: libc, and what the libraries the
// agent dlopens at run time (NVML, the CUDA driver, NVRTC, libibverbs, HIP) link against.
func glibcFiles() []string {
	return []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2", "libgcc_s.so.1"}
}

// BinaryPath is where a component's binary lies in its image.
func BinaryPath(c Component) string { return "/usr/local/bin/" + c.Name }

// Options is one build.
type Options struct {
	// Root is the repository root (go build runs there).
	Root string
	// Version is written into the binaries (main.version) and the image label.
	Version string
	// WorkDir holds the built binaries.
	WorkDir string
	// Epoch is every file's and the image's timestamp, so a build is reproducible (SOURCE_DATE_EPOCH).
	Epoch time.Time
}

// BuildBinary compiles c for arch into WorkDir and returns its path.
func BuildBinary(ctx context.Context, o Options, c Component, arch Arch) (string, error) {
	out := filepath.Join(o.WorkDir, c.Name+"-linux-"+arch.GOARCH)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+o.Version, "-o", out, c.Package)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch.GOARCH, "GOFLAGS=-mod=readonly")
	if c.Cgo {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1", "CC="+arch.CC, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	} else {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s for linux/%s: %w\n%s", c.Name, arch.GOARCH, err, b)
	}
	return out, nil
}

// fileEntry is one file of a layer.
type fileEntry struct {
	path string // inside the image, absolute
	mode int64
	data []byte
	link string // symlink target when set
	dir  bool
}

// Image builds c's image for arch from a binary built by BuildBinary.
func Image(o Options, c Component, arch Arch, binary string) (v1.Image, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", binary, err)
	}
	if err := checkELF(bin, c, arch); err != nil {
		return nil, fmt.Errorf("%s: %w", binary, err)
	}
	base := []fileEntry{
		{path: "/etc", dir: true, mode: 0o755},
		{path: "/etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot))},
		{path: "/etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRoot))},
		{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")},
		{path: "/tmp", dir: true, mode: 0o1777},
		{path: "/home", dir: true, mode: 0o755},
		{path: "/home/nonroot", dir: true, mode: 0o700},
	}
	if c.Cgo {
		libs, err := glibc(arch)
		if err != nil {
			return nil, err
		}
		base = append(base, libs...)
	}
	baseLayer, err := layer(o.Epoch, base)
	if err != nil {
		return nil, err
	}
	binLayer, err := layer(o.Epoch, []fileEntry{
		{path: "/usr", dir: true, mode: 0o755}, {path: "/usr/local", dir: true, mode: 0o755},
		{path: "/usr/local/bin", dir: true, mode: 0o755},
		{path: BinaryPath(c), mode: 0o755, data: bin},
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, baseLayer, binLayer)
	if err != nil {
		return nil, fmt.Errorf("adding layers: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch.GOARCH, v1.Time{Time: o.Epoch}
	cf.Config.Entrypoint = []string{BinaryPath(c)}
	cf.Config.User = c.User
	cf.Config.WorkingDir = "/"
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, c.Env...)
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "fabricxfer-" + c.Name,
		"org.opencontainers.image.source":   "https://github.com/fabricxfer/fabricxfer",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("writing the config: %w", err)
	}
	return img, nil
}

// checkELF refuses a binary of the wrong architecture, and a static image whose binary needs a loader.
func checkELF(bin []byte, c Component, arch Arch) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF binary: %w", err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch.GOARCH]
	if f.Machine != want {
		return fmt.Errorf("built for %s, want %s", f.Machine, want)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return fmt.Errorf("reading PT_INTERP: %w", err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	switch {
	case !c.Cgo && interp != "":
		return fmt.Errorf("static image, but the binary asks for the loader %s", interp)
	case c.Cgo && interp != arch.Interp:
		return fmt.Errorf("the binary asks for the loader %q, the image carries %s", interp, arch.Interp)
	}
	return nil
}

// glibc collects the loader and glibcFiles of arch from the host, under the Debian layout.
func glibc(arch Arch) ([]fileEntry, error) {
	libDir := "/lib/" + arch.Triplet
	files := []fileEntry{{path: "/lib", dir: true, mode: 0o755}, {path: libDir, dir: true, mode: 0o755}}
	find := func(soname string) ([]byte, error) {
		var tried []string
		for _, d := range arch.LibDirs {
			p := filepath.Join(d, soname)
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				tried = append(tried, p)
				continue
			}
			b, err := os.ReadFile(real)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", real, err)
			}
			return b, nil
		}
		return nil, fmt.Errorf("%s for %s not found (tried %s): install Debian's %s", soname, arch.GOARCH,
			strings.Join(tried, ", "), map[string]string{"amd64": "libc6", "arm64": "libc6-arm64-cross libgcc-s1-arm64-cross"}[arch.GOARCH])
	}
	loaderName := filepath.Base(arch.Interp)
	loader, err := find(loaderName)
	if err != nil {
		return nil, err
	}
	files = append(files, fileEntry{path: libDir + "/" + loaderName, mode: 0o755, data: loader})
	if dir := filepath.Dir(arch.Interp); dir != "/lib" {
		files = append(files, fileEntry{path: dir, dir: true, mode: 0o755})
	}
	if arch.Interp != libDir+"/"+loaderName {
		files = append(files, fileEntry{path: arch.Interp, link: libDir + "/" + loaderName})
	}
	for _, so := range glibcFiles() {
		b, err := find(so)
		if err != nil {
			return nil, err
		}
		files = append(files, fileEntry{path: libDir + "/" + so, mode: 0o644, data: b})
	}
	return files, nil
}

// layer writes entries into one gzip'ed tar layer, in path order, owned by root, stamped with epoch.
func layer(epoch time.Time, entries []fileEntry) (v1.Layer, error) {
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: strings.TrimPrefix(e.path, "/"), Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", e.path, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", e.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}
	return l, nil
}

// Built is one component's images, one per architecture.
type Built struct {
	Component Component
	Images    map[string]v1.Image // by GOARCH
}

// Write lays a component's images out under dir: an OCI image layout dir/<name> whose index holds every
// architecture (crane push --index), and one tarball per architecture, dir/<name>-linux-<arch>.tar, that
// crane push and docker load read. repo is the reference written into the tarballs (ghcr.io/fabricxfer/agent).
func Write(dir, repo, version string, b Built) ([]string, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	arches := make([]string, 0, len(b.Images))
	for a := range b.Images {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	var written []string
	for _, a := range arches {
		img := b.Images[a]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: a}}})
		tag, err := name.NewTag(repo + ":" + version)
		if err != nil {
			return nil, fmt.Errorf("image reference %s:%s: %w", repo, version, err)
		}
		p := filepath.Join(dir, b.Component.Name+"-linux-"+a+".tar")
		if err := tarball.WriteToFile(p, tag, img); err != nil {
			return nil, fmt.Errorf("writing %s: %w", p, err)
		}
		written = append(written, p)
	}
	lp := filepath.Join(dir, b.Component.Name)
	if err := os.RemoveAll(lp); err != nil {
		return nil, fmt.Errorf("clearing %s: %w", lp, err)
	}
	if _, err := layout.Write(lp, idx); err != nil {
		return nil, fmt.Errorf("writing the OCI layout %s: %w", lp, err)
	}
	return append(written, lp), nil
}

// Unpack writes img's flattened filesystem under root (regular files, folders and symlinks; symlinks may not
// leave root), as a container runtime would before starting it.
func Unpack(img v1.Image, root string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the image's filesystem: %w", err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
			target := h.Linkname
			if filepath.IsAbs(target) {
				target = filepath.Join(root, target)
			}
			if err := os.Symlink(target, p); err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777|0o200)
			if err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("unpacking %s: %w", h.Name, err)
			}
		}
	}
}

// RunOptions is what make images asks for.
type RunOptions struct {
	Options
	// OutDir receives the layouts and tarballs.
	OutDir string
	// Registry prefixes the image names in the tarballs (ghcr.io/fabricxfer).
	Registry string
	// Arches to build (amd64, arm64).
	Arches []string
}

// Run builds every component for every architecture asked for and writes them under OutDir. A cgo component
// whose cross compiler is missing is left out for that architecture, and the returned notes say so.
func Run(ctx context.Context, o RunOptions) (written, notes []string, err error) {
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating %s: %w", o.OutDir, err)
	}
	if o.WorkDir == "" {
		o.WorkDir = filepath.Join(o.OutDir, ".build")
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating %s: %w", o.WorkDir, err)
	}
	arches := map[string]Arch{"amd64": Amd64(), "arm64": Arm64()}
	for _, c := range []Component{Operator(), Agent()} {
		b := Built{Component: c, Images: map[string]v1.Image{}}
		for _, a := range o.Arches {
			arch, ok := arches[a]
			if !ok {
				return nil, nil, fmt.Errorf("unknown architecture %q (want amd64 or arm64)", a)
			}
			if c.Cgo {
				if _, err := exec.LookPath(arch.CC); err != nil {
					notes = append(notes, fmt.Sprintf("%s for linux/%s left out: %s not found (Debian: apt-get install gcc-aarch64-linux-gnu)", c.Name, a, arch.CC))
					continue
				}
			}
			bin, err := BuildBinary(ctx, o.Options, c, arch)
			if err != nil {
				return nil, nil, err
			}
			img, err := Image(o.Options, c, arch, bin)
			if err != nil {
				return nil, nil, fmt.Errorf("%s for linux/%s: %w", c.Name, a, err)
			}
			b.Images[a] = img
		}
		if len(b.Images) == 0 {
			continue
		}
		w, err := Write(o.OutDir, o.Registry+"/"+c.Name, o.Version, b)
		if err != nil {
			return nil, nil, err
		}
		written = append(written, w...)
	}
	return written, notes, nil
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Host is the read-only view of a node's /sys, /proc and /dev the detector works from. Paths are absolute
// paths as seen on the node ("/sys/class/infiniband"); an implementation maps them under its root.
type Host interface {
	// ReadFile returns a file's contents.
	ReadFile(name string) ([]byte, error)
	// ReadDir returns the names in a directory, sorted.
	ReadDir(name string) ([]string, error)
	// Realpath resolves every symbolic link in name, keeping the result inside the host root, and returns
	// it as a node-absolute path.
	Realpath(name string) (string, error)
}

// DirHost is a Host whose node "/" is the directory Root ("/" on a real node, "/host" when the host's root
// is mounted into a container, a fixture tree in tests).
type DirHost struct {
	Root string
}

// NewDirHost returns a Host rooted at root, which must be an existing directory.
func NewDirHost(root string) (DirHost, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return DirHost{}, fmt.Errorf("resolving host root %q: %w", root, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return DirHost{}, fmt.Errorf("opening host root: %w", err)
	}
	if !st.IsDir() {
		return DirHost{}, fmt.Errorf("host root %q is not a directory", root)
	}
	return DirHost{Root: abs}, nil
}

func (h DirHost) onDisk(name string) string {
	return filepath.Join(h.Root, filepath.FromSlash(path.Clean("/"+name)))
}

// ReadFile reads a file under the root. It calls open/read/close directly: os.ReadFile also registers the
// descriptor with the runtime poller and stats the file, which doubles the system calls for the hundreds
// of small sysfs attributes one detection reads.
func (h DirHost) ReadFile(name string) ([]byte, error) {
	p := h.onDisk(name)
	var fd int
	var err error
	for {
		fd, err = syscall.Open(p, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer syscall.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: p, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// ReadDir lists a directory under the root.
func (h DirHost) ReadDir(name string) ([]string, error) {
	entries, err := os.ReadDir(h.onDisk(name))
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// maxLinkHops bounds symlink resolution, as the kernel's ELOOP limit does.
const maxLinkHops = 40

// Realpath resolves links one component at a time. An absolute link target is taken relative to the root,
// not to the agent's own filesystem, so a host root mounted at /host resolves like the host would.
func (h DirHost) Realpath(name string) (string, error) {
	pending := strings.Split(strings.Trim(path.Clean("/"+name), "/"), "/")
	resolved := "/"
	hops := 0
	for len(pending) > 0 {
		part := pending[0]
		pending = pending[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, part)
		st, err := os.Lstat(h.onDisk(next))
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		hops++
		if hops > maxLinkHops {
			return "", &fs.PathError{Op: "realpath", Path: name, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(h.onDisk(next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			resolved = "/"
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return resolved, nil
}

// whyUnreadable turns a read error into the reason a report carries. Permission errors mean the agent
// cannot see the fact (a device cgroup, a missing mount), which is different from the fact being absent.
func whyUnreadable(what string, err error) string {
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("not visible: %s: permission denied", what)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("%s: absent", what)
	default:
		return fmt.Sprintf("%s: %v", what, unwrapPathError(err))
	}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// readTrimmed reads a one-line sysfs attribute.
func readTrimmed(h Host, name string) (string, error) {
	b, err := h.ReadFile(name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

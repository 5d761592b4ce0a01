// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// parseKeyValues parses KFD "properties" files: one "key value" per line, values unsigned decimal. Lines that
// do not parse are skipped (older and newer kernels differ in keys), so a key's absence means "not read".
func parseKeyValues(b []byte) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		out[fields[0]] = v
	}
	return out
}

// amdVendorID is PCI vendor 0x1002 as KFD prints it.
const amdVendorID = 4098

// kfdIsGPU applies ROCm's rule for a KFD node that is an AMD GPU (or GPU partition): a GPU id (from the
// node's gpu_id file), AMD's vendor id and a render node.
func kfdIsGPU(gpuID uint64, p map[string]uint64) bool {
	return gpuID != 0 && p["vendor_id"] == amdVendorID && p["drm_render_minor"] >= 128
}

// bdfFromLocation turns KFD's location_id (bus<<8 | dev<<3 | fn, with partition bits in fn or the top
// nibble depending on the kernel) into a PCI bus id. The function is always 0: partitions are not
// separate functions, and the low bits are not reliably the function.
func bdfFromLocation(domain, location uint64) (string, error) {
	if domain > 0xffff {
		return "", fmt.Errorf("PCI domain %d out of range", domain)
	}
	bus := (location >> 8) & 0xff
	dev := (location >> 3) & 0x1f
	return fmt.Sprintf("%04x:%02x:%02x.0", domain, bus, dev), nil
}

// parsePortState parses an InfiniBand port state ("4: ACTIVE") into its name ("ACTIVE").
func parsePortState(s string) (string, error) {
	num, name, ok := strings.Cut(strings.TrimSpace(s), ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return "", fmt.Errorf("port state %q: want \"<n>: <NAME>\"", clip(s))
	}
	if _, err := strconv.Atoi(strings.TrimSpace(num)); err != nil {
		return "", fmt.Errorf("port state %q: want \"<n>: <NAME>\"", clip(s))
	}
	for _, r := range name {
		if !(r >= 'A' && r <= 'Z' || r == '_') {
			return "", fmt.Errorf("port state %q: unexpected name", clip(s))
		}
	}
	return name, nil
}

// parseLinkLayer accepts the kernel's three link-layer names.
func parseLinkLayer(s string) (string, error) {
	switch s = strings.TrimSpace(s); s {
	case "InfiniBand", "Ethernet", "Unknown":
		return s, nil
	}
	return "", fmt.Errorf("link layer %q: want InfiniBand, Ethernet or Unknown", clip(s))
}

// parseRate parses "400 Gb/sec (4X NDR)" into whole Gb/s (fractional rates such as 2.5 round down).
func parseRate(s string) (int, error) {
	fields := strings.Fields(s)
	if len(fields) < 2 || fields[1] != "Gb/sec" {
		return 0, fmt.Errorf("rate %q: want \"<n> Gb/sec ...\"", clip(s))
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || v < 0 || v > 1e6 {
		return 0, fmt.Errorf("rate %q: want \"<n> Gb/sec ...\"", clip(s))
	}
	return int(v), nil
}

// parseGID parses a GID as sysfs prints it (eight groups of four hex digits).
func parseGID(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if strings.Count(s, ":") != 7 || len(s) != 39 {
		return netip.Addr{}, fmt.Errorf("GID %q: want 8 groups of 4 hex digits", clip(s))
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return netip.Addr{}, fmt.Errorf("GID %q: %v", clip(s), err)
	}
	return a, nil
}

// gidRoutable is true for a populated GID that is not link-local (RoCE v2 needs a routable address).
func gidRoutable(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsLinkLocalUnicast()
}

// parseNUMANode parses a PCI numa_node ("-1" when the platform does not say).
func parseNUMANode(s string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < -1 || v > 1<<16 {
		return 0, fmt.Errorf("numa_node %q: want an integer >= -1", clip(s))
	}
	return v, nil
}

// parseHex parses sysfs hex attributes ("0x10de", "0x120000").
func parseHex(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "0x") {
		return 0, fmt.Errorf("%q: want 0x-prefixed hex", clip(s))
	}
	return strconv.ParseUint(s[2:], 16, 32)
}

// canonicalBDF checks a PCI bus id and returns it as dddd:bb:dd.f in lowercase. NVML prints an 8-digit
// domain ("00000000:1B:00.0"); the kernel prints 4.
func canonicalBDF(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", fmt.Errorf("PCI bus id %q: want dddd:bb:dd.f", clip(s))
	}
	var bus, dev, fn uint64
	var err error
	parts := strings.Split(rest, ":")
	if len(parts) != 2 {
		return "", fmt.Errorf("PCI bus id %q: want dddd:bb:dd.f", clip(s))
	}
	devFn := strings.Split(parts[1], ".")
	if len(devFn) != 2 || len(parts[0]) != 2 || len(devFn[0]) != 2 || len(devFn[1]) != 1 || len(dom) < 4 || len(dom) > 8 {
		return "", fmt.Errorf("PCI bus id %q: want dddd:bb:dd.f", clip(s))
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err == nil {
		bus, err = strconv.ParseUint(parts[0], 16, 8)
	}
	if err == nil {
		dev, err = strconv.ParseUint(devFn[0], 16, 8)
	}
	if err == nil {
		fn, err = strconv.ParseUint(devFn[1], 16, 8)
	}
	if err != nil || d > 0xffff || dev > 0x1f || fn > 7 {
		return "", fmt.Errorf("PCI bus id %q: want dddd:bb:dd.f", clip(s))
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, bus, dev, fn), nil
}

// ualinkLinkTypes are the link_type spellings seen in the kernel patches and in mori/RCCL.
var ualinkLinkTypes = map[string]bool{"ualink": true, "ualoe": true, "uallink": true}

// ualinkUsableStates are accel_state values in which the GPU's vPOD is set up.
var ualinkUsableStates = map[string]bool{"ready": true, "active": true}

// vpodUnset is the vpod_id the firmware reports before the first query.
const vpodUnset = 0xffffffff

// MaxDomainSize bounds the GPUs a domain's reported size may claim (the TransferNode field's bound).
const MaxDomainSize = 1 << 16

// ualinkSize parses vpod_size: the accelerators of the vPOD, 1 to MaxDomainSize.
func ualinkSize(raw string) (int, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(raw), 10, 32)
	if err != nil || n == 0 || n > MaxDomainSize {
		return 0, fmt.Errorf("vpod_size %q ignored: want 1 to %d", clip(raw), MaxDomainSize)
	}
	return int(n), nil
}

// ualinkKey builds the domain key from ppod_id and vpod_id, or says why the pair names no vPOD. The ppod id
// is a 128-bit value the kernel prints as a UUID (%pU); some tools print it as 0x-prefixed hex, so both are
// accepted and written as the lowercase UUID.
func ualinkKey(ppodRaw, vpodRaw string) (string, error) {
	ppod, err := normalizePPodID(ppodRaw)
	if err != nil {
		return "", err
	}
	vpod, err := strconv.ParseUint(strings.TrimSpace(vpodRaw), 10, 32)
	if err != nil {
		return "", fmt.Errorf("vpod_id %q: want an unsigned integer", clip(vpodRaw))
	}
	switch vpod {
	case 0:
		return "", fmt.Errorf("vpod_id 0: not part of any vPOD")
	case vpodUnset:
		return "", fmt.Errorf("vpod_id 0xffffffff: not configured yet")
	}
	return fmt.Sprintf("%s:%s/%d", FabricUALink, ppod, vpod), nil
}

func normalizePPodID(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	digits := s
	switch {
	case strings.HasPrefix(s, "0x"):
		digits = s[2:]
		if len(digits) == 0 || len(digits) > 32 {
			return "", fmt.Errorf("ppod_id %q: want a UUID or up to 32 hex digits", clip(s))
		}
		digits = strings.Repeat("0", 32-len(digits)) + digits
	case len(s) == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-':
		digits = strings.ReplaceAll(s, "-", "")
	default:
		return "", fmt.Errorf("ppod_id %q: want a UUID or 0x-prefixed hex", clip(s))
	}
	raw, err := hex.DecodeString(digits)
	if err != nil || len(raw) != 16 {
		return "", fmt.Errorf("ppod_id %q: want a UUID or 0x-prefixed hex", clip(s))
	}
	if bytes.Equal(raw, make([]byte, 16)) {
		return "", fmt.Errorf("ppod_id is zero: no pPOD configured")
	}
	return formatUUID(raw), nil
}

func formatUUID(b []byte) string {
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// parseKeyColon parses "Key: value" files such as /proc/driver/nvidia/gpus/<bdf>/information.
func parseKeyColon(b []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			continue
		}
		out[k] = strings.TrimSpace(v)
	}
	return out
}

// parseCharDevices returns the character-device majors listed in /proc/devices, by name.
func parseCharDevices(b []byte) map[string]int {
	out := map[string]int{}
	inChar := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch line {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		if !inChar {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			continue
		}
		major, err := strconv.Atoi(fields[0])
		if err != nil || major < 0 {
			continue
		}
		out[fields[1]] = major
	}
	return out
}

// clip keeps quoted garbage in error messages short.
func clip(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"encoding/binary"
	"fmt"
)

// The descriptor wire format, exchanged between agents. Big-endian, fields in a fixed order, strings and byte
// strings length-prefixed, no optional trailing data. The encoding is canonical: every byte string the decoder
// accepts re-encodes to itself, so two agents agree on a descriptor's bytes.
//
//	"FXMD" version(1)
//	id(u16 len) node(u16 len) kind(u8) device(u16) vendor(u8 len) busID(u8 len) size(u64) domain(u16 len)
//	ipc(u8 len: 0 or 64) ipcOffset(u64)
//	fabric(u8: 0 absent, 1 present) [token(64) offset(u64) allocSize(u64)]
//	rdmaCount(u8) {device(u8 len) addr(u64) rkey(u32)}...
//	tcp(u8 len)
const (
	wireMagic   = "FXMD"
	wireVersion = 1
	// MaxDescWireSize bounds an encoded descriptor.
	MaxDescWireSize = 4096
)

// MarshalDesc encodes a descriptor for another node. Process-local handles (Ptr, Host, VMM) are not encoded.
func MarshalDesc(d MemoryDesc) ([]byte, error) {
	r := d.Remote()
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("encoding memory descriptor: %w", err)
	}
	b := make([]byte, 0, 256)
	b = append(b, wireMagic...)
	b = append(b, wireVersion)
	b = putString16(b, string(r.ID))
	b = putString16(b, r.Node)
	b = append(b, byte(r.Location.Kind))
	b = binary.BigEndian.AppendUint16(b, uint16(r.Location.Device))
	b = putString8(b, string(r.Location.Vendor))
	b = putString8(b, r.Location.BusID)
	b = binary.BigEndian.AppendUint64(b, r.Size)
	b = putString16(b, r.FabricDomain)
	b = putString8(b, string(r.Handles.IPC))
	b = binary.BigEndian.AppendUint64(b, r.Handles.IPCOffset)
	if f := r.Handles.Fabric; f != nil {
		b = append(b, 1)
		b = append(b, f.Token[:]...)
		b = binary.BigEndian.AppendUint64(b, f.Offset)
		b = binary.BigEndian.AppendUint64(b, f.AllocSize)
	} else {
		b = append(b, 0)
	}
	b = append(b, byte(len(r.Handles.RDMA)))
	for _, k := range r.Handles.RDMA {
		b = putString8(b, k.Device)
		b = binary.BigEndian.AppendUint64(b, k.Addr)
		b = binary.BigEndian.AppendUint32(b, k.RKey)
	}
	b = putString8(b, r.Handles.TCP)
	if len(b) > MaxDescWireSize {
		return nil, fmt.Errorf("encoding memory descriptor %s: %w: %d bytes, at most %d", r.ID, ErrInvalid, len(b), MaxDescWireSize)
	}
	return b, nil
}

// UnmarshalDesc decodes and validates a descriptor produced by MarshalDesc. It rejects unknown versions,
// truncated or trailing bytes, non-canonical encodings and any descriptor Validate rejects.
func UnmarshalDesc(b []byte) (MemoryDesc, error) {
	var d MemoryDesc
	if len(b) > MaxDescWireSize {
		return d, fmt.Errorf("decoding memory descriptor: %w: %d bytes, at most %d", ErrInvalid, len(b), MaxDescWireSize)
	}
	r := wireReader{b: b}
	if string(r.bytes(len(wireMagic))) != wireMagic {
		return d, fmt.Errorf("decoding memory descriptor: %w: bad magic", ErrInvalid)
	}
	if v := r.u8(); v != wireVersion && r.err == nil {
		return d, fmt.Errorf("decoding memory descriptor: %w: version %d, this build reads %d", ErrInvalid, v, wireVersion)
	}
	d.ID = MemoryID(r.string16())
	d.Node = r.string16()
	d.Location.Kind = LocationKind(r.u8())
	d.Location.Device = int(r.u16())
	d.Location.Vendor = Vendor(r.string8())
	d.Location.BusID = r.string8()
	d.Size = r.u64()
	d.FabricDomain = r.string16()
	if ipc := r.string8(); ipc != "" {
		d.Handles.IPC = []byte(ipc)
	}
	d.Handles.IPCOffset = r.u64()
	switch r.u8() {
	case 0:
	case 1:
		f := &FabricHandle{}
		copy(f.Token[:], r.bytes(FabricTokenSize))
		f.Offset = r.u64()
		f.AllocSize = r.u64()
		d.Handles.Fabric = f
	default:
		r.fail("fabric presence flag not 0 or 1")
	}
	if n := int(r.u8()); n > 0 && r.err == nil {
		if n > maxRDMAKeys {
			return MemoryDesc{}, fmt.Errorf("decoding memory descriptor: %w: %d RDMA keys, at most %d", ErrInvalid, n, maxRDMAKeys)
		}
		d.Handles.RDMA = make([]RDMAKey, n)
		for i := range d.Handles.RDMA {
			d.Handles.RDMA[i] = RDMAKey{Device: r.string8(), Addr: r.u64(), RKey: r.u32()}
		}
	}
	d.Handles.TCP = r.string8()
	if r.err != nil {
		return MemoryDesc{}, fmt.Errorf("decoding memory descriptor: %w: %v", ErrInvalid, r.err)
	}
	if r.off != len(b) {
		return MemoryDesc{}, fmt.Errorf("decoding memory descriptor: %w: %d trailing bytes", ErrInvalid, len(b)-r.off)
	}
	if err := d.Validate(); err != nil {
		return MemoryDesc{}, fmt.Errorf("decoding memory descriptor: %w", err)
	}
	return d, nil
}

func putString16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func putString8(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// wireReader reads fields until the first error, then returns zero values.
type wireReader struct {
	b   []byte
	off int
	err error
}

func (r *wireReader) fail(msg string) {
	if r.err == nil {
		r.err = fmt.Errorf("at byte %d: %s", r.off, msg)
	}
}

func (r *wireReader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail("truncated")
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *wireReader) u8() uint8 {
	if s := r.bytes(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *wireReader) u16() uint16 {
	if s := r.bytes(2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *wireReader) u32() uint32 {
	if s := r.bytes(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *wireReader) u64() uint64 {
	if s := r.bytes(8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}

func (r *wireReader) string8() string  { return string(r.bytes(int(r.u8()))) }
func (r *wireReader) string16() string { return string(r.bytes(int(r.u16()))) }

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// IDsFromArena points req's id lists at the connection's arena. The ids are copied out before anything checks
// them (DecodeBlockIDs), so a caller rewriting the arena meanwhile changes nothing it was not allowed to.
func IDsFromArena(req *agentv1.TransferBlocksRequest, arena []byte, width int) error {
	switch {
	case arena == nil:
		return status.Error(codes.InvalidArgument, "arena_ids is set but this connection has no id arena (only fast connections that set one have)")
	case len(req.LocalIds) > 0 || len(req.RemoteIds) > 0:
		return status.Error(codes.InvalidArgument, "ids are in the arena or in the request, not both")
	}
	n := uint64(req.ArenaIds) * uint64(width)
	if 2*n > uint64(len(arena)) {
		return status.Errorf(codes.InvalidArgument, "%d ids a side of %d bytes need %d bytes; the connection's id arena has %d", req.ArenaIds, width, 2*n, len(arena))
	}
	req.LocalIds, req.RemoteIds = arena[:n:n], arena[n:2*n:2*n]
	return nil
}

// DecodeBlockIDs reads packed little-endian ids of width bytes into ids. int32 ids are copied as they are (a
// negative one reads as an unsigned id of 2^31 or more); the engines check their range as they plan, or the GPU
// as it copies, once: a pass here would cost about 0.3 ns an id on every call (10 µs of a 15,360-pair call on
// the development VM), and OutsideIDs names the caller's mistake on the refusal's path instead. int64 ids must
// lie below blocks, which one branch-free pass checks as it narrows them (a torch caller's ids are int64, and a
// branch per id costs more than the copy); the entry named in a refusal is found afterwards.
func DecodeBlockIDs(ids []uint32, b []byte, width int, blocks uint64, side string) error {
	if len(ids) == 0 {
		return nil
	}
	if width == 4 {
		if littleEndian {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids)), b)
			return nil
		}
		for i := range ids {
			ids[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
		return nil
	}
	if blocks == 0 {
		return status.Errorf(codes.InvalidArgument, "%s layout has no blocks", side)
	}
	limit := min(blocks, math.MaxUint32+1) - 1
	var over uint64
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		wide := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(ids))
		for i, v := range wide {
			over |= (limit - v) >> 63 // v > limit: the subtraction wraps and sets the top bit (v < 2^63)
			over |= v >> 63
			ids[i] = uint32(v)
		}
	} else {
		for i := range ids {
			v := binary.LittleEndian.Uint64(b[8*i:])
			over |= (limit-v)>>63 | v>>63
			ids[i] = uint32(v)
		}
	}
	if over == 0 {
		return nil
	}
	for i := range ids {
		if v := binary.LittleEndian.Uint64(b[8*i:]); v > limit {
			return outside(side, v, width, i, blocks)
		}
	}
	// The ids changed between the two reads (shared memory the caller rewrites): refuse what the first read saw.
	return status.Errorf(codes.InvalidArgument, "%s block ids include one outside the layout's %d blocks", side, blocks)
}

// OutsideIDs refuses, in the caller's words, the first of ids (decoded from ids of width bytes) at or past
// blocks, the layout's block count, or returns nil: what a block transfer the engines refused as out of bounds
// says, naming the side, the id as sent, its entry and the count.
func OutsideIDs(ids []uint32, blocks uint64, width int, side string) error {
	for i, v := range ids {
		if uint64(v) >= blocks {
			return outside(side, uint64(v), width, i, blocks)
		}
	}
	return nil
}

// outside is the refusal of id v of the given width at entry i of a side whose layout has blocks blocks.
func outside(side string, v uint64, width, i int, blocks uint64) error {
	return status.Errorf(codes.InvalidArgument, "%s block id %s (entry %d) is outside the layout's %d blocks", side, fmtID(v, width), i, blocks)
}

// littleEndian is whether this machine stores integers as the wire does.
var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// fmtID is id v of the given width as its sender meant it: int64 ids signed; int32 ids unsigned, as the agent
// reads them, and a negative int32 (what -1 from an int32 tensor is) named as that too.
func fmtID(v uint64, width int) string {
	if width == 8 {
		return strconv.FormatInt(int64(v), 10)
	}
	if int32(v) < 0 {
		return fmt.Sprintf("%d (%d as int32)", v, int32(v))
	}
	return strconv.FormatUint(v, 10)
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// Segment is one copy between two addresses the GPU can reach (device
// memory of this or a peer GPU, imported memory, pinned or registered host
// memory), in the unified address space.
type Segment struct {
	Dst, Src uint64
	Size     uint64
}

// Layout is how a set of segments is described to the scatter kernels.
type Layout struct {
	Uniform bool
	Pieces  int
	// Uniform form: every piece is PieceSize bytes at base + (offset << Shift).
	SrcBase, DstBase uint64
	PieceSize        uint64
	Shift            uint32
	// Flat16: uniform, 16-byte aligned, launched as one flat range of vectors.
	Flat16 bool
	// Packed (a Flat16 form, items not cut): piece i's offsets from the bases,
	// in units of Unit bytes, are bits [i*(SrcBits+DstBits), ...) of a
	// little-endian stream of 32-bit words, source in the low SrcBits. A KV
	// block list indexes blocks, so Unit is the block size and the offsets
	// take 36 bits for 2^18-block pools (4.5 bytes a block to read across
	// PCIe instead of 8).
	Packed           bool
	Unit             uint64
	SrcBits, DstBits uint32
	// Unit = unitOdd << unitShift: offsets are divided by it exactly as a
	// shift and a multiplication by unitOdd's inverse modulo 2^64.
	unitShift uint32
	unitInv   uint64
}

// packedPadWords are the words after a packed stream: a piece's bits are read
// as three words from the one it starts in.
const packedPadWords = 3

// Bytes is the size of the descriptors.
func (l Layout) Bytes() int {
	if l.Packed {
		return ((l.Pieces*int(l.SrcBits+l.DstBits)+31)/32 + packedPadWords) * 4
	}
	if l.Uniform {
		return l.Pieces * kernels.UniformDescriptorSize
	}
	return l.Pieces * kernels.GeneralDescriptorSize
}

// Plan chooses the descriptor form for segs, cutting each segment into
// pieces of at most maxPiece bytes so that one warp's (wavefront's) share
// stays small and large items spread across the GPU.
func Plan(segs []Segment, maxPiece uint64) (Layout, error) {
	if maxPiece == 0 || maxPiece&(maxPiece-1) != 0 {
		return Layout{}, fmt.Errorf("piece size %d is not a power of two", maxPiece)
	}
	if len(segs) == 0 {
		return Layout{}, fmt.Errorf("no segments to describe")
	}
	pieceShift := uint(bits.TrailingZeros64(maxPiece))
	var l Layout
	// One pass: piece count, whether all sizes match, the lowest and highest
	// addresses, and which low address bits differ anywhere (an offset from
	// the lowest address is a multiple of 2^k exactly when all addresses
	// agree in their low k bits).
	first := segs[0]
	var sizeDiff, lowBits, maxSrc, maxDst uint64
	l.SrcBase, l.DstBase = math.MaxUint64, math.MaxUint64
	// Whether every address is congruent to the first's modulo the odd part
	// of its size (so offsets can count blocks); a multiplication by the
	// inverse tests divisibility by an odd number.
	// A distance x is a multiple of odd exactly when x*inverse (mod 2^64) is
	// at most MaxUint64/odd; the borrow of a subtraction records a miss
	// without a branch.
	odd := max(first.Size>>bits.TrailingZeros64(first.Size), 1) // an empty first segment is refused below
	oddInv, oddLimit := oddInverse(odd), math.MaxUint64/odd
	var missed uint64
	for _, s := range segs {
		if s.Size == 0 {
			return Layout{}, fmt.Errorf("empty segment at src %#x", s.Src)
		}
		_, bs := bits.Sub64(oddLimit, absDiff(s.Src, first.Src)*oddInv, 0)
		_, bd := bits.Sub64(oddLimit, absDiff(s.Dst, first.Dst)*oddInv, 0)
		missed |= bs | bd
		l.Pieces += int((s.Size + maxPiece - 1) >> pieceShift)
		sizeDiff |= s.Size ^ first.Size
		lowBits |= (s.Src ^ first.Src) | (s.Dst ^ first.Dst)
		l.SrcBase, maxSrc = min(l.SrcBase, s.Src), max(maxSrc, s.Src)
		l.DstBase, maxDst = min(l.DstBase, s.Dst), max(maxDst, s.Dst)
	}
	if l.Pieces > math.MaxUint32 {
		return Layout{}, fmt.Errorf("%d pieces exceed one launch", l.Pieces)
	}
	uniformSize := first.Size
	if sizeDiff != 0 || (uniformSize > maxPiece && uniformSize&(maxPiece-1) != 0) {
		return l, nil
	}
	piece := min(uniformSize, maxPiece)
	// The unit of the 32-bit offsets: the largest power of two dividing every
	// offset and, when items are cut, the piece size.
	if uniformSize > piece {
		lowBits |= piece
	}
	maxOff := max(maxSrc-l.SrcBase, maxDst-l.DstBase) + uniformSize - piece
	shift := uint32(31)
	if lowBits != 0 {
		shift = min(uint32(bits.TrailingZeros64(lowBits)), 31)
	}
	if maxOff>>shift > math.MaxUint32 {
		return l, nil
	}
	l.Uniform, l.PieceSize, l.Shift = true, piece, shift
	// Flat form: every piece, and both bases, on 16-byte boundaries, and the
	// vector count (plus a grid's stride of slack) within 32 bits.
	vecs := uint64(l.Pieces) * (piece / 16)
	l.Flat16 = shift >= 4 && piece%16 == 0 && l.SrcBase%16 == 0 && l.DstBase%16 == 0 && vecs < 1<<31
	if l.Flat16 && l.Pieces == len(segs) && maxOff>>4 <= math.MaxUint32 {
		l.pack(odd > 1 && missed == 0, maxSrc-l.SrcBase, maxDst-l.DstBase)
	}
	return l, nil
}

// absDiff is |a-b| for addresses less than 2^63 apart, without a branch.
func absDiff(a, b uint64) uint64 {
	d := a - b
	sign := uint64(int64(d) >> 63)
	return (d ^ sign) - sign
}

// pack chooses the packed form when it is smaller: offsets in units of the
// piece size when every offset is a multiple of it (congruent, and the piece
// size's power of two divides 1<<Shift), else of 1<<Shift.
func (l *Layout) pack(congruent bool, maxSrc, maxDst uint64) {
	unit := uint64(1) << l.Shift
	if congruent && uint32(bits.TrailingZeros64(l.PieceSize)) <= l.Shift {
		unit = l.PieceSize
	}
	k := uint32(bits.TrailingZeros64(unit))
	inv := oddInverse(unit >> k)
	sb := max(uint32(bits.Len64((maxSrc>>k)*inv)), 1)
	db := max(uint32(bits.Len64((maxDst>>k)*inv)), 1)
	if sb+db >= 64 {
		return
	}
	l.Packed, l.Unit, l.SrcBits, l.DstBits, l.unitShift, l.unitInv = true, unit, sb, db, k, inv
}

// oddInverse is the inverse of odd modulo 2^64 (Newton's iteration: each step
// doubles the correct low bits, from 3 for x = odd).
func oddInverse(odd uint64) uint64 {
	x := odd
	for range 5 {
		x *= 2 - odd*x
	}
	return x
}

// Write writes the descriptors for segs in layout l into buf, which must
// hold l.Bytes().
func Write(buf []byte, segs []Segment, l Layout, maxPiece uint64) {
	if l.Packed {
		writePacked(buf[:l.Bytes()], segs, l)
		return
	}
	if l.Uniform && l.Pieces == len(segs) {
		// The common KV case (equal blocks, none cut): one tight loop, one
		// 8-byte store per block.
		out := buf[:len(segs)*kernels.UniformDescriptorSize]
		for k, s := range segs {
			v := (s.Src-l.SrcBase)>>l.Shift | ((s.Dst-l.DstBase)>>l.Shift)<<32
			binary.LittleEndian.PutUint64(out[k*8:], v)
		}
		return
	}
	le := binary.LittleEndian
	i := 0
	for _, s := range segs {
		for off := uint64(0); off < s.Size; off += maxPiece {
			n := min(maxPiece, s.Size-off)
			if l.Uniform {
				le.PutUint32(buf[i:], uint32((s.Src+off-l.SrcBase)>>l.Shift))
				le.PutUint32(buf[i+4:], uint32((s.Dst+off-l.DstBase)>>l.Shift))
				i += kernels.UniformDescriptorSize
			} else {
				le.PutUint64(buf[i:], s.Src+off)
				le.PutUint64(buf[i+8:], s.Dst+off)
				le.PutUint64(buf[i+16:], n)
				i += kernels.GeneralDescriptorSize
			}
		}
	}
}

// writePacked streams the pieces' bits through a 64-bit accumulator, writing
// each 32-bit word once, then the padding.
func writePacked(buf []byte, segs []Segment, l Layout) {
	le := binary.LittleEndian
	b := uint(l.SrcBits + l.DstBits)
	var acc uint64
	var n uint // bits in acc, below 32 between pieces
	w := 0
	for _, s := range segs {
		// Masked: Plan checked that the division is exact, and a wrong
		// index must not spill into its neighbour's bits.
		si := ((s.Src - l.SrcBase) >> l.unitShift) * l.unitInv & (1<<l.SrcBits - 1)
		di := ((s.Dst - l.DstBase) >> l.unitShift) * l.unitInv & (1<<l.DstBits - 1)
		v := si | di<<l.SrcBits
		acc |= v << n
		if n+b >= 64 {
			le.PutUint64(buf[w:], acc)
			w += 8
			acc = v >> (64 - n) // 0 when n is 0
			n = n + b - 64
		} else {
			n += b
		}
		if n >= 32 {
			le.PutUint32(buf[w:], uint32(acc))
			w += 4
			acc >>= 32
			n -= 32
		}
	}
	if n > 0 {
		le.PutUint32(buf[w:], uint32(acc))
		w += 4
	}
	clear(buf[w:])
}

// Read decodes descriptors the way the kernels read them; it is the
// reference the tests hold the encoder to.
func Read(buf []byte, l Layout) []Segment {
	le := binary.LittleEndian
	out := make([]Segment, 0, l.Pieces)
	if l.Packed {
		b := uint64(l.SrcBits + l.DstBits)
		for i := 0; i < l.Pieces; i++ {
			bit := uint64(i) * b
			w, sh := (bit>>5)*4, bit&31
			v := le.Uint64(buf[w:]) >> sh
			if sh > 0 {
				v |= uint64(le.Uint32(buf[w+8:])) << (64 - sh)
			}
			src, dst := v&(1<<l.SrcBits-1), (v>>l.SrcBits)&(1<<l.DstBits-1)
			out = append(out, Segment{Src: l.SrcBase + src*l.Unit, Dst: l.DstBase + dst*l.Unit, Size: l.PieceSize})
		}
		return out
	}
	for i := 0; i < l.Pieces; i++ {
		if l.Uniform {
			b := buf[i*kernels.UniformDescriptorSize:]
			out = append(out, Segment{
				Src:  l.SrcBase + uint64(le.Uint32(b))<<l.Shift,
				Dst:  l.DstBase + uint64(le.Uint32(b[4:]))<<l.Shift,
				Size: l.PieceSize,
			})
			continue
		}
		b := buf[i*kernels.GeneralDescriptorSize:]
		out = append(out, Segment{Src: le.Uint64(b), Dst: le.Uint64(b[8:]), Size: le.Uint64(b[16:])})
	}
	return out
}

// FlatChunk is how many pieces of per vectors one block of threads threads
// takes per round in fx_scatter_flat16; it must match fx_flat_chunk in
// native/kernels/copy.cu and copy.hip, or blocks skip or repeat pieces.
func FlatChunk(per, threads uint32) uint32 {
	const maxChunk = 256 // FX_FLAT_MAX_CHUNK
	return min(max(4*threads/per, 1), maxChunk)
}

// SplitBySize separates segments of at least threshold bytes (for the copy
// engine) from the rest (for the kernel); callers check first that there is one.
func SplitBySize(segs []Segment, threshold uint64) (small, big []Segment) {
	nbig := 0
	for _, s := range segs {
		if s.Size >= threshold {
			nbig++
		}
	}
	small, big = make([]Segment, 0, len(segs)-nbig), make([]Segment, 0, nbig)
	for _, s := range segs {
		if s.Size >= threshold {
			big = append(big, s)
		} else {
			small = append(small, s)
		}
	}
	return small, big
}

// BlockBases are the base addresses of one region pair of a block list.
type BlockBases struct {
	Src, Dst uint64
}

// IDRange is the smallest and largest id of a block list side.
type IDRange struct{ Min, Max uint32 }

// PlanBlocks chooses the flat form of a block list (every pair's blocks srcIDs[i] -> dstIDs[i] of bs bytes,
// ids within src and dst) without a segment per block: one 8-byte descriptor per block, 32-bit offsets in
// 16-byte units from the lowest block of each side. Writing those is one multiply-add per id; the packed form
// would read fewer bytes across PCIe but costs several times the host time for a list seen once. ok is false
// when it does not fit (unaligned blocks or bases, blocks longer than maxPiece, offsets beyond 2^36 bytes);
// the caller then describes segments instead.
func PlanBlocks(pairs []BlockBases, bs uint64, n int, src, dst IDRange, maxPiece uint64) (Layout, bool) {
	var l Layout
	if len(pairs) == 0 || n == 0 || bs == 0 || bs%16 != 0 || bs > maxPiece || src.Min > src.Max || dst.Min > dst.Max {
		return l, false
	}
	pieces := uint64(len(pairs)) * uint64(n)
	if pieces > math.MaxUint32 || pieces*(bs/16) >= 1<<31 {
		return l, false
	}
	loS, loD := uint64(math.MaxUint64), uint64(math.MaxUint64)
	var hiS, hiD uint64
	for _, p := range pairs {
		if p.Src%16 != 0 || p.Dst%16 != 0 {
			return l, false
		}
		loS, hiS = min(loS, p.Src), max(hiS, p.Src)
		loD, hiD = min(loD, p.Dst), max(hiD, p.Dst)
	}
	l.Uniform, l.Flat16, l.Pieces, l.PieceSize, l.Shift = true, true, int(pieces), bs, 4
	l.SrcBase, l.DstBase = loS+uint64(src.Min)*bs, loD+uint64(dst.Min)*bs
	if (hiS-loS+uint64(src.Max-src.Min)*bs)>>4 > math.MaxUint32 || (hiD-loD+uint64(dst.Max-dst.Min)*bs)>>4 > math.MaxUint32 {
		return Layout{}, false
	}
	return l, true
}

// WriteBlocks writes the descriptors of a block list planned by PlanBlocks into buf (l.Bytes() long), pair
// after pair, in id order within each pair.
func WriteBlocks(buf []byte, l Layout, pairs []BlockBases, bs uint64, srcIDs, dstIDs []uint32) {
	out := buf[:l.Pieces*kernels.UniformDescriptorSize]
	units := bs >> 4
	k := 0
	for _, p := range pairs {
		// Offsets of block 0 of this pair from the bases, in 16-byte units; they wrap below the base and the
		// sums below do not.
		ps, pd := (p.Src-l.SrcBase)>>4, (p.Dst-l.DstBase)>>4
		if p.Src < l.SrcBase {
			ps = -((l.SrcBase - p.Src) >> 4)
		}
		if p.Dst < l.DstBase {
			pd = -((l.DstBase - p.Dst) >> 4)
		}
		o := out[k : k+8*len(srcIDs)]
		if words, ok := asWords(o); ok {
			dst := dstIDs[:len(words)]
			for i, s := range srcIDs[:len(words)] {
				words[i] = uint64(uint32(ps+uint64(s)*units)) | uint64(uint32(pd+uint64(dst[i])*units))<<32
			}
		} else {
			for i, s := range srcIDs[:len(o)/8] {
				v := uint64(uint32(ps+uint64(s)*units)) | uint64(uint32(pd+uint64(dstIDs[i])*units))<<32
				binary.LittleEndian.PutUint64(o[8*i:], v)
			}
		}
		k += len(o)
	}
}

// littleEndian is whether this machine stores words as the kernels read them.
var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// asWords views b as 64-bit words when the machine is little-endian and b is 8-byte aligned (staging
// buffers are page-aligned pinned memory), so descriptors are stored a word at a time.
func asWords(b []byte) ([]uint64, bool) {
	if !littleEndian || len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8), true
}

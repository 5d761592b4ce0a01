package gpucopy

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// Segment is one copy between two addresses the GPU can reach (device
// memory of this or a peer GPU, imported memory, pinned or registered host
// memory), in the unified address space.
type Segment struct {
	Dst, Src uint64
	Size     uint64
}

// batchLayout is how a set of segments is described to the scatter kernel.
type batchLayout struct {
	uniform bool
	pieces  int
	// Uniform form: every piece is pieceSize bytes at base + (offset << shift).
	srcBase, dstBase uint64
	pieceSize        uint64
	shift            uint32
	// flat16: uniform, 16-byte aligned, launched as one flat range of vectors.
	flat16 bool
}

func (l batchLayout) bytes() int {
	if l.uniform {
		return l.pieces * kernels.UniformDescriptorSize
	}
	return l.pieces * kernels.GeneralDescriptorSize
}

// planLayout chooses the descriptor form for segs, cutting each segment into
// pieces of at most maxPiece bytes so that one warp's share stays small and
// large items spread across the GPU.
func planLayout(segs []Segment, maxPiece uint64) (batchLayout, error) {
	if maxPiece == 0 || maxPiece&(maxPiece-1) != 0 {
		return batchLayout{}, fmt.Errorf("piece size %d is not a power of two", maxPiece)
	}
	pieceShift := uint(bits.TrailingZeros64(maxPiece))
	var l batchLayout
	// One pass: piece count, whether all sizes match, the lowest and highest
	// addresses, and which low address bits differ anywhere (an offset from
	// the lowest address is a multiple of 2^k exactly when all addresses
	// agree in their low k bits).
	first := segs[0]
	var sizeDiff, lowBits, maxSrc, maxDst uint64
	l.srcBase, l.dstBase = math.MaxUint64, math.MaxUint64
	for _, s := range segs {
		if s.Size == 0 {
			return batchLayout{}, fmt.Errorf("empty segment at src %#x", s.Src)
		}
		l.pieces += int((s.Size + maxPiece - 1) >> pieceShift)
		sizeDiff |= s.Size ^ first.Size
		lowBits |= (s.Src ^ first.Src) | (s.Dst ^ first.Dst)
		l.srcBase, maxSrc = min(l.srcBase, s.Src), max(maxSrc, s.Src)
		l.dstBase, maxDst = min(l.dstBase, s.Dst), max(maxDst, s.Dst)
	}
	if l.pieces > math.MaxUint32 {
		return batchLayout{}, fmt.Errorf("%d pieces exceed one launch", l.pieces)
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
	maxOff := max(maxSrc-l.srcBase, maxDst-l.dstBase) + uniformSize - piece
	shift := uint32(31)
	if lowBits != 0 {
		shift = min(uint32(bits.TrailingZeros64(lowBits)), 31)
	}
	if maxOff>>shift > math.MaxUint32 {
		return l, nil
	}
	l.uniform, l.pieceSize, l.shift = true, piece, shift
	// Flat form: every piece, and both bases, on 16-byte boundaries, and the
	// vector count (plus a grid's stride of slack) within 32 bits.
	vecs := uint64(l.pieces) * (piece / 16)
	l.flat16 = shift >= 4 && piece%16 == 0 && l.srcBase%16 == 0 && l.dstBase%16 == 0 && vecs < 1<<31
	return l, nil
}

// writeDescriptors writes the descriptors for segs in layout l into buf,
// which must hold l.bytes().
func writeDescriptors(buf []byte, segs []Segment, l batchLayout, maxPiece uint64) {
	if l.uniform && l.pieces == len(segs) {
		// The common KV case (equal blocks, none cut): one tight loop, one
		// 8-byte store per block.
		out := buf[:len(segs)*kernels.UniformDescriptorSize]
		for k, s := range segs {
			v := (s.Src-l.srcBase)>>l.shift | ((s.Dst-l.dstBase)>>l.shift)<<32
			binary.LittleEndian.PutUint64(out[k*8:], v)
		}
		return
	}
	le := binary.LittleEndian
	i := 0
	for _, s := range segs {
		for off := uint64(0); off < s.Size; off += maxPiece {
			n := min(maxPiece, s.Size-off)
			if l.uniform {
				le.PutUint32(buf[i:], uint32((s.Src+off-l.srcBase)>>l.shift))
				le.PutUint32(buf[i+4:], uint32((s.Dst+off-l.dstBase)>>l.shift))
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

// readDescriptors decodes descriptors the way the kernels read them; it is
// the reference the tests hold the encoder to.
func readDescriptors(buf []byte, l batchLayout) []Segment {
	le := binary.LittleEndian
	out := make([]Segment, 0, l.pieces)
	for i := 0; i < l.pieces; i++ {
		if l.uniform {
			b := buf[i*kernels.UniformDescriptorSize:]
			out = append(out, Segment{
				Src:  l.srcBase + uint64(le.Uint32(b))<<l.shift,
				Dst:  l.dstBase + uint64(le.Uint32(b[4:]))<<l.shift,
				Size: l.pieceSize,
			})
			continue
		}
		b := buf[i*kernels.GeneralDescriptorSize:]
		out = append(out, Segment{Src: le.Uint64(b), Dst: le.Uint64(b[8:]), Size: le.Uint64(b[16:])})
	}
	return out
}

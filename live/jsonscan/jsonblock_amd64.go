//go:build amd64 && !purego

package jsonscan

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// jsonblock_amd64.s writes blockBatch (8) blockMasks of 40 bytes, five
// uint64 in order: the build fails if either changes without it.
const (
	_ = uint(blockBatch - 8)
	_ = uint(8 - blockBatch)
	_ = uint(unsafe.Sizeof(blockMask{}) - 40)
	_ = uint(40 - unsafe.Sizeof(blockMask{}))
	_ = uint(unsafe.Offsetof(blockMask{}.u) - 32)
)

// blockScan: long strings are scanned a block at a time, the masks
// computed with AVX2.
var blockScan = cpu.X86.HasAVX2

// blockMasksAVX2 is blockMasksGo in AVX2 (jsonblock_amd64.s).
//
//go:noescape
func blockMasksAVX2(d []byte, off int, out *[blockBatch]blockMask) (next, n int)

func blockMasks(d []byte, off int, out *[blockBatch]blockMask) (next, n int) {
	if blockScan {
		return blockMasksAVX2(d, off, out)
	}
	return blockMasksGo(d, off, out)
}

// asciiPrefixAVX2 is asciiPrefix in AVX2 (jsonblock_amd64.s).
//
//go:noescape
func asciiPrefixAVX2(d []byte) int

// asciiPrefix returns a length n, a multiple of 128, such that d[:n] is
// all ASCII: up to the first 128-byte block that holds a byte >= 0x80, or
// that d does not fill.
func asciiPrefix(d []byte) int {
	if blockScan {
		return asciiPrefixAVX2(d)
	}
	return 0
}

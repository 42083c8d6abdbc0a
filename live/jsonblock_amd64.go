//go:build amd64 && !purego

package live

import "golang.org/x/sys/cpu"

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

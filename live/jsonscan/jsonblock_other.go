//go:build !amd64 || purego

package jsonscan

// blockScan is off without a vector unit to compute the block masks: the
// word-at-a-time scanner is faster than blockMasksGo.
var blockScan = false

func blockMasks(d []byte, off int, out *[blockBatch]blockMask) (next, n int) {
	return blockMasksGo(d, off, out)
}

// asciiPrefix finds no ASCII run without a vector unit: utf8.Valid's own
// ASCII loop is as fast in Go.
func asciiPrefix(d []byte) int { return 0 }

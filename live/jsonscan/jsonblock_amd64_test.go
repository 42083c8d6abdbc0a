//go:build amd64 && !purego

package jsonscan

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// blockTestData is bytes weighted towards the ones the masks flag, with
// every byte value present, n long.
func blockTestData(r *rand.Rand, n int) []byte {
	const alphabet = "\"\\/bfnrtuU01aAzZ \x00\x1f\x20\x7f"
	d := make([]byte, n)
	for i := range d {
		switch r.IntN(4) {
		case 0:
			d[i] = byte(r.IntN(256))
		default:
			d[i] = alphabet[r.IntN(len(alphabet))]
		}
	}
	return d
}

// TestBlockMasks holds the vector masks to the reference, from every
// offset, for every byte value in every lane of a block.
func TestBlockMasks(t *testing.T) {
	if !blockScan {
		t.Skip("no vector masks on this machine: blockMasks is blockMasksGo")
	}
	var all []byte
	for i := range 256 + 63 {
		all = append(all, byte(i))
	}
	r := rand.New(rand.NewPCG(1, 2))
	inputs := [][]byte{all, []byte(strings.Repeat("plain text, no specials ", 20) + `"`), nil, make([]byte, 63)}
	for range 20 {
		inputs = append(inputs, blockTestData(r, 64+r.IntN(700)))
	}
	for _, d := range inputs {
		for off := 0; off <= len(d); off++ {
			var out1, out2 [blockBatch]blockMask
			n1, c1 := blockMasksAVX2(d, off, &out1)
			n2, c2 := blockMasksGo(d, off, &out2)
			if n1 != n2 || c1 != c2 || out1 != out2 {
				t.Fatalf("len %d off %d: AVX2 next %d, %d blocks %x; Go next %d, %d blocks %x", len(d), off, n1, c1, out1[:c1], n2, c2, out2[:c2])
			}
		}
	}
}

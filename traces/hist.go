package traces

import "math/bits"

// logHist is a fixed-size log-bucket histogram of non-negative integers:
// values below 128 are exact, larger ones fall in one of 128 buckets per
// power of two (relative error under 0.8%). It is deterministic and its
// memory does not depend on the number of values.
type logHist struct {
	counts   [histBuckets]int64
	n        int64
	min, max int64
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits
	histBuckets = histSub + (63-histSubBits)*histSub // int64 values: exponents up to 62
)

func histIndex(v int64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 1 // >= histSubBits
	sub := int(uint64(v)>>(e-histSubBits)) & (histSub - 1)
	return histSub + (e-histSubBits)*histSub + sub
}

// histLower is the smallest value of bucket i.
func histLower(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	e := (i-histSub)/histSub + histSubBits
	sub := (i - histSub) % histSub
	return int64(histSub+sub) << (e - histSubBits)
}

func (h *logHist) add(v int64) {
	v = max(v, 0)
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if h.n == 0 || v > h.max {
		h.max = v
	}
	h.counts[histIndex(v)]++
	h.n++
}

// quantile returns the q-quantile (nearest rank) as its bucket's lower
// bound, clamped to the exact minimum and maximum; 0 when empty.
func (h *logHist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++
	}
	rank = min(max(rank, 1), h.n)
	var cum int64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return min(max(histLower(i), h.min), h.max)
		}
	}
	return h.max
}

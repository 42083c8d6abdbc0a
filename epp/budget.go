package epp

import (
	"sync/atomic"

	"github.com/lm-warden/warden/live"
)

// bodyBudget bounds the bytes of request bodies the picker holds at once,
// across every stream (issue 46, item 3: 40 streams of 17 MiB that never
// ended took the picker from 48 MB to 1.3 GB). A stream takes the
// capacity of its body's buffer before it grows it and gives it back once
// the request is decided, refused or gone; a body that cannot be taken is
// refused (429 in the client's shape, Retry-After) and let go.
type bodyBudget struct {
	limit int64
	held  atomic.Int64
}

// bodyBudgetOf is the budget a configuration gives: limits.max_in_flight
// bodies of 1 MiB, the per-request footprint DefaultMaxInFlight sizes the
// machine's memory with (a quarter of it by default; an agent turn's body
// is ~250 KB), and never less than one body of limits.max_body_bytes.
func bodyBudgetOf(l live.Limits) int64 {
	return max(int64(l.MaxInFlight)<<20, int64(l.MaxBodyBytes)+1)
}

func newBodyBudget(limit int64) *bodyBudget { return &bodyBudget{limit: limit} }

// take reserves n bytes; false, reserving nothing, when that would pass
// the budget.
func (b *bodyBudget) take(n int) bool {
	if b.held.Add(int64(n)) > b.limit {
		b.held.Add(-int64(n))
		return false
	}
	return true
}

// give returns n bytes taken.
func (b *bodyBudget) give(n int) {
	if n > 0 {
		b.held.Add(-int64(n))
	}
}

// state is the bytes held now and the budget.
func (b *bodyBudget) state() (held, limit int64) { return b.held.Load(), b.limit }

package live

import (
	"sync/atomic"
	"time"
)

// Passive ejection and recovery (outlier detection as Envoy does it). A
// replica whose connection is refused is ejected at once; one that answers
// ejectConsecutive times in a row with a 5xx or a stream timeout
// (timeouts.first_token, timeouts.stream_idle) is ejected too. Either is
// ejected for a back-off that doubles with each consecutive failure
// (ejectBase, 2*ejectBase, ... up to ejectMax); at most half of a model's
// replicas (rounded down: never the only replica) are ejected at once, so a
// network blip cannot empty a farm. When its back-off ends the
// replica warms up for warmup: it is shown to the policy as healthy for a
// share of picks that grows linearly from warmStart to 100 %, so new
// conversations come back to it gradually instead of all at once.
const (
	ejectBase = time.Second
	ejectMax  = 30 * time.Second
	warmup    = 30 * time.Second
	warmStart = 0.1
	// ejectConsecutive is the number of consecutive 5xx answers or stream
	// timeouts that eject a replica. Envoy's consecutive_5xx default is 5;
	// 3 here because one stall timeout already costs its client
	// timeouts.stream_idle or timeouts.first_token.
	ejectConsecutive = 3
)

// connectFailed records a refused connection to rep and ejects it unless
// that would eject more than half of the model's replicas. It reports
// whether rep was ejected.
func (m *model) connectFailed(rep *replica, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.current().eject(rep, now)
}

// outlier records a 5xx answer or a stream timeout of rep and ejects it
// (under the same rule as connectFailed) at the ejectConsecutive-th in a
// row. It reports whether rep was ejected.
func (m *model) outlier(rep *replica, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if saturatingInc(&rep.strikes) < ejectConsecutive || now.Before(rep.ejectedUntil) {
		return false
	}
	if !m.current().eject(rep, now) {
		return false
	}
	rep.strikes.Store(0)
	return true
}

// maxFailureCount caps the consecutive-failure counters (strikes,
// failures): the rules only compare them with small numbers (the
// ejectConsecutive-th strike, the back-off's doubling is capped after 10),
// and a counter that wrapped would read negative.
const maxFailureCount = 1 << 20

// saturatingInc adds one to c, up to maxFailureCount, and returns the new
// count.
func saturatingInc(c *atomic.Int32) int32 {
	for {
		v := c.Load()
		if v >= maxFailureCount {
			return v
		}
		if c.CompareAndSwap(v, v+1) {
			return v + 1
		}
	}
}

// eject ejects rep for its back-off unless that would eject more than half
// of the model's replicas, or rep is not one of them (a reload removed its
// backend). Called with m.mu held.
func (m *model) eject(rep *replica, now time.Time) bool {
	if m.index(rep) < 0 {
		return false
	}
	failures := saturatingInc(&rep.failures)
	ejected := 0
	for _, o := range m.replicas {
		if o.replicaState != rep.replicaState && now.Before(o.ejectedUntil) {
			ejected++
		}
	}
	if (ejected+1)*2 > len(m.replicas) {
		return false
	}
	backoff := ejectBase << min(failures-1, 10)
	backoff = min(backoff, ejectMax)
	rep.ejectedUntil = now.Add(backoff)
	rep.warmUntil = rep.ejectedUntil.Add(warmup)
	rep.warmPicks = 0
	return true
}

// succeeded resets rep's failure counts after a good response (a stream:
// once it ended properly).
func (m *model) succeeded(rep *replica) {
	if rep.failures.Load() != 0 {
		rep.failures.Store(0)
	}
	if rep.strikes.Load() != 0 {
		rep.strikes.Store(0)
	}
}

// state names a replica's routing state for Status.
func (m *model) state(rep *replica, r *ScrapeResult, now time.Time) string {
	switch {
	case !r.Healthy:
		return "down"
	case now.Before(rep.ejectedUntil):
		return "ejected"
	case now.Before(rep.warmUntil):
		return "warming"
	}
	return "healthy"
}

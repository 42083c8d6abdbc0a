package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/lm-warden/warden/placement"
)

// Routing variants: a strategy name may carry affinity's KV-aware options
// after "+", e.g. "affinity+kv+priced+admit":
//
//	kv      routing.balance: kv          (new conversations by KV headroom)
//	priced  routing.spill_threshold: priced
//	admit   routing.admission: kv        (new conversations wait for headroom)
//
// Plain "affinity" takes the farm's routing block. A variant's display
// name, in tables and JSON, lists the options in effect:
// "affinity (kv, priced, admit)"; with none it is the strategy's name.

// variant is one strategy with its options resolved against the farm.
type variant struct {
	strategy string // hash | least-loaded | affinity
	name     string // display name
	cfg      placement.Config
	timeout  time.Duration // admission timeout; 0: none
}

// variantOptions are the option words of a variant, in display order.
var variantOptions = []string{"kv", "priced", "admit"}

// ValidStrategy reports whether s names a strategy or a variant of
// affinity ("affinity+kv+priced+admit"), naming what is wrong.
func ValidStrategy(s string) error {
	base, opts, _ := strings.Cut(s, "+")
	if !validStrategy(base) {
		return fmt.Errorf("unknown strategy %q (want one of %s, or affinity+OPTION... with options %s)",
			s, strings.Join(placement.Strategies(), ", "), strings.Join(variantOptions, ", "))
	}
	if opts == "" {
		return nil
	}
	if base != placement.StrategyAffinity {
		return fmt.Errorf("strategy %q: only affinity takes options (%s)", s, strings.Join(variantOptions, ", "))
	}
	for o := range strings.SplitSeq(opts, "+") {
		if !containsString(variantOptions, o) {
			return fmt.Errorf("strategy %q: unknown option %q (want %s)", s, o, strings.Join(variantOptions, ", "))
		}
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// newVariant resolves strategy s (ValidStrategy) on farm f with the spill
// threshold spill (the experiment's, which may override the farm's).
func newVariant(f *Farm, s string, spill placement.SpillThreshold) (variant, error) {
	if err := ValidStrategy(s); err != nil {
		return variant{}, fmt.Errorf("sim: %w", err)
	}
	base, opts, _ := strings.Cut(s, "+")
	rs := f.Spec.Routing
	v := variant{strategy: base, name: base, cfg: placement.Config{
		Spill:        spill,
		SessionTTL:   time.Duration(rs.SessionTTL),
		ActiveWindow: time.Duration(rs.ActiveWindow),
		MaxSessions:  rs.MaxSessions,
		Balance:      f.Balance,
		Admission:    f.Admission,
	}, timeout: time.Duration(rs.AdmissionTimeout)}
	if opts != "" {
		for o := range strings.SplitSeq(opts, "+") {
			switch o {
			case "kv":
				v.cfg.Balance = placement.BalanceKV
			case "priced":
				v.cfg.Spill = placement.SpillPriced()
			case "admit":
				v.cfg.Admission = placement.AdmissionKV
			}
		}
	}
	if base == placement.StrategyAffinity {
		var on []string
		if v.cfg.Balance == placement.BalanceKV {
			on = append(on, "kv")
		}
		if v.cfg.Spill.Priced() {
			on = append(on, "priced")
		}
		if v.cfg.Admission == placement.AdmissionKV {
			on = append(on, "admit")
		}
		if len(on) > 0 {
			v.name = base + " (" + strings.Join(on, ", ") + ")"
		}
	}
	return v, nil
}

// kvAware reports whether the variant uses footprints, the prefill queue
// or admission: the run then feeds them to placement.
func (v variant) kvAware() bool {
	return v.strategy == placement.StrategyAffinity &&
		(v.cfg.Balance == placement.BalanceKV || v.cfg.Admission == placement.AdmissionKV || v.cfg.Spill.Priced())
}

// prefillTokensPerSec is the step-time model's rate of computing a cold
// prompt of 8192 tokens in chunks of the scheduler's token budget: what
// the priced spill divides uncached tokens by.
func prefillTokensPerSec(c *engineConfig) float64 {
	const prompt = 8192
	budget := max(c.maxNumBatchedTokens, 1)
	secs := 0.0
	for start := 0; start < prompt; start += budget {
		n := min(budget, prompt-start)
		secs += c.steps.seconds([]chunk{{start: start, n: n}})
	}
	if secs <= 0 {
		return 0
	}
	return prompt / secs
}

// kvRouter is the router's side of the KV-aware options: what it feeds to
// placement and the admission FIFO.
type kvRouter struct {
	aff     *placement.Affinity
	shared  int   // the workload's shared system prompt, tokens
	queue   []int // per replica: Decision.Uncached of requests before their first token
	waiting placement.WaitQueue[*seq]
	timeout time.Duration
	expired []*seq
	// admitQueued: an evAdmit is queued at the current instant.
	admitQueued bool
}

// initKV prepares the run for a KV-aware variant.
func (r *run) initKV(v variant, sharedPrefix int) {
	aff, ok := r.policy.(*placement.Affinity)
	if !ok || !v.kvAware() {
		return
	}
	r.kv = &kvRouter{aff: aff, shared: sharedPrefix, queue: make([]int, len(r.reps)), timeout: v.timeout}
	rate := prefillTokensPerSec(&r.cfg)
	capTokens := r.farm.KVTokensPerReplica()
	for i := range r.snap.Replicas {
		r.snap.Replicas[i].KVCapacityTokens = capTokens
		r.snap.Replicas[i].PrefillTokensPerSec = rate
	}
}

// routed records the prefill estimate of s, placed with d.
func (k *kvRouter) routed(r *run, s *seq, d placement.Decision) {
	s.uncached = d.Uncached
	k.queue[d.Replica] += int(d.Uncached)
	r.snap.Replicas[d.Replica].PrefillQueueTokens = k.queue[d.Replica]
}

// prefilled takes s out of its replica's prefill queue (its first token,
// or it left without one).
func (k *kvRouter) prefilled(r *run, s *seq) {
	if s.uncached == 0 || s.replica < 0 {
		return
	}
	k.queue[s.replica] -= int(s.uncached)
	r.snap.Replicas[s.replica].PrefillQueueTokens = k.queue[s.replica]
	s.uncached = 0
}

// finished records a finished request's footprint: its prompt + answer.
func (k *kvRouter) finished(s *seq) {
	k.aff.Table().Observe(s.req.Session, s.prompt+s.generated)
}

// sessionEnded forgets a conversation whose last turn is done (the
// simulator knows exactly; the proxy waits for the active window) and
// admits whoever now fits.
func (k *kvRouter) sessionEnded(r *run, session string) {
	k.aff.Table().Remove(session)
	if k.waiting.Len() > 0 && !k.admitQueued {
		// After the events of this instant (a replica may be inside its
		// step's end): admission enqueues on replicas.
		k.admitQueued = true
		r.ev.push(r.now, evAdmit, 0)
	}
}

// admit places waiting requests, oldest first, until one must still wait;
// then it refuses those waiting longer than the timeout.
func (k *kvRouter) admit(r *run) {
	for k.waiting.Len() > 0 {
		s, _, _ := k.waiting.Front()
		if s.aborted {
			k.waiting.Pop()
			r.seqFree = append(r.seqFree, s)
			continue
		}
		d, err := r.pick(s)
		if err != nil {
			r.err = fmt.Errorf("placement: %w", err)
			return
		}
		if d.Wait {
			break
		}
		k.waiting.Pop()
		r.place(s, d, r.homeOf(s))
	}
	k.expired = k.waiting.Expired(time.UnixMicro(r.now), k.timeout, k.expired[:0])
	for _, s := range k.expired {
		if s.aborted {
			r.seqFree = append(r.seqFree, s)
			continue
		}
		// Refused after its wait (429/529 in the proxy): the wait counts
		// in its TTFB, as a client would see it.
		s.ttfbUs = r.now - s.clientSentUs
		s.stepSessions = r.stepSessions
		r.rt.ttfbs = append(r.rt.ttfbs, float64(s.ttfbUs)/usPerSec)
		r.rt.rejected++
		r.rt.unfinished++
		s.rejected = true
		r.logRequest(s, false)
		r.drv.done(r, s, false)
		r.seqFree = append(r.seqFree, s)
	}
	if len(k.expired) > 0 {
		r.checkIdle()
	}
}

// each calls f for every request waiting for admission.
func (k *kvRouter) each(f func(*seq)) {
	for n := k.waiting.Len(); n > 0; n-- {
		s := k.waiting.Pop()
		f(s)
		k.waiting.Push(s, time.UnixMicro(s.sentUs))
	}
}

package traces

import (
	"errors"
	"io"
	"slices"
	"time"
)

// StatsOptions tune Stats.
type StatsOptions struct {
	// SessionTTL is how long a session still counts in the working set
	// after its latest request (default 5m; <= 0 means the default).
	// Stats streams, so a session counts at time t when it sent a request
	// in the TTL before t: the same as "from its first request to TTL after
	// its last" whenever no session pauses longer than the TTL.
	SessionTTL time.Duration
	// SampleEvery is the working set's sampling period (default 1m).
	SampleEvery time.Duration
	// Fit, when set, is given every request too: a workload fitted to the
	// trace in the same pass (Fitter).
	Fit *Fitter
}

// DefaultStatsOptions returns the options Stats uses.
func DefaultStatsOptions() StatsOptions {
	return StatsOptions{SessionTTL: 5 * time.Minute, SampleEvery: time.Minute}
}

// TraceStats summarises a trace (warden trace stats). Token counts are in
// tokens, block counts in blocks of BlockSize tokens.
type TraceStats struct {
	BlockSize int `json:"block_size"`
	Requests  int `json:"requests"`
	Skipped   int `json:"skipped_lines"`
	Sessions  int `json:"sessions"`
	// Turns per session: requests per session id.
	TurnsPerSessionP50 int     `json:"turns_per_session_p50"`
	TurnsPerSessionMax int     `json:"turns_per_session_max"`
	DurationS          float64 `json:"duration_s"` // last arrival - first arrival
	PromptTokens       int64   `json:"prompt_tokens"`
	OutputTokens       int64   `json:"output_tokens"`
	// Context length = a request's prompt tokens (log-bucket percentiles,
	// within 0.8%).
	ContextTokensP50 int64 `json:"context_tokens_p50"`
	ContextTokensP90 int64 `json:"context_tokens_p90"`
	ContextTokensP99 int64 `json:"context_tokens_p99"`
	ContextTokensMax int64 `json:"context_tokens_max"`
	// Rates over DurationS; 0 when the trace spans no time.
	PromptTokensPerMin float64 `json:"prompt_tokens_per_min"`
	OutputTokensPerMin float64 `json:"output_tokens_per_min"`
	// Prefix reuse with an infinite cache: FullBlocks counts the full prompt
	// blocks of every request (a trailing partial block is never cached);
	// ReusedBlocks those whose id appeared earlier in the trace, in a full
	// prompt block or in output_hash_ids.
	// DistinctBlocks is the number of distinct ids in the set: full prompt
	// blocks and output blocks.
	FullBlocks     int64 `json:"full_blocks"`
	ReusedBlocks   int64 `json:"reused_blocks"`
	DistinctBlocks int64 `json:"distinct_blocks"`
	// ReuseUpperBoundPct = 100 x ReusedBlocks / FullBlocks: no prefix cache
	// replaying the trace in order can hit more. ReuseUpperBoundTokenPct =
	// 100 x ReusedBlocks x BlockSize / PromptTokens is the same bound in
	// the unit of vLLM's hit rate (cache hit tokens / prompt tokens), and is
	// tighter (partial blocks count as misses).
	ReuseUpperBoundPct      float64 `json:"reuse_upper_bound_pct"`
	ReuseUpperBoundTokenPct float64 `json:"reuse_upper_bound_token_pct"`
	// Working set, sampled every SampleEvery: the sessions active at that
	// time and the sum of their context (prompt + output of each one's
	// latest request). A session is active from its first request until
	// SessionTTL after its latest one.
	SessionTTLS         float64 `json:"session_ttl_s"`
	WorkingSetSamples   int     `json:"working_set_samples"`
	ActiveSessionsP50   int64   `json:"active_sessions_p50"`
	ActiveSessionsMax   int64   `json:"active_sessions_max"`
	WorkingSetTokensP50 int64   `json:"working_set_tokens_p50"`
	WorkingSetTokensMax int64   `json:"working_set_tokens_max"`
}

// Stats reads r to the end and summarises it with DefaultStatsOptions.
func Stats(r *Reader) (TraceStats, error) { return StatsWithOptions(r, DefaultStatsOptions()) }

// sessionState is what Stats keeps per session id.
type sessionState struct {
	turns   int
	lastMs  int64
	context int64
	active  bool
}

type expiry struct {
	s  *sessionState
	ms int64
}

// StatsWithOptions reads r to the end and summarises it.
//
// Memory: fixed-size histograms, plus one small entry per session id and
// one 8-byte id per distinct block id (the set behind the reuse bound, a
// Go map: about 10-20 bytes a block), plus the requests of the last
// SessionTTL. It does not grow with the number of requests when sessions
// and distinct blocks do not.
func StatsWithOptions(r *Reader, opts StatsOptions) (TraceStats, error) {
	def := DefaultStatsOptions()
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = def.SessionTTL
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = def.SampleEvery
	}
	B := r.Header().BlockSize
	st := TraceStats{BlockSize: B, SessionTTLS: opts.SessionTTL.Seconds()}
	var (
		ctx, active, working logHist
		sessions             = map[string]*sessionState{}
		seen                 = map[uint64]struct{}{}
		fifo                 []expiry
		head                 int
		nActive              int64
		wsTokens             int64
		firstMs, lastMs      int64
		nextSample           int64
		ttl                  = opts.SessionTTL.Milliseconds()
		every                = max(opts.SampleEvery.Milliseconds(), 1)
	)
	expire := func(t int64) {
		for head < len(fifo) && fifo[head].ms+ttl < t {
			e := fifo[head]
			fifo[head] = expiry{}
			head++
			if e.s.active && e.s.lastMs == e.ms {
				e.s.active = false
				nActive--
				wsTokens -= e.s.context
			}
		}
		if head > 1024 && head*2 > len(fifo) {
			fifo = append(fifo[:0], fifo[head:]...)
			head = 0
		}
	}
	sample := func(t int64) {
		expire(t)
		active.add(nActive)
		working.add(wsTokens)
		st.WorkingSetSamples++
	}
	for {
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return TraceStats{}, err
		}
		a := req.ArrivalMs
		if st.Requests == 0 {
			firstMs, nextSample = a, a+every
		}
		for nextSample < a {
			sample(nextSample)
			nextSample += every
		}
		lastMs = a
		if opts.Fit != nil {
			opts.Fit.Add(req)
		}
		st.Requests++
		st.PromptTokens += int64(req.PromptTokens)
		st.OutputTokens += int64(req.OutputTokens)
		ctx.add(int64(req.PromptTokens))

		full := req.PromptTokens / B
		for _, id := range req.HashIDs[:full] {
			if _, ok := seen[id]; ok {
				st.ReusedBlocks++
			}
		}
		st.FullBlocks += int64(full)
		for _, id := range req.HashIDs[:full] {
			seen[id] = struct{}{}
		}
		for _, id := range req.OutputHashIDs {
			seen[id] = struct{}{}
		}

		s := sessions[req.Session]
		if s == nil {
			s = &sessionState{}
			sessions[req.Session] = s
		}
		s.turns++
		if s.active {
			wsTokens -= s.context
		} else {
			s.active = true
			nActive++
		}
		s.context = int64(req.PromptTokens + req.OutputTokens)
		wsTokens += s.context
		s.lastMs = a
		fifo = append(fifo, expiry{s: s, ms: a})
	}
	st.Skipped = r.Skipped()
	if st.Requests == 0 {
		return st, nil
	}
	for nextSample <= lastMs {
		sample(nextSample)
		nextSample += every
	}
	if nextSample-every < lastMs || st.WorkingSetSamples == 0 {
		sample(lastMs)
	}

	st.Sessions = len(sessions)
	turns := make(map[int]int)
	for _, s := range sessions {
		turns[s.turns]++
	}
	keys := make([]int, 0, len(turns))
	for k := range turns {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	st.TurnsPerSessionMax = keys[len(keys)-1]
	half, cum := (st.Sessions+1)/2, 0
	for _, k := range keys {
		cum += turns[k]
		if cum >= half {
			st.TurnsPerSessionP50 = k
			break
		}
	}

	st.DurationS = float64(lastMs-firstMs) / 1000
	if ms := float64(lastMs - firstMs); ms > 0 {
		st.PromptTokensPerMin = float64(st.PromptTokens) * 60000 / ms
		st.OutputTokensPerMin = float64(st.OutputTokens) * 60000 / ms
	}
	st.ContextTokensP50 = ctx.quantile(0.50)
	st.ContextTokensP90 = ctx.quantile(0.90)
	st.ContextTokensP99 = ctx.quantile(0.99)
	st.ContextTokensMax = ctx.max
	st.DistinctBlocks = int64(len(seen))
	if st.FullBlocks > 0 {
		st.ReuseUpperBoundPct = 100 * float64(st.ReusedBlocks) / float64(st.FullBlocks)
	}
	st.ReuseUpperBoundTokenPct = 100 * float64(st.ReusedBlocks*int64(B)) / float64(st.PromptTokens)
	st.ActiveSessionsP50 = active.quantile(0.5)
	st.ActiveSessionsMax = active.max
	st.WorkingSetTokensP50 = working.quantile(0.5)
	st.WorkingSetTokensMax = working.max
	return st, nil
}

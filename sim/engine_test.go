package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/traces"
)

func engineTestFarm(t *testing.T, blocks, batched int) *Farm {
	t.Helper()
	spec := fmt.Sprintf(`model: Qwen/Qwen3-4B-Instruct-2507
gpu: RTX A4000
replicas: 1
vllm: {max_num_seqs: 4, max_num_batched_tokens: %d, num_gpu_blocks: %d}
`, batched, blocks)
	f, err := ParseFarm([]byte(spec), "engine.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// engineTestRequests are requests that share prefixes (equal leading hash
// ids), arrive close together and overrun a small KV cache.
func engineTestRequests() []*traces.Request {
	var reqs []*traces.Request
	for i := range 12 {
		prompt := 300 + 97*(i%5)
		ids := make([]uint64, (prompt+15)/16)
		for k := range ids {
			ids[k] = uint64(k + 1) // a shared chain ...
			if k >= 8 {
				ids[k] = uint64(1000*(i%3+1) + k) // ... then one of three branches
			}
		}
		reqs = append(reqs, &traces.Request{
			ArrivalMs:    int64(i * 37),
			Session:      fmt.Sprintf("s%d", i),
			PromptTokens: prompt,
			OutputTokens: 20 + 13*(i%4),
			HashIDs:      ids,
		})
	}
	return reqs
}

// logDriver replays requests open loop and logs every request that leaves.
type logDriver struct {
	openLoop
	log *[]string
	now func() int64
}

func (d *logDriver) done(r *run, s *seq, finished bool) {
	*d.log = append(*d.log, fmt.Sprintf("%d done=%v at %d gen %d", s.id, finished, r.now, s.generated))
	d.openLoop.done(r, s, finished)
}

// TestEngineReplicaMatchesRun drives one EngineReplica and one replica of a
// simulated run with the same arrivals: every token and every departure
// happens at the same virtual time, preemptions included (same code path).
func TestEngineReplicaMatchesRun(t *testing.T) {
	f := engineTestFarm(t, 60, 512) // 59 usable blocks: 944 tokens, preemptions
	reqs := engineTestRequests()

	r, err := newRun(f, placement.StrategyLeastLoaded, f.Spill)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	logToken := func(s *seq) {
		want = append(want, fmt.Sprintf("%d token %d at %d cached %d", s.id, s.generated, r.now, s.cachedTokens))
	}
	first := r.reps[0].firstToken
	r.reps[0].firstToken = func(s *seq) { first(s); logToken(s) }
	// A per-token hook replaces the run's batched one (nextTokens).
	r.reps[0].nextToken = func(s *seq, now int64) { r.onNextTokens(0, now-s.lastTokenUs, 1); logToken(s) }
	r.drv = &logDriver{openLoop: openLoop{reqs: reqs, speed: 1, homes: map[string]int{}}, log: &want}
	r.drv.(*logDriver).begin(r)
	if err := r.loop(context.Background(), math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if r.reps[0].stats.preemptions == 0 {
		t.Fatal("the scenario should preempt (a smaller KV cache is needed)")
	}

	e := NewEngineReplica(f, 0)
	var got []string
	emit := func(ev EngineEvent) {
		at := ev.At.Microseconds()
		switch ev.Kind {
		case EventToken:
			got = append(got, fmt.Sprintf("%d token %d at %d cached %d", ev.ID, ev.Generated, at, ev.CachedTokens))
		default:
			got = append(got, fmt.Sprintf("%d done=%v at %d gen %d", ev.ID, ev.Kind == EventFinished, at, ev.Generated))
		}
	}
	for i, req := range reqs {
		e.Advance(time.Duration(req.ArrivalMs)*time.Millisecond, emit)
		id, err := e.Submit(req, 0)
		if err != nil || id != i {
			t.Fatalf("Submit #%d = %d, %v", i, id, err)
		}
	}
	e.Advance(time.Hour, emit)
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("event %d: engine %q, run %q (of %d / %d)", i, got[i], want[i], len(got), len(want))
			}
		}
		t.Fatalf("engine gave %d events, run %d", len(got), len(want))
	}
	st := e.Stats()
	rs := r.reps[0].stats
	if st.PrefixQueries != rs.queries || st.PrefixHits != rs.hits || st.Preemptions != rs.preemptions ||
		st.GenerationTokens != rs.generationTokens || st.PromptTokens != rs.promptTokens || st.Steps != rs.steps {
		t.Errorf("stats %+v, run %+v", st, rs)
	}
	if st.PrefixHits == 0 {
		t.Error("shared prefixes gave no hit")
	}
	if !e.Idle() || st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 {
		t.Errorf("after the end: idle %v, %+v", e.Idle(), st)
	}
	if err := checkPool(e.rep); err != nil {
		t.Error(err)
	}
}

func TestEngineReplicaAbort(t *testing.T) {
	f := engineTestFarm(t, 2000, 8192)
	e := NewEngineReplica(f, 0)
	var events []EngineEvent
	emit := func(ev EngineEvent) { events = append(events, ev) }
	reqs := engineTestRequests()
	ids := make([]int, 6)
	for i := range ids {
		var err error
		if ids[i], err = e.Submit(reqs[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(0, emit) // the first step starts: max_num_seqs 4 run, 2 wait
	if st := e.Stats(); st.Running != 4 || st.Waiting != 2 {
		t.Fatalf("running %d waiting %d, want 4 and 2", st.Running, st.Waiting)
	}
	e.Abort(ids[5], emit) // waiting: gone at once
	if len(events) != 1 || events[0].ID != ids[5] || events[0].Kind != EventAborted {
		t.Fatalf("abort of a waiting request: events %+v", events)
	}
	e.Abort(ids[0], emit) // running, step in flight: gone when it ends
	if len(events) != 1 {
		t.Fatalf("abort during a step emitted %+v", events[1:])
	}
	end, busy := e.NextStepEnd()
	if !busy {
		t.Fatal("no step in flight")
	}
	e.Advance(end, emit)
	i := slices.IndexFunc(events, func(ev EngineEvent) bool { return ev.ID == ids[0] })
	if i < 0 || events[i].Kind != EventAborted {
		t.Fatalf("request 0 not aborted at the step end: %+v", events)
	}
	e.Abort(ids[0], emit) // already gone: ignored
	e.Advance(time.Hour, emit)
	if !e.Idle() {
		t.Fatal("requests left")
	}
	st := e.Stats()
	if st.Aborted != 2 || st.FinishedStop != 4 {
		t.Errorf("aborted %d finished %d, want 2 and 4", st.Aborted, st.FinishedStop)
	}
	if err := checkPool(e.rep); err != nil {
		t.Error(err)
	}
}

func TestEngineReplicaRejects(t *testing.T) {
	f := engineTestFarm(t, 10, 512) // 9 usable blocks: 144 tokens
	e := NewEngineReplica(f, 0)
	if e.Fits(140, 10) {
		t.Error("Fits(140, 10) on 144 tokens")
	}
	if _, err := e.Submit(&traces.Request{PromptTokens: 140, OutputTokens: 10}, 0); !errors.Is(err, ErrNeverFits) {
		t.Errorf("Submit too long: %v, want ErrNeverFits", err)
	}
	if _, err := e.Submit(&traces.Request{PromptTokens: 0, OutputTokens: 10}, 0); err == nil {
		t.Error("Submit of an empty prompt succeeded")
	}
	id, err := e.Submit(&traces.Request{PromptTokens: 100, OutputTokens: 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	var last EngineEvent
	e.Advance(time.Minute, func(ev EngineEvent) { last = ev })
	if last.ID != id || last.Kind != EventFinished || !last.LengthCapped || last.Generated != 3 {
		t.Errorf("last event %+v", last)
	}
	if st := e.Stats(); st.FinishedLength != 1 || st.GenerationTokens != 3 || st.NumGPUBlocks != 10 || st.BlockSize != 16 {
		t.Errorf("stats %+v", st)
	}
}

func newRun(f *Farm, strategy string, spill placement.SpillThreshold) (*run, error) {
	return newRunLean(f, strategy, spill, false, 1)
}

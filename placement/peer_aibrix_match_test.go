package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// plainMatch is AIBrix's matchPods walk as its code reads: each block in
// turn, each ready pod either holding it (its percentage is the block's)
// or leaving the candidates; the walk ends at the first block absent from
// the store or held by no candidate left.
func plainMatch(a *AIBrix, r *Request, ready []bool, pct []int) bool {
	total := r.Prompt.tokens(r.PromptTokens)
	if total == 0 {
		return false
	}
	salt, cum, found := fnv1a64(r.Model), 0, false
	for j, id := range r.Prompt.Blocks {
		cum += r.Prompt.blockLen(j, total)
		k, ok := a.store.idx.get(aibKey(id, salt))
		if !ok {
			break
		}
		e := &a.store.ents[k]
		hit := false
		for i := range ready {
			switch {
			case !ready[i]:
			case e.pods.word(i/64)>>(i%64)&1 != 0:
				pct[i], hit = cum*100/total, true
			default:
				ready[i] = false
			}
		}
		found = found || hit
		if !hit {
			break
		}
	}
	return found
}

// storeState lists the store's entries from the most recently put: key,
// weight, time and pods.
func storeState(s *aibStore) []string {
	var out []string
	for i := s.head; i >= 0; i = s.ents[i].next {
		e := &s.ents[i]
		out = append(out, fmt.Sprint(e.key, e.w, e.at, e.pods.lo, e.pods.hi))
	}
	return out
}

// TestAIBrix_MatchAsThePlainWalk checks match (candidates as bits, each
// pod's percentage written when it leaves) against the plain walk, and
// put given the entries match found against put looking each block up,
// on random conversations over farms below and above 64 pods, with a
// store small enough to evict.
func TestAIBrix_MatchAsThePlainWalk(t *testing.T) {
	for _, pods := range []int{5, 64, 130} {
		t.Run(fmt.Sprint(pods, " pods"), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(pods), 1))
			a := NewAIBrix(AIBrixConfig{Seed: 1, Blocks: 20000})
			twin := NewAIBrix(AIBrixConfig{Seed: 1, Blocks: 20000}) // puts without the entries found
			var convs [][]uint64
			now, matched := t0, 0
			for step := range 2000 {
				now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
				k := rng.IntN(len(convs) + 1)
				if k == len(convs) {
					convs = append(convs, nil)
				}
				toks := convs[k]
				if len(toks) > 300 { // a new conversation
					toks = nil
				}
				if rng.IntN(5) == 0 { // an edited turn
					toks = toks[:rng.IntN(len(toks)+1)]
				}
				for range 1 + rng.IntN(40) {
					toks = append(toks, rng.Uint64N(50))
				}
				convs[k] = toks
				p := tokenPrompt(toks...)
				p.BlockTokens = 1 + rng.IntN(16)
				r := Request{PromptTokens: len(p.Blocks)*p.BlockTokens - rng.IntN(p.BlockTokens), Prompt: p, Model: "m"}

				at := now.UnixNano()
				a.store.expire(at - a.cfg.IdleTTL.Nanoseconds())
				twin.store.expire(at - twin.cfg.IdleTTL.Nanoseconds())
				ready := make([]bool, pods)
				for i := range ready {
					ready[i] = rng.IntN(8) > 0
				}
				wantPct := slices.Repeat([]int{-1}, pods)
				wantReady := slices.Clone(ready)
				want := plainMatch(a, &r, wantReady, wantPct)
				a.ready = slices.Clone(ready)
				a.pct = slices.Repeat([]int{-1}, pods)
				if got := a.match(&r); got != want || !slices.Equal(a.pct, wantPct) || !slices.Equal(a.ready, wantReady) {
					t.Fatalf("step %d: match %v pct %v ready %v,\nwant %v pct %v ready %v", step, got, a.pct, a.ready, want, wantPct, wantReady)
				}
				if want {
					matched++
				}

				pod := rng.IntN(pods)
				a.put(&r, pod, at, a.found)
				twin.put(&r, pod, at, nil)
				if step%100 != 99 {
					continue
				}
				if got, want := storeState(&a.store), storeState(&twin.store); !slices.Equal(got, want) {
					t.Fatalf("step %d: store after put with the entries found\n%v\nwant\n%v", step, got, want)
				}
			}
			if matched < 200 {
				t.Errorf("%d of 2000 requests matched a prefix: too few to test the walk", matched)
			}
		})
	}
}

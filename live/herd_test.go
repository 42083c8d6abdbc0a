package live

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/lm-warden/warden/internal/fakevllm"
)

// TestNewConversationsArrivingTogetherSpread: new conversations that
// arrive at the same moment are placed one after another, each seeing what
// the earlier picks did (under the model's lock, pick counts the request in
// flight and the policy's table homes the conversation, which the score's
// active-conversations term reads at once), so they spread over the
// replicas rather than herd onto the one that looked idlest to all of
// them. (Either signal alone spreads them: the test fails when new
// conversations ignore both.) Herding would
// put first turns of a step in step on one engine, each queued behind
// another's whole prefill: the TTFB tail that sim/testdata/validation's
// README traces.
func TestNewConversationsArrivingTogetherSpread(t *testing.T) {
	for _, tc := range []struct{ ranks, sessions int }{{4, 4}, {4, 8}, {3, 7}} {
		t.Run(fmt.Sprintf("%d sessions on %d ranks", tc.sessions, tc.ranks), func(t *testing.T) {
			f := fakevllm.New(t, tc.ranks)
			f.Hold = make(chan struct{})
			h := startProxy(t, modelsYAML("", fmt.Sprintf("  - name: qwen\n    url: %s\n    data_parallel_size: %d\n", f.URL(), tc.ranks)))
			h.scraped()
			start := make(chan struct{})
			var wg sync.WaitGroup
			for k := range tc.sessions {
				wg.Go(func() {
					<-start
					id := fmt.Sprintf("together-%d", k)
					if r := h.do("POST", "/v1/chat/completions", chatBody(testModel, id, 0, true), sessionHdr(id)); r.status != 200 {
						t.Errorf("%s: %d %s", id, r.status, r.body)
					}
				})
			}
			close(start)
			h.waitFor("every first turn at a rank", func(StatusReport) bool { return sum(f.Served()) == tc.sessions })
			got := f.Served()
			lo, hi := slices.Min(got), slices.Max(got)
			if hi-lo > 1 {
				t.Errorf("per rank %v: %d conversations arriving together herded (want %d or %d per rank)", got, tc.sessions, tc.sessions/tc.ranks, (tc.sessions+tc.ranks-1)/tc.ranks)
			}
			close(f.Hold)
			wg.Wait()
		})
	}
}

package placement

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Replica is what a policy may know about one replica: only what live mode
// can really observe. Scraped fields may be stale by up to one scrape
// interval, in the simulator exactly as in the proxy.
type Replica struct {
	ID       int     // stable index; also the vLLM data-parallel rank when one server holds all ranks
	InFlight int     // requests the router has sent and not yet seen finish (instant, local)
	Running  int     // vllm:num_requests_running (scraped, may be stale)
	Waiting  int     // vllm:num_requests_waiting (scraped, may be stale)
	KVUsage  float64 // vllm:kv_cache_usage_perc, 0..1 (scraped, may be stale)
	Sessions int     // active conversations homed here (filled by the session table, see Table.Fill)
	Healthy  bool
	// Key is the replica's identity across processes, for hashing (live:
	// a hash of its URL and rank), so that proxies listing the same
	// replicas in another order hash a session to the same one; 0 means
	// the ID is the identity (the simulator).
	Key uint64

	// What the KV-aware options (Config.Balance, Config.Spill priced,
	// Config.Admission) know besides; zero means unknown, and an option
	// that needs a field it does not have falls back to the seed rule.

	// KVCapacityTokens is the replica's KV cache in tokens: num_gpu_blocks
	// x block_size (the farm in sim; vllm:cache_config_info in live).
	KVCapacityTokens int
	// FootprintTokens is the sum, over the active conversations homed
	// here, of each one's last prompt + answer tokens (Table.Fill writes
	// it; ReplicaCounters.Footprint).
	FootprintTokens int
	// PrefillTokensPerSec is how fast the replica computes an uncached
	// prompt (the step-time model in sim; calibration or config in live).
	PrefillTokensPerSec float64
	// PrefillQueueTokens is the router's own estimate of the prompt tokens
	// still to prefill ahead of a new arrival: the sum of Decision.Uncached
	// over the requests it sent here that have not yet produced a first
	// token (instant, local, like InFlight).
	PrefillQueueTokens int
}

// Snapshot is the state of all replicas of one model at one instant.
type Snapshot struct {
	Replicas   []Replica // sorted by ID; ID == index
	MaxNumSeqs int       // vLLM's max_num_seqs per replica
	// Generation changes every time the scraped fields are refreshed (one
	// scrape). Policies that keep local corrections between refreshes, as
	// vLLM's own balancer does, reset them when it changes.
	Generation uint64
}

// NoPin is the value of Request.Pinned when the client pinned no replica.
const NoPin = -1

// Request is what a policy needs to know about one request.
type Request struct {
	Session      string // opaque session id ("" only if the caller could not derive one)
	Parent       string // parent session of a subagent, or ""
	Model        string
	PromptTokens int
	Pinned       int // replica chosen by a trusted client, or NoPin
	// Failed lists replicas that failed this very request a moment ago
	// (the proxy's one retry). The caller shows them to the policy as
	// unhealthy; a session homed on one keeps its home (its prefix cache
	// is still there) and this request spills instead of re-homing.
	Failed []int
	// SharedPrefixTokens is how many leading tokens of the prompt the
	// caller knows to be shared by every conversation (a common system
	// prompt), 0 when unknown. The priced spill counts them as cached on
	// any replica that holds a conversation.
	SharedPrefixTokens int
	// ID identifies the request while it is in flight (the simulator's
	// request number, the proxy's counter): policies that follow requests
	// after placing them (Tracker) key their state by it.
	ID uint64
	// Prompt is the prompt's content as block ids (prompt.go), for the
	// prefix-aware peers' policies; empty when the caller has none.
	Prompt Prompt
}

// failed reports whether replica i is in r.Failed.
func (r *Request) failed(i int) bool {
	for _, f := range r.Failed {
		if f == i {
			return true
		}
	}
	return false
}

// Reason says why a replica was chosen.
type Reason uint8

const (
	ReasonNew         Reason = iota // a new conversation placed on the least-loaded replica
	ReasonSticky                    // a later turn served by its home
	ReasonSpill                     // home over the spill threshold: served elsewhere this once
	ReasonHash                      // hash strategy
	ReasonLeastLoaded               // least-loaded strategy (vLLM's balancer), or affinity off
	ReasonPinned                    // a trusted client pinned the replica
	ReasonParent                    // a subagent's new session placed on its parent's home
	ReasonRehome                    // a later turn of a conversation cold at home, placed afresh (observed.go)
	ReasonPrefix                    // placed where its prefix is held (affinity, prefix.go) or indexed (a peer's router)
	ReasonScore                     // a peer's router: the best of a score or cost over every replica
	numReasons
)

// NumReasons is the number of reasons: Reason(0) .. Reason(NumReasons-1)
// are every reason a policy gives. The simulator and the proxy size their
// per-reason counters and metric series by it.
const NumReasons = int(numReasons)

var reasonNames = [numReasons]string{"new", "sticky", "spill", "hash", "least-loaded", "pinned", "parent", "rehome", "prefix", "score"}

// Reasons returns every reason, in order.
func Reasons() []Reason {
	rs := make([]Reason, numReasons)
	for i := range rs {
		rs[i] = Reason(i)
	}
	return rs
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// ParseReason is the inverse of Reason.String.
func ParseReason(s string) (Reason, error) {
	for i, n := range reasonNames {
		if n == s {
			return Reason(i), nil
		}
	}
	return 0, fmt.Errorf("unknown reason %q (want one of %s)", s, strings.Join(reasonNames[:], ", "))
}

// Stay classifies one request for the "stayed on replica" KPI: the one
// rule of the simulator and the proxy. A later turn (turn > 0) of a
// session is counted, and it stayed when it was served by the replica that
// served the session's first turn (turn 0), whatever happened in between:
// a turn that spilled did not stay, nor did the turns of a session re-homed
// (its first replica failed) that follow its new home. A first turn is not
// counted.
func Stay(later bool, first, served int) (counted, stayed bool) {
	return later, later && served == first
}

// StayCount counts requests by Stay: Later of them counted, Home stayed.
// The KPI is 100*Home/Later (metrics/kpi.promql stayed_pct, from the
// warden_later_turns_total and warden_later_turns_home_total counters).
type StayCount struct {
	Later, Home int64
}

// Add counts one request (Stay's arguments).
func (c *StayCount) Add(later bool, first, served int) {
	counted, stayed := Stay(later, first, served)
	if counted {
		c.Later++
	}
	if stayed {
		c.Home++
	}
}

// Pct is 100*Home/Later, NaN before any later turn.
func (c StayCount) Pct() float64 {
	if c.Later == 0 {
		return math.NaN()
	}
	return 100 * float64(c.Home) / float64(c.Later)
}

// Decision is a policy's answer.
type Decision struct {
	Replica int
	Reason  Reason
	// Wait is set (with Config.Admission kv) when a new conversation's
	// expected footprint fits on no replica: Replica is then -1, nothing
	// was recorded, and the caller holds the request (FIFO, see WaitQueue)
	// and asks again when a conversation ends or goes idle.
	Wait bool
	// Uncached is the policy's estimate of the prompt tokens the chosen
	// replica must compute (set by the priced spill and the KV balance;
	// else 0). The caller adds it to Replica.PrefillQueueTokens until the
	// request's first token.
	Uncached int32
	// HomeTTFT and ElsewhereTTFT are the expected times to first token, in
	// seconds, that a priced decision compared (home, and the best other
	// replica); zero when no price was computed.
	HomeTTFT, ElsewhereTTFT float32
}

// ErrNoHealthyReplica is returned (wrapped) when no replica can take a request.
var ErrNoHealthyReplica = errors.New("no healthy replica")

// Policy picks a replica for a request. Implementations are not safe for
// concurrent use unless they say so; now is passed in, never read from a clock.
type Policy interface {
	Pick(r *Request, s *Snapshot, now time.Time) (Decision, error)
}

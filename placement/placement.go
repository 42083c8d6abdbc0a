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
	numReasons
)

// NumReasons is the number of reasons: Reason(0) .. Reason(NumReasons-1)
// are every reason a policy gives. The simulator and the proxy size their
// per-reason counters and metric series by it.
const NumReasons = int(numReasons)

var reasonNames = [numReasons]string{"new", "sticky", "spill", "hash", "least-loaded", "pinned", "parent"}

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
}

// ErrNoHealthyReplica is returned (wrapped) when no replica can take a request.
var ErrNoHealthyReplica = errors.New("no healthy replica")

// Policy picks a replica for a request. Implementations are not safe for
// concurrent use unless they say so; now is passed in, never read from a clock.
type Policy interface {
	Pick(r *Request, s *Snapshot, now time.Time) (Decision, error)
}

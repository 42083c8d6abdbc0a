package placement

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Config configures a strategy (Strategy.New); the zero value is the
// default. Its fields are affinity's options; the hash and least-loaded
// strategies ignore them.
type Config struct {
	// Disabled switches affinity off for a model: the policy then behaves
	// exactly like LeastLoaded (it runs the same code) and keeps no table.
	Disabled bool
	// Spill is the in-flight count above which a later turn leaves its
	// home; the zero value is auto (a quarter of max_num_seqs).
	Spill SpillThreshold
	// SessionTTL is how long an idle conversation keeps its home;
	// zero means DefaultSessionTTL.
	SessionTTL time.Duration
	// MaxSessions caps the session table; zero means DefaultMaxSessions.
	MaxSessions int
	// ActiveWindow is how recently a conversation must have sent a request
	// to count as one its home holds when new conversations are placed
	// ("conversations held" are active ones). A finished conversation keeps
	// its home for SessionTTL, so a returning one still goes home, but stops
	// counting as load once it has been quiet for longer than the window.
	// Zero means learned: from the gaps between each conversation's
	// requests, from DefaultActiveWindow (two minutes: a few agent turn
	// gaps, see there) up, so that a conversation whose user pauses for
	// minutes still counts on its home (activity.go); a window longer than
	// SessionTTL acts as SessionTTL.
	ActiveWindow time.Duration
	// Balance is what a new conversation is balanced on: BalanceSessions
	// (the zero value: the load score, see Affinity) or BalanceKV (the
	// most KV headroom, see kv.go).
	Balance Balance
	// Admission, when AdmissionKV, makes a new conversation whose expected
	// footprint fits on no replica wait (Decision.Wait); see kv.go.
	Admission Admission
	// Rehome, when RehomeCold, places the next turn of a conversation
	// found cold at its home (its answer's cached tokens: Table.ObserveHits)
	// as a new conversation, reason rehome; see observed.go.
	Rehome Rehome
	// Prefix, when PrefixHeld, reads how much of the prompt each replica
	// holds now (Prompt.Held): a conversation its home has lost moves
	// before its turn is sent, and one without a session id, or a
	// subagent, starts where its prefix already is; see prefix.go.
	Prefix PrefixUse
	// Seed seeds the random draws of a policy that breaks ties at random
	// (the peers' routers); affinity draws none.
	Seed uint64
}

// Balance selects how new conversations are spread (routing.balance).
type Balance uint8

const (
	BalanceSessions Balance = iota // the load score: in-flight, KV fill, conversations held
	BalanceKV                      // the most KV headroom, in-flight as tie-break
)

// ParseBalance reads "sessions" (or "") and "kv".
func ParseBalance(s string) (Balance, error) {
	switch s {
	case "", "sessions":
		return BalanceSessions, nil
	case "kv":
		return BalanceKV, nil
	}
	return 0, fmt.Errorf("placement: balance %q: want sessions or kv", s)
}

func (b Balance) String() string {
	if b == BalanceKV {
		return "kv"
	}
	return "sessions"
}

// MarshalText implements encoding.TextMarshaler.
func (b Balance) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *Balance) UnmarshalText(text []byte) error {
	v, err := ParseBalance(string(text))
	if err == nil {
		*b = v
	}
	return err
}

// Admission selects whether new conversations wait for KV headroom
// (routing.admission).
type Admission uint8

const (
	AdmissionOff Admission = iota // every new conversation is placed at once
	AdmissionKV                   // wait while its expected footprint fits nowhere
)

// AdmissionRetryAfter is the Retry-After of a new conversation refused
// after its admission wait (the proxy's 429 / 529, live/admission.go):
// conversations end in seconds to minutes. The simulator's session
// replay retries after it, as the clients' SDKs do.
const AdmissionRetryAfter = 5 * time.Second

// ParseAdmission reads "off" (or "") and "kv".
func ParseAdmission(s string) (Admission, error) {
	switch s {
	case "", "off":
		return AdmissionOff, nil
	case "kv":
		return AdmissionKV, nil
	}
	return 0, fmt.Errorf("placement: admission %q: want off or kv", s)
}

func (a Admission) String() string {
	if a == AdmissionKV {
		return "kv"
	}
	return "off"
}

// MarshalText implements encoding.TextMarshaler.
func (a Admission) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Admission) UnmarshalText(text []byte) error {
	v, err := ParseAdmission(string(text))
	if err == nil {
		*a = v
	}
	return err
}

// Validate reports a configuration that cannot be used, naming the field.
func (c Config) Validate() error {
	if c.SessionTTL < 0 {
		return fmt.Errorf("placement: SessionTTL %v is negative (want 0 for the default %v, or more)", c.SessionTTL, DefaultSessionTTL)
	}
	if c.ActiveWindow < 0 {
		return fmt.Errorf("placement: ActiveWindow %v is negative (want 0 for the default %v, or more)", c.ActiveWindow, DefaultActiveWindow)
	}
	if c.Balance > BalanceKV {
		return fmt.Errorf("placement: Balance %d is unknown (want BalanceSessions or BalanceKV)", c.Balance)
	}
	if c.Admission > AdmissionKV {
		return fmt.Errorf("placement: Admission %d is unknown (want AdmissionOff or AdmissionKV)", c.Admission)
	}
	if c.Rehome > RehomeCold {
		return fmt.Errorf("placement: Rehome %d is unknown (want RehomeOff or RehomeCold)", c.Rehome)
	}
	if c.Prefix > PrefixHeld {
		return fmt.Errorf("placement: Prefix %d is unknown (want PrefixOff or PrefixHeld)", c.Prefix)
	}
	if c.MaxSessions < 0 {
		return fmt.Errorf("placement: MaxSessions %d is negative (want 0 for the default %d, or more)", c.MaxSessions, DefaultMaxSessions)
	}
	return nil
}

// SpillThreshold is the in-flight count of a home replica above which a
// later turn spills elsewhere: either auto, max(1, max_num_seqs/4), or a
// fixed number. The zero value is auto. It may instead be priced
// (SpillPriced): a later turn then leaves home only when its expected time
// to first token there exceeds the one elsewhere (see kv.go); Resolve
// then gives auto's number, which still bounds a subagent's placement on
// its parent's home.
type SpillThreshold struct {
	n      int
	fixed  bool
	priced bool
}

// SpillPriced returns the priced threshold.
func SpillPriced() SpillThreshold { return SpillThreshold{priced: true} }

// Priced reports whether spills are decided by price.
func (t SpillThreshold) Priced() bool { return t.priced }

// SpillAt returns a fixed threshold of n requests in flight; n below 1 is
// 1, the smallest threshold (ParseSpillThreshold refuses it instead).
func SpillAt(n int) SpillThreshold { return SpillThreshold{n: max(n, 1), fixed: true} }

// SpillThresholdError is the message of ParseSpillThreshold's error for s:
// the planner, the simulator and the proxy print it after the field's name.
func SpillThresholdError(s string) string {
	msg := fmt.Sprintf("want auto, priced or a positive integer, got %q", s)
	if n, err := strconv.Atoi(s); err == nil && n == 0 {
		msg += " (a later turn spills when its home has more requests in flight than the threshold: 0 would spill every turn whose home is busy at all)"
	}
	return msg
}

// ParseSpillThreshold parses "auto", "priced" or a positive integer. It is
// the one rule for every spill threshold (the planner's spill_thresholds,
// the simulator's routing.spill_threshold and --spill-threshold, the
// proxy's spill_threshold): 0 is refused, as auto never resolves below 1. A
// home never spills while it has at most the threshold in flight, so
// "never spill" is a threshold above any in-flight count the farm reaches.
// The error's text is SpillThresholdError(s).
func ParseSpillThreshold(s string) (SpillThreshold, error) {
	switch s {
	case "auto":
		return SpillThreshold{}, nil
	case "priced":
		return SpillPriced(), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return SpillThreshold{}, errors.New(SpillThresholdError(s))
	}
	return SpillAt(n), nil
}

// Auto reports whether the threshold follows max_num_seqs (also true
// when priced: its number is auto's).
func (t SpillThreshold) Auto() bool { return !t.fixed }

// Resolve returns the threshold for replicas with the given max_num_seqs.
func (t SpillThreshold) Resolve(maxNumSeqs int) int {
	if t.fixed {
		return t.n
	}
	return max(1, maxNumSeqs/4)
}

// String returns "auto", "priced" or the number, as ParseSpillThreshold
// reads it.
func (t SpillThreshold) String() string {
	if t.priced {
		return "priced"
	}
	if !t.fixed {
		return "auto"
	}
	return strconv.Itoa(t.n)
}

// MarshalText implements encoding.TextMarshaler.
func (t SpillThreshold) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (t *SpillThreshold) UnmarshalText(b []byte) error {
	v, err := ParseSpillThreshold(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

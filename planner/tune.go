package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lm-warden/warden/hardware"
	"github.com/lm-warden/warden/internal/num"
	"github.com/lm-warden/warden/placement"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/traces"
)

// This file is `warden tune`'s planning: the proxy's journal replayed on a
// farm once per routing variant (session by session, as sim's session
// replay does), and the rule that recommends one. The command parses its
// flags and writes the result, and turns the recommendation into the proxy
// config's keys, which it checks with the proxy's own loader.

// TuneTie is how close to the most output tokens/min a variant must be to
// count as a tie, relative: then the one with fewer options is
// recommended (one more mechanism is not worth 1 %).
const TuneTie = 0.01

// TuneRule is the recommendation rule, said in the help and the output.
const TuneRule = `the most output tokens/min among the variants whose TTFB p95
is no worse than the best plain strategy's (hash, least-loaded, affinity);
within 1 % of the most counts as a tie, and a tie goes to the variant with
fewer options (kv, priced, admit), then to the earlier one in the list.
A priced variant's block sets prefill_tokens_per_s: metrics, the rate the
proxy measures on each replica (the simulator prices with its step-time
model).`

// TuneResult is what `warden tune --json` prints.
type TuneResult struct {
	Journal  TuneJournal `json:"journal"`
	Farm     string      `json:"farm"`
	Seed     uint64      `json:"seed"`
	Notes    []string    `json:"notes,omitempty"`
	Variants []TuneRow   `json:"variants"`
	Rule     string      `json:"rule"`
	// Reference is the best TTFB p95 of the plain strategies, and
	// ReferenceVariant the one that has it.
	Reference        sim.Float `json:"reference_ttfb_p95_s"`
	ReferenceVariant string    `json:"reference_variant"`
	// Recommended is the index in Variants of the recommendation, Why the
	// sentence that says why.
	Recommended int    `json:"recommended"`
	Why         string `json:"why"`
	// Routing is the recommended routing as the proxy config's YAML.
	Routing string `json:"routing_yaml"`
}

// TuneJournal describes the journal replayed.
type TuneJournal struct {
	Files     []string  `json:"files"` // oldest first
	Model     string    `json:"model"`
	Requests  int       `json:"requests"`
	Sessions  int       `json:"sessions"`
	DurationS sim.Float `json:"duration_s"` // first to last arrival
	Skipped   int       `json:"skipped_other_models,omitempty"`
	Empty     []string  `json:"empty_files,omitempty"` // empty files skipped
}

// TuneRow is one variant's replay.
type TuneRow struct {
	Variant            string    `json:"variant"` // as given: affinity+kv+admit=30s
	Name               string    `json:"name"`    // as tables name it: affinity (kv, admit 30s)
	Options            int       `json:"options"` // options named: kv, priced, admit
	PrefixHitPct       sim.Float `json:"prefix_hit_pct"`
	TTFBP50            sim.Float `json:"ttfb_p50_s"`
	TTFBP95            sim.Float `json:"ttfb_p95_s"`
	OutputTokensPerMin sim.Float `json:"output_tokens_per_min"`
	SessionsPerHour    sim.Float `json:"sessions_per_hour"`
	Finished           int64     `json:"finished"`
	Unfinished         int64     `json:"unfinished"`
	AdmissionWaits     int64     `json:"admission_waits"`
	AdmissionRefused   int64     `json:"admission_refused"`
	AdmissionRetries   int64     `json:"admission_retries"` // of the refused, sent again after Retry-After
	Eligible           bool      `json:"eligible"`          // TTFB p95 within the reference
	// Peer: a router the proxy does not serve (placement.Strategy.Proxy
	// false, a peer's), replayed for comparison: neither the reference
	// nor a recommendation.
	Peer bool `json:"peer,omitempty"`

	Spec placement.Spec `json:"-"` // the variant parsed
}

// TuneOptions is what Tune replays, on which farm, through which variants.
type TuneOptions struct {
	Files    []string  // the journal's files, oldest first (JournalFiles)
	Model    string    // the model whose requests are replayed; "": the journal's only one
	Farm     *sim.Farm // the farm, with the routing every variant shares
	Variants []string  // as placement.ParseSpec reads them
	Seed     uint64
}

// Tune replays the journal of o on o.Farm once per variant and recommends
// one by TuneRule. The result's Routing is left to the caller, which knows
// the proxy's configuration.
func Tune(ctx context.Context, o TuneOptions) (*TuneResult, error) {
	trace, jr, err := LoadJournal(o.Files, o.Model)
	if err != nil {
		return nil, err
	}
	res := &TuneResult{Journal: jr, Farm: o.Farm.Name(), Seed: o.Seed, Rule: strings.Join(strings.Fields(TuneRule), " ")}
	note, err := checkJournalModel(jr.Model, o.Farm)
	if err != nil {
		return nil, err
	}
	if note != "" {
		res.Notes = append(res.Notes, note)
	}
	if note := compressionNote(JournalCompression(trace, o.Farm), o.Farm); note != "" {
		res.Notes = append(res.Notes, note)
	}
	rep, err := sim.Run(ctx, sim.Experiment{Farm: o.Farm, Strategies: o.Variants, Trace: trace, SessionReplay: true, Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	var peers []string
	for i, v := range o.Variants {
		spec, _ := placement.ParseSpec(v)
		st, _ := placement.LookupStrategy(spec.Strategy)
		if !st.Proxy {
			peers = append(peers, v)
		}
		r := rep.Rows[i]
		res.Variants = append(res.Variants, TuneRow{
			Variant: v, Name: r.Strategy, Options: numOptions(spec),
			PrefixHitPct: r.PrefixHitPct, TTFBP50: r.TTFBP50, TTFBP95: r.TTFBP95,
			OutputTokensPerMin: r.OutputTokensPerMin, SessionsPerHour: r.SessionsPerHour,
			Finished: r.Finished, Unfinished: r.Unfinished,
			AdmissionWaits: r.AdmissionWaits, AdmissionRefused: r.AdmissionRefused, AdmissionRetries: r.AdmissionRetries,
			Spec: spec, Peer: !st.Proxy,
		})
	}
	if len(peers) > 0 {
		res.Notes = append(res.Notes, strings.Join(peers, ", ")+": routers the proxy does not serve, replayed for comparison; the reference and the recommendation are among the proxy's routings")
	}
	if err := Recommend(res); err != nil {
		return nil, err
	}
	return res, nil
}

// numOptions counts the options a variant names.
func numOptions(v placement.Spec) int { return len(v.On()) }

// Recommend applies TuneRule to res.Variants, of which the peers' routers
// (TuneRow.Peer) take no part.
func Recommend(res *TuneResult) error {
	vs := res.Variants
	ref, refName := math.Inf(1), ""
	plain := false
	for _, v := range vs {
		if v.Options == 0 && !v.Peer {
			plain = true
		}
	}
	for _, v := range vs {
		// The reference: the plain strategies, or every variant when the
		// list has none.
		if !v.Peer && (v.Options == 0 || !plain) && float64(v.TTFBP95) < ref {
			ref, refName = float64(v.TTFBP95), v.Name
		}
	}
	if math.IsInf(ref, 1) {
		return errors.New("tune: no routing the proxy serves measured a TTFB (did any request finish? were they all peers' routers?)")
	}
	res.Reference, res.ReferenceVariant = sim.Float(ref), refName
	most := math.Inf(-1)
	for i := range vs {
		v := &vs[i]
		p95, tok := float64(v.TTFBP95), float64(v.OutputTokensPerMin)
		v.Eligible = !v.Peer && !math.IsNaN(p95) && !math.IsNaN(tok) && p95 <= ref
		if v.Eligible {
			most = max(most, tok)
		}
	}
	pick := -1
	for i := range vs {
		v := &vs[i]
		if !v.Eligible || float64(v.OutputTokensPerMin) < most*(1-TuneTie) {
			continue
		}
		if pick < 0 || v.Options < vs[pick].Options {
			pick = i
		}
	}
	res.Recommended = pick
	b := &vs[pick]
	why := fmt.Sprintf("%s: %s output tokens/min (the most is %s), TTFB p95 %s s against %s s of %s, hit %s %%",
		b.Name, num.Format(float64(b.OutputTokensPerMin), 0), num.Format(most, 0),
		num.Format(float64(b.TTFBP95), 2), num.Format(ref, 2), refName, num.Format(float64(b.PrefixHitPct), 1))
	if b.AdmissionWaits > 0 {
		why += fmt.Sprintf("; %d requests of new conversations waited for admission", b.AdmissionWaits)
		if b.AdmissionRefused > 0 {
			why += fmt.Sprintf(", %d were refused after the timeout (429/529 with Retry-After), %d of them sent again by their client",
				b.AdmissionRefused, b.AdmissionRetries)
		}
	}
	res.Why = why + "."
	return nil
}

// checkJournalModel compares the journal's model with the farm's: an error
// when both are in the catalogue and differ, a note when the journal's is
// not (a served alias).
func checkJournalModel(model string, farm *sim.Farm) (string, error) {
	if model == "" {
		return fmt.Sprintf("the journal names no model: replayed as the farm's %s, which the routing block names", farm.Spec.Model), nil
	}
	m, err := hardware.LookupModel(model)
	if err != nil {
		return fmt.Sprintf("the journal's model %q is not in the hardware catalogue: replayed as the farm's %s", model, farm.Model.Name), nil
	}
	if m.Name != farm.Model.Name {
		return "", fmt.Errorf("the journal's model %s is not the farm's %s (%s): replay it on a farm of that model, or pick another model's requests with --model",
			m.Name, farm.Model.Name, farm.Name())
	}
	return "", nil
}

// rotatedRE splits a rotated journal's name, FILE.N, into FILE and N.
var rotatedRE = regexp.MustCompile(`^(.*)\.([0-9]+)$`)

// JournalFiles expands --journal (files, globs, directories) into the
// files to replay, oldest first: by name, and a rotation FILE.N before
// FILE.N-1 before FILE.
func JournalFiles(args []string) ([]string, error) {
	if len(args) == 0 {
		return nil, errors.New("--journal: no file given")
	}
	var files []string
	for _, a := range args {
		switch {
		case strings.ContainsAny(a, "*?["):
			m, err := filepath.Glob(a)
			if err != nil {
				return nil, fmt.Errorf("--journal %s: %w", a, err)
			}
			if len(m) == 0 {
				return nil, fmt.Errorf("--journal %s: no file matches", a)
			}
			for _, f := range m {
				if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
					files = append(files, f)
				}
			}
		default:
			fi, err := os.Stat(a)
			if err != nil {
				return nil, fmt.Errorf("--journal: %w", err)
			}
			if !fi.IsDir() {
				files = append(files, a)
				continue
			}
			entries, err := os.ReadDir(a)
			if err != nil {
				return nil, fmt.Errorf("--journal: %w", err)
			}
			n := len(files)
			for _, e := range entries {
				if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
					files = append(files, filepath.Join(a, e.Name()))
				}
			}
			if len(files) == n {
				return nil, fmt.Errorf("--journal %s: the directory has no file", a)
			}
		}
	}
	slices.Sort(files)
	files = slices.Compact(files)
	key := func(f string) (string, int) {
		if m := rotatedRE.FindStringSubmatch(f); m != nil {
			if n, err := strconv.Atoi(m[2]); err == nil {
				return m[1], n
			}
		}
		return f, 0
	}
	slices.SortStableFunc(files, func(a, b string) int {
		ba, na := key(a)
		bb, nb := key(b)
		if c := strings.Compare(ba, bb); c != 0 {
			return c
		}
		return nb - na // higher N is older
	})
	return files, nil
}

// LoadJournal reads the files in order into one trace, each file's times
// following on from the previous file's last arrival, keeping the requests
// of model (all when there is one model and model is "").
func LoadJournal(files []string, model string) (*sim.Trace, TuneJournal, error) {
	jr := TuneJournal{Files: files}
	t := &sim.Trace{Name: strings.Join(files, ", ")}
	counts := map[string]int{}
	var order []string
	var all []*traces.Request
	var offset int64
	first := ""
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Size() == 0 && len(files) > 1 {
			// A proxy killed before its first flush leaves an empty file.
			jr.Empty = append(jr.Empty, f)
			continue
		}
		ft, err := sim.LoadTrace(f)
		if err != nil {
			return nil, jr, err
		}
		if first == "" {
			t.Header, first = ft.Header, f
		} else if ft.Header.BlockSize != t.Header.BlockSize {
			return nil, jr, fmt.Errorf("%s:1: block_size: %d, but %s has %d: the files are not one journal", f, ft.Header.BlockSize, first, t.Header.BlockSize)
		}
		var last int64
		for _, r := range ft.Requests {
			last = r.ArrivalMs
			r.ArrivalMs += offset
			if counts[r.Model] == 0 {
				order = append(order, r.Model)
			}
			counts[r.Model]++
			all = append(all, r)
		}
		offset += last
	}
	if len(all) == 0 {
		return nil, jr, fmt.Errorf("journal %s: no request (the proxy writes a line when a request finishes)", t.Name)
	}
	switch {
	case model != "":
		if counts[model] == 0 {
			return nil, jr, fmt.Errorf("--model %s: the journal has no request for it (it has %s)", model, modelCounts(order, counts))
		}
	case len(order) > 1:
		return nil, jr, fmt.Errorf("the journal has requests for %d models, %s: pick one with --model", len(order), modelCounts(order, counts))
	default:
		model = order[0]
	}
	for _, r := range all {
		if r.Model == model {
			t.Requests = append(t.Requests, r)
		} else {
			jr.Skipped++
		}
	}
	sessions := map[string]struct{}{}
	for _, r := range t.Requests {
		sessions[r.Session] = struct{}{}
	}
	jr.Model, jr.Requests, jr.Sessions = model, len(t.Requests), len(sessions)
	jr.DurationS = sim.Float(float64(t.Requests[len(t.Requests)-1].ArrivalMs-t.Requests[0].ArrivalMs) / 1000)
	return t, jr, nil
}

// modelCounts is "A (50 requests), B (36 requests)".
func modelCounts(order []string, counts map[string]int) string {
	var parts []string
	for _, m := range order {
		name := m
		if name == "" {
			name = "(no model)"
		}
		parts = append(parts, fmt.Sprintf("%s (%d requests)", name, counts[m]))
	}
	return strings.Join(parts, ", ")
}

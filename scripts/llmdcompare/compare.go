package main

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/lm-warden/warden/placement"
)

// turnRecord is one pick of the EPP and what it saw: enough to replay it
// through the model later (-replay) without the EPP.
type turnRecord struct {
	N         int    `json:"n"` // order of the picks
	Session   string `json:"session"`
	Turn      int    `json:"turn"`
	RequestID string `json:"request_id"`
	Body      []byte `json:"body"` // the chat request
	// EPP is the replica the EPP picked (index into Replicas).
	EPP int `json:"epp"`
	// EPPScores are the EPP's total weighted scores (--emit-endpoint-scores),
	// aligned with Replicas.
	EPPScores []float64 `json:"epp_scores"`
	// EPPParts are the EPP's per-scorer scores from its log (-v=4
	// "Calculated score"), [queue, kv-cache-utilization, prefix-cache]
	// per replica; nil when the log was not read.
	EPPParts [][3]float64 `json:"epp_parts,omitempty"`
	// State is the replicas' state given to the model: the gauges the EPP
	// read (StateFrom "epp-log": rebuilt from its per-scorer scores, so
	// that the model's queue and kv scores are the EPP's to the bit), or
	// the gateway's own scrape just before the pick ("gateway-scrape").
	State     []replicaState `json:"state"`
	StateFrom string         `json:"state_from"`
	// Gauges is the gateway's scrape of the replicas just before the pick.
	Gauges []replicaState `json:"gauges"`
}

// recordedRun is a recorded comparison run.
type recordedRun struct {
	EPPCommit string       `json:"epp_commit"`
	Replicas  []string     `json:"replicas"` // "ip:port", index = placement replica ID
	Model     string       `json:"model"`
	Seed      uint64       `json:"seed"`
	Sessions  int          `json:"sessions"`
	Turns     int          `json:"turns"`
	Picks     []turnRecord `json:"picks"`
}

// verdict is how the model's pick compares with the EPP's.
type verdict int

const (
	agree verdict = iota
	// onTie: both sides score the two picks equal, each pick the top:
	// the EPP's random tie-break (picker/maxscore: shuffle, stable sort)
	// and the model's seeded one chose differently.
	onTie
	// strict: at least one side strictly prefers its own pick.
	strict
)

// classify compares the picks: epp and mine are replica indices, the
// scores aligned with the replicas.
func classify(epp, mine int, eppScores, myScores []float64) verdict {
	if epp == mine {
		return agree
	}
	if eppScores[mine] == eppScores[epp] && myScores[epp] == myScores[mine] {
		return onTie
	}
	return strict
}

// outcome is the comparison of one view.
type outcome struct {
	view       view
	agree      int
	ties       []int // picks that disagree on a tie
	stricts    []int // picks that disagree on a strict preference
	sameScores int   // picks whose every score equals the EPP's within 1e-9
	differ     []int // picks where some score differs
	mine       []modelPick
}

// compare runs the model over r's picks in view v, each on the EPP's
// history (follow).
func compare(r *recordedRun, v view) (outcome, error) {
	o := outcome{view: v, mine: make([]modelPick, len(r.Picks))}
	reqs := make([]placement.Request, len(r.Picks))
	for k, t := range r.Picks {
		q, err := request(r.Model, t.Body, v)
		if err != nil {
			return o, fmt.Errorf("pick %d: %w", k, err)
		}
		reqs[k] = q
	}
	for k, t := range r.Picks {
		m, err := follow(r.Picks, reqs, k, r.Seed)
		if err != nil {
			return o, fmt.Errorf("pick %d: %w", k, err)
		}
		o.mine[k] = m
		switch classify(t.EPP, m.replica, t.EPPScores, m.scores) {
		case agree:
			o.agree++
		case onTie:
			o.ties = append(o.ties, k)
		default:
			o.stricts = append(o.stricts, k)
		}
		same := true
		for i := range t.EPPScores {
			same = same && math.Abs(t.EPPScores[i]-m.scores[i]) < 1e-9
		}
		if same {
			o.sameScores++
		} else {
			o.differ = append(o.differ, k)
		}
	}
	return o, nil
}

// figure is the agreement line of an outcome.
func (o outcome) figure(n int) string {
	return fmt.Sprintf("%d/%d picks agree (%.1f %%); disagreements on a tie %d, on a strict preference %d; every score equal to the EPP's at %d/%d",
		o.agree, n, 100*float64(o.agree)/float64(max(n, 1)), len(o.ties), len(o.stricts), o.sameScores, n)
}

// report writes the comparison of r in both views.
func report(w io.Writer, r *recordedRun) error {
	n := len(r.Picks)
	fromLog := 0
	for _, t := range r.Picks {
		if t.StateFrom == "epp-log" {
			fromLog++
		}
	}
	fmt.Fprintf(w, "llm-d's endpoint picker (llm-d/llm-d-router %s) beside warden's model placement.NewPeer(%q, %d),\n",
		r.EPPCommit, placement.PeerLLMD, r.Seed)
	fmt.Fprintf(w, "each pick on the EPP's history and the state it read (from its log at %d/%d picks): %d picks, %d sessions x %d turns over %d replicas\n",
		fromLog, n, n, r.Sessions, r.Turns, len(r.Replicas))
	fmt.Fprintf(w, "  the EPP's prefix index: %s\n", indexLoad(r))
	var outs []outcome
	for _, v := range []view{eppView, proxyView} {
		o, err := compare(r, v)
		if err != nil {
			return err
		}
		outs = append(outs, o)
		fmt.Fprintf(w, "  %s: %s\n", v, o.figure(n))
	}
	for _, o := range outs {
		if len(o.ties) > 0 {
			fmt.Fprintf(w, "\ndisagreements on a tie, %s:\n", o.view)
			for _, k := range o.ties {
				t, m := r.Picks[k], o.mine[k]
				tied := 0
				for _, s := range t.EPPScores {
					if s == t.EPPScores[t.EPP] {
						tied++
					}
				}
				fmt.Fprintf(w, "  pick %d (%s turn %d): the EPP -> %s, the model -> %s, %d replicas tied at %.4f\n",
					k, t.Session, t.Turn, r.Replicas[t.EPP], r.Replicas[m.replica], tied, t.EPPScores[t.EPP])
			}
		}
		if len(o.stricts) > 0 {
			fmt.Fprintf(w, "\nstrict-preference disagreements, %s:\n", o.view)
			for _, k := range o.stricts {
				writeTurn(w, r, k, o)
			}
		}
		if len(o.differ) > 0 {
			fmt.Fprintf(w, "\nscores that differ from the EPP's, %s (the prompt's blocks; matched blocks per replica, EPP/model):\n", o.view)
			for _, k := range o.differ {
				writeDiffer(w, r, k, o)
			}
		}
	}
	return nil
}

// indexLoad says, per replica, how many distinct blocks the EPP's picks
// placed there against its LRU's capacity (num_gpu_blocks entries,
// approximateprefix makeserver): beyond it the LRU evicted.
func indexLoad(r *recordedRun) string {
	seen := make([]map[uint64]bool, len(r.Replicas))
	for i := range seen {
		seen[i] = map[uint64]bool{}
	}
	for _, t := range r.Picks {
		cr, err := parseChat(t.Body)
		if err != nil {
			continue
		}
		for _, id := range eppBlocks(eppBytes(cr.Messages)) {
			seen[t.EPP][id] = true
		}
	}
	var b strings.Builder
	b.WriteString("distinct blocks placed per replica")
	evicted := 0
	for i, m := range seen {
		c := 0
		if len(r.Picks) > 0 {
			c = r.Picks[0].State[i].KVCapacityTokens / vllmBlockSize
		}
		fmt.Fprintf(&b, " %d/%d", len(m), c)
		if len(m) > c {
			evicted++
		}
	}
	fmt.Fprintf(&b, " (placed/LRU capacity): the LRU evicted on %d of %d replicas", evicted, len(r.Replicas))
	return b.String()
}

// blocks returns the prompt's block count to the EPP and to the model in
// view v, for pick t.
func blocks(r *recordedRun, t turnRecord, v view) (epp, mine int) {
	if cr, err := parseChat(t.Body); err == nil {
		epp = eppTotalBlocks(cr.Messages)
	}
	req, _ := request(r.Model, t.Body, v)
	return epp, (req.PromptTokens + eppBlockTokens - 1) / eppBlockTokens
}

// prefixes returns the EPP's prefix score of replica i at pick t and the
// model's (what is left of its total once the EPP's queue and kv scores,
// which the model was given to the bit, are taken out); NaN without the
// EPP's per-scorer scores.
func prefixes(t turnRecord, m modelPick, i int) (epp, mine float64) {
	if t.EPPParts == nil {
		return math.NaN(), math.NaN()
	}
	p := t.EPPParts[i]
	return p[2], (m.scores[i] - 2*p[0] - 2*p[1]) / 3
}

// writeDiffer writes one pick whose scores differ: blocks and matched
// blocks per replica.
func writeDiffer(w io.Writer, r *recordedRun, k int, o outcome) {
	t, m := r.Picks[k], o.mine[k]
	eb, mb := blocks(r, t, o.view)
	var b strings.Builder
	fmt.Fprintf(&b, "  pick %d (%s turn %d): %d/%d blocks;", k, t.Session, t.Turn, eb, mb)
	for i := range r.Replicas {
		pe, pm := prefixes(t, m, i)
		fmt.Fprintf(&b, " %.1f/%.1f", pe*float64(eb), pm*float64(mb))
	}
	fmt.Fprintln(w, b.String())
}

// writeTurn writes one disagreement: each replica's state and both sides'
// scores.
func writeTurn(w io.Writer, r *recordedRun, k int, o outcome) {
	t, m := r.Picks[k], o.mine[k]
	eb, mb := blocks(r, t, o.view)
	fmt.Fprintf(w, "  pick %d (%s turn %d): the EPP -> %s, the model -> %s; the prompt is %d blocks to the EPP, %d to the model (state: %s)\n",
		k, t.Session, t.Turn, r.Replicas[t.EPP], r.Replicas[m.replica], eb, mb, t.StateFrom)
	var b strings.Builder
	fmt.Fprintf(&b, "    %-16s %7s %8s | %-34s %7s | %7s %14s\n", "replica", "waiting", "kv", "EPP: queue kv prefix (blocks)", "total", "model", "prefix (blocks)")
	for i := range r.Replicas {
		st := t.State[i]
		pe, pm := prefixes(t, m, i)
		parts := "-"
		if t.EPPParts != nil {
			p := t.EPPParts[i]
			parts = fmt.Sprintf("%.3f %.4f %.4f (%.1f)", p[0], p[1], pe, pe*float64(eb))
		}
		mark := ""
		if i == t.EPP {
			mark += " <- EPP"
		}
		if i == m.replica {
			mark += " <- model"
		}
		fmt.Fprintf(&b, "    %-16s %7d %8.4f | %-34s %7.4f | %7.4f %7.4f (%.1f)%s\n", r.Replicas[i], st.Waiting, st.KVUsage,
			parts, t.EPPScores[i], m.scores[i], pm, pm*float64(mb), mark)
	}
	fmt.Fprint(w, b.String())
}

// vllmBlockSize is the replicas' block_size (the farm of llmd-compare.sh).
const vllmBlockSize = 16

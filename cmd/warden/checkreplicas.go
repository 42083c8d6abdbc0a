package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lm-warden/warden/live"
)

// replicaDrift is one replica's row of the drift check against a running
// proxy: the hit % the simulator predicts for the observed traffic, the one
// vLLM's counters show, what the replica's KV events say, and where they
// part.
type replicaDrift struct {
	ID           int
	PredictedPct float64
	ObservedPct  *float64 // vLLM's prefix counters since the proxy started; nil: none yet
	BlocksHeld   *int64   // from the KV events; nil: no kv_events
	Evicted      int64    // tokens recomputed after eviction (events)
	Elsewhere    int64    // tokens computed here that another replica had (events)
	Cold         int64
	Findings     []string // where prediction and observation part, and the likely why
	Drifted      bool     // a finding that fails the check
}

// fetchStatus reads a proxy's /api/status.
func fetchStatus(ctx context.Context, url string) (live.StatusReport, error) {
	var rep live.StatusReport
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return rep, fmt.Errorf("--status %q: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rep, fmt.Errorf("--status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("--status %s: HTTP %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&rep); err != nil {
		return rep, fmt.Errorf("--status %s: %w", url, err)
	}
	return rep, nil
}

// checkReplicas compares, for model's replicas in st, the predicted hit %
// with vLLM's counters and the KV events. farmKVTokens is the KV cache per
// replica the farm spec gives (0: unknown).
func checkReplicas(st live.StatusReport, model string, predicted, tol float64, farmKVTokens int) ([]replicaDrift, error) {
	var m *live.Status
	for i := range st.Models {
		if st.Models[i].Model == model {
			m = &st.Models[i]
		}
	}
	if m == nil {
		var names []string
		for _, s := range st.Models {
			names = append(names, s.Model)
		}
		return nil, fmt.Errorf("--status: no model %q (the proxy serves %s)", model, strings.Join(names, ", "))
	}
	var rows []replicaDrift
	var served, withElsewhere, withEvents int
	for _, r := range m.Replicas {
		d := replicaDrift{ID: r.ID, PredictedPct: predicted, ObservedPct: r.PrefixHitPct}
		if r.PrefixHitPct != nil && predicted > 0 && math.Abs(*r.PrefixHitPct-predicted) > tol*predicted {
			d.Drifted = true
			d.Findings = append(d.Findings, fmt.Sprintf("hit %.1f%% vs %.1f%% predicted", *r.PrefixHitPct, predicted))
		}
		if farmKVTokens > 0 && r.KVCapacityTokens != nil && float64(*r.KVCapacityTokens) < 0.95*float64(farmKVTokens) {
			d.Drifted = true
			d.Findings = append(d.Findings, fmt.Sprintf("a smaller cache than configured: vLLM reports %d tokens, the farm spec %d", *r.KVCapacityTokens, farmKVTokens))
		}
		if kv := r.KVEvents; kv != nil {
			withEvents++
			d.BlocksHeld = &kv.BlocksHeld
			d.Cold, d.Evicted, d.Elsewhere = kv.Miss.Cold, kv.Miss.Evicted, kv.Miss.Elsewhere
			switch {
			case kv.Undecodable > 0:
				d.Drifted = true
				d.Findings = append(d.Findings, fmt.Sprintf("a changed event format: %d batches undecodable (%s)", kv.Undecodable, kv.BadPayload))
			case !kv.Connected:
				d.Findings = append(d.Findings, "KV events not connected: "+kv.Error)
			case r.Requests > 0 && kv.Batches == 0:
				d.Drifted = true
				d.Findings = append(d.Findings, "no KV events though the replica served requests (events off, wrong endpoint or topic)")
			}
			if d.ObservedPct != nil && *d.ObservedPct < predicted*(1-tol) && d.Evicted > d.Cold/4 && d.Evicted > 0 {
				d.Findings = append(d.Findings, "evictions: blocks recomputed after the cache dropped them (less cache or more traffic than simulated)")
			}
			if d.Elsewhere > 0 {
				withElsewhere++
			}
		}
		if r.Requests > 0 {
			served++
		}
		rows = append(rows, d)
	}
	// vLLM seeds every prompt's first block hash with NONE_HASH, random per
	// process unless PYTHONHASHSEED is set: replicas that hash differently
	// never see each other's blocks, so none is ever computed "elsewhere".
	if withEvents >= 2 && served >= 2 && withElsewhere == 0 {
		for i := range rows {
			rows[i].Findings = append(rows[i].Findings, "no block was ever computed on two replicas: a changed or unset hash seed (PYTHONHASHSEED), or prompts that share nothing")
		}
	}
	return rows, nil
}

// writeReplicaDrift prints the rows as a table.
func writeReplicaDrift(w io.Writer, rows []replicaDrift) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replica\thit % predicted\thit % vLLM\tblocks held\tcomputed cold/evicted/elsewhere\tverdict")
	for _, d := range rows {
		obs, held, miss := "-", "-", "-"
		if d.ObservedPct != nil {
			obs = fmt.Sprintf("%.1f", *d.ObservedPct)
		}
		if d.BlocksHeld != nil {
			held = fmt.Sprint(*d.BlocksHeld)
			miss = fmt.Sprintf("%d/%d/%d", d.Cold, d.Evicted, d.Elsewhere)
		}
		verdict := "ok"
		if d.Drifted {
			verdict = "DRIFT"
		}
		if len(d.Findings) > 0 {
			verdict += ": " + strings.Join(d.Findings, "; ")
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%s\t%s\t%s\t%s\n", d.ID, d.PredictedPct, obs, held, miss, verdict)
	}
	return tw.Flush()
}

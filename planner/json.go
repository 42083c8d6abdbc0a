package planner

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// ReadResult reads a Result from its JSON form (as `warden plan --json`
// writes it). A null figure reads back as NaN, as it was written.
func ReadResult(data []byte) (*Result, error) {
	var res Result
	if err := DecodeJSON(data, &res); err != nil {
		return nil, fmt.Errorf("plan result: %w", err)
	}
	if res.Kind != Kind {
		return nil, fmt.Errorf("plan result: kind is %q, want %q", res.Kind, Kind)
	}
	if err := res.validate(); err != nil {
		return nil, fmt.Errorf("plan result: %w", err)
	}
	return &res, nil
}

// validate checks the indexes a report follows, so that a hand-edited file
// gives an error rather than a panic.
func (res *Result) validate() error {
	n := len(res.Sessions)
	if res.Best < -1 || res.Best >= len(res.Candidates) {
		return fmt.Errorf("best %d: want -1 or a candidate index below %d", res.Best, len(res.Candidates))
	}
	if res.Closest < -1 || res.Closest >= len(res.Candidates) {
		return fmt.Errorf("closest %d: want -1 or a candidate index below %d", res.Closest, len(res.Candidates))
	}
	if Level(res.Sessions, res.Concurrency) < 0 && len(res.Candidates) > 0 {
		return fmt.Errorf("concurrency %d is not one of the sessions levels %v", res.Concurrency, res.Sessions)
	}
	if res.HeadroomSessions != 0 && Level(res.Sessions, res.HeadroomSessions) < 0 && len(res.Candidates) > 0 {
		return fmt.Errorf("headroom_sessions %d is not one of the sessions levels %v", res.HeadroomSessions, res.Sessions)
	}
	for i, c := range res.Candidates {
		if c.Chosen < -1 || c.Chosen >= len(c.Configs) {
			return fmt.Errorf("candidates[%d].chosen %d: want -1 or a config index below %d", i, c.Chosen, len(c.Configs))
		}
		if (res.Best == i || res.Closest == i) && c.Chosen < 0 {
			return fmt.Errorf("candidates[%d] is the best or closest but has no chosen config", i)
		}
		for k, cfg := range c.Configs {
			if len(cfg.Rows) != n || len(cfg.Checks) != n {
				return fmt.Errorf("candidates[%d].configs[%d]: %d rows and %d checks, want one per sessions level (%d)", i, k, len(cfg.Rows), len(cfg.Checks), n)
			}
			if len(cfg.Bands) != n && len(cfg.Bands) != 0 {
				return fmt.Errorf("candidates[%d].configs[%d]: %d bands, want one per sessions level (%d)", i, k, len(cfg.Bands), n)
			}
		}
	}
	for k, rc := range res.RoutingCards {
		if rc.Candidate < -1 || rc.Candidate >= len(res.Candidates) || (rc.Candidate < 0) != (rc.Config < 0) ||
			(rc.Candidate >= 0 && rc.Config >= len(res.Candidates[rc.Candidate].Configs)) {
			return fmt.Errorf("routing_cards[%d]: candidate %d, config %d: want a candidate and one of its configs, or both -1", k, rc.Candidate, rc.Config)
		}
	}
	for _, m := range res.Marginal {
		if m < 0 || m >= len(res.Candidates) {
			return fmt.Errorf("marginal %d: want a candidate index below %d", m, len(res.Candidates))
		}
	}
	if tl := res.Timeline; tl != nil {
		if tl.Candidate < 0 || tl.Candidate >= len(res.Candidates) || tl.Config < 0 || tl.Config >= len(res.Candidates[tl.Candidate].Configs) {
			return fmt.Errorf("timeline: candidate %d, config %d: want a candidate and one of its configs", tl.Candidate, tl.Config)
		}
		for _, q := range []*QuerySeries{&tl.InFlight, &tl.KVUsage, &tl.PromptCached, &tl.PromptComputed} {
			for k, s := range q.Series {
				if len(s.Values) != len(tl.TimesS) {
					return fmt.Errorf("timeline: %s series %d has %d values, want one per time (%d)", q.Name, k, len(s.Values), len(tl.TimesS))
				}
			}
		}
	}
	return nil
}

// roundTrip returns res as its JSON reads back.
func roundTrip(res *Result) (*Result, error) {
	data, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	return ReadResult(data)
}

// DecodeJSON is json.Unmarshal for the project's result types, strict about
// unknown fields. sim.Float reads null back as NaN (a step that measured
// nothing), so a saved result keeps that apart from zero.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/lm-warden/warden/metrics"
)

// servePrometheus serves the simulated farm's series of simulatedPrometheus
// over Prometheus's HTTP API (/api/v1/query and /api/v1/query_range), so a
// command given its URL runs exactly as against a real server: through its
// flags and metrics.NewPrometheus's client. The series end at promEnd;
// the server shifts time so that they end at the moment it starts: a
// command run at once with its default --end (now) reads the whole farm.
func servePrometheus(t *testing.T) string {
	t.Helper()
	simulatedPrometheus(t)
	src := &metrics.StoreSource{St: promStore}
	// Whole seconds, and times read to the millisecond (PromQL's
	// resolution), so that the steps of a range query fall on the samples'
	// grid as they do in the store.
	shift := time.Since(promEnd).Truncate(time.Second)
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/query", func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		if s := r.FormValue("time"); s != "" {
			var err error
			if at, err = promTime(s); err != nil {
				promError(w, err)
				return
			}
		}
		v, err := src.Instant(r.Context(), r.FormValue("query"), at.Add(-shift))
		if err != nil {
			promError(w, err)
			return
		}
		result := make([]any, 0, len(v))
		for _, s := range v {
			result = append(result, map[string]any{"metric": promLabels(s.Metric), "value": promSample(s.T, s.F, shift)})
		}
		promSuccess(w, "vector", result)
	})
	mux.HandleFunc("/api/v1/query_range", func(w http.ResponseWriter, r *http.Request) {
		start, err1 := promTime(r.FormValue("start"))
		end, err2 := promTime(r.FormValue("end"))
		step, err3 := promDuration(r.FormValue("step"))
		for _, err := range []error{err1, err2, err3} {
			if err != nil {
				promError(w, err)
				return
			}
		}
		m, err := src.Range(r.Context(), r.FormValue("query"), start.Add(-shift), end.Add(-shift), step)
		if err != nil {
			promError(w, err)
			return
		}
		result := make([]any, 0, len(m))
		for _, s := range m {
			values := make([]any, 0, len(s.Floats))
			for _, p := range s.Floats {
				values = append(values, promSample(p.T, p.F, shift))
			}
			result = append(result, map[string]any{"metric": promLabels(s.Metric), "values": values})
		}
		promSuccess(w, "matrix", result)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// promTime reads Prometheus's time parameter: Unix seconds or RFC 3339.
func promTime(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.UnixMilli(int64(math.Round(f * 1000))), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("bad time %q", s)
	}
	return time.UnixMilli(t.UnixMilli()), nil
}

// promDuration reads a step: seconds, or a Go duration.
func promDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 {
		return time.Duration(math.Round(f*1000)) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("bad step %q", s)
	}
	return d, nil
}

func promLabels(ls labels.Labels) map[string]string {
	m := map[string]string{}
	ls.Range(func(l labels.Label) { m[l.Name] = l.Value })
	return m
}

// promSample is [unix seconds, "value"], the sample shifted back by shift.
func promSample(ms int64, f float64, shift time.Duration) []any {
	ts := float64(ms+shift.Milliseconds()) / 1000
	return []any{json.Number(strconv.FormatFloat(ts, 'f', 3, 64)), strconv.FormatFloat(f, 'f', -1, 64)}
}

func promSuccess(w http.ResponseWriter, typ string, result any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": typ, "result": result}})
}

func promError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "error", "errorType": "bad_data", "error": err.Error()})
}

package traces

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"runtime"
	"strconv"
	"testing"
)

var traceBytes = flag.Int64("trace-bytes", 64<<20, "size of the generated trace streamed by BenchmarkStats (1<<30 for the 1 GB figure)")

// lazyTrace is an io.Reader that produces a valid trace of about limit
// bytes on the fly: the requests of a fixed pool of synthetic sessions,
// interleaved eight at a time, repeated with fresh session ids and
// increasing arrival times. Its distinct block ids are bounded by the pool,
// so Stats' memory must not grow with the size.
type lazyTrace struct {
	lines [][]byte // each request's JSON after its "session" value
	pos   int
	cycle int
	t     int64
	limit int64
	n     int64
	buf   bytes.Buffer
	names []string
	// Heap in use (after a GC) when half of the trace and all of it were
	// read, measured while the consumer still holds its state.
	heapMid, heapEnd uint64
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func newLazyTrace(limit int64) *lazyTrace {
	const pool, group = 64, 8
	w := DefaultWorkload()
	sessions := takeSessions(NewGenerator(w, 16, 1), pool)
	lt := &lazyTrace{limit: limit}
	lt.buf.WriteString(`{"format":"warden-trace","version":1,"block_size":16,"source":"benchmark"}` + "\n")
	for g := 0; g < pool; g += group {
		for turn := range w.Turns {
			for _, s := range sessions[g : g+group] {
				r := s.Turns[turn]
				r.Session = ""
				b, _ := json.Marshal(&r)
				rest := b[bytes.Index(b, []byte(`"session":""`))+len(`"session":""`):]
				lt.lines = append(lt.lines, rest)
				lt.names = append(lt.names, s.ID)
			}
		}
	}
	return lt
}

func (lt *lazyTrace) Read(p []byte) (int, error) {
	for lt.buf.Len() < len(p) && lt.n+int64(lt.buf.Len()) < lt.limit {
		lt.buf.WriteString(`{"t_ms":`)
		lt.buf.WriteString(strconv.FormatInt(lt.t, 10))
		lt.buf.WriteString(`,"session":"c`)
		lt.buf.WriteString(strconv.Itoa(lt.cycle))
		lt.buf.WriteString(lt.names[lt.pos])
		lt.buf.WriteString(`"`)
		lt.buf.Write(lt.lines[lt.pos])
		lt.buf.WriteByte('\n')
		lt.t += 250
		if lt.pos++; lt.pos == len(lt.lines) {
			lt.pos, lt.cycle = 0, lt.cycle+1
		}
	}
	if lt.buf.Len() == 0 {
		if lt.heapEnd == 0 {
			lt.heapEnd = heapInUse()
		}
		return 0, io.EOF
	}
	n, _ := lt.buf.Read(p)
	if lt.n < lt.limit/2 && lt.n+int64(n) >= lt.limit/2 {
		lt.heapMid = heapInUse()
	}
	lt.n += int64(n)
	return n, nil
}

// BenchmarkStats streams a generated trace of -trace-bytes through Stats
// and reports the heap in use (after a GC, Stats' state live) half-way
// and at the end: equal figures mean memory does not grow with the trace.
//
//	go test ./traces/ -run XXX -bench BenchmarkStats -benchtime 1x -args -trace-bytes=1073741824
func BenchmarkStats(b *testing.B) {
	b.ReportAllocs()
	var st TraceStats
	var n int64
	for b.Loop() {
		lt := newLazyTrace(*traceBytes)
		rd, err := NewReader(lt, "lazy", ReaderOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if st, err = Stats(rd); err != nil {
			b.Fatal(err)
		}
		n = lt.n
		b.ReportMetric(float64(lt.heapMid)/(1<<20), "heap-mid-MiB")
		b.ReportMetric(float64(lt.heapEnd)/(1<<20), "heap-end-MiB")
	}
	b.SetBytes(n)
	b.ReportMetric(float64(st.Requests), "requests")
	b.ReportMetric(float64(st.Sessions), "sessions")
}

// BenchmarkGenerator measures synthetic sessions of the default workload.
func BenchmarkGenerator(b *testing.B) {
	b.ReportAllocs()
	g := NewGenerator(DefaultWorkload(), 16, 1)
	for b.Loop() {
		g.NextSession()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sessions/s")
}

// BenchmarkReader measures parsing alone.
func BenchmarkReader(b *testing.B) {
	b.ReportAllocs()
	var n int64
	for b.Loop() {
		lt := newLazyTrace(16 << 20)
		rd, err := NewReader(lt, "lazy", ReaderOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := rd.Next(); err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
		}
		n = lt.n
	}
	b.SetBytes(n)
}

// BenchmarkGeneratorPresets measures each preset's sessions, hashed in
// 16-token blocks: a session of the agent presets is tens to hundreds of
// requests of up to ~200k tokens.
func BenchmarkGeneratorPresets(b *testing.B) {
	for _, name := range PresetNames() {
		w, err := Preset(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			g := NewGenerator(w, 16, 1)
			var reqs int
			for b.Loop() {
				s, _ := g.NextFamily()
				reqs += len(s.Turns)
			}
			b.ReportMetric(float64(reqs)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

// BenchmarkSummarize measures what a plan spends describing a workload of
// distributions: 2,000 claude-code sessions drawn without hashes.
func BenchmarkSummarize(b *testing.B) {
	w, err := Preset("claude-code")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		Summarize(w, 1, SummarySessions)
	}
}

// BenchmarkFit measures fitting a workload to a trace's requests.
func BenchmarkFit(b *testing.B) {
	w, err := Preset("claude-code")
	if err != nil {
		b.Fatal(err)
	}
	g := NewGenerator(w, 512, 1)
	var reqs []Request
	for range 200 {
		s, _ := g.NextSession()
		reqs = append(reqs, s.Turns...)
	}
	b.ReportAllocs()
	for b.Loop() {
		f := NewFitter(512, FitOptions{})
		for i := range reqs {
			f.Add(&reqs[i])
		}
		f.Fit()
	}
	b.ReportMetric(float64(len(reqs)*b.N)/b.Elapsed().Seconds(), "requests/s")
}

package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lm-warden/warden/traces"
)

// Issue 16's workload, the one BLIS was measured on side by side: 10,000
// requests arriving as a Poisson process of 40 req/s; 90 % share one of 8
// prefixes of 2,048 tokens followed by a gaussian(256, 64) tail of their
// own, 10 % are unique with exponential(mean 1,024) prompts; outputs are
// exponential(mean 128). The farm is 4 x H100 SXM with Llama-3.1-8B,
// max_num_seqs 256, max_num_batched_tokens 2048, least-loaded routing, and
// issue16Blocks KV blocks per replica: (a) 1,500, (b) 300 (overload).
//
// It is built in Mooncake form (512-token hash ids) and imported as
// `warden trace import --from mooncake` does. With -issue16-out DIR the
// test below also writes the Mooncake file and the two farms, to time the
// command line:
//
//	go test -run TestIssue16Workload -issue16-out /tmp/i16 ./sim/
//	bin/warden trace import --from mooncake /tmp/i16/issue16.mooncake.jsonl /tmp/i16/issue16.jsonl
//	/usr/bin/time -f '%e s %M KB' bin/warden sim --farm /tmp/i16/farm-a.yaml --trace /tmp/i16/issue16.jsonl --strategies least-loaded
var issue16Out = flag.String("issue16-out", "", "write issue 16's Mooncake workload and farms to this directory")

const (
	issue16Requests   = 10000
	issue16Rate       = 40.0 // req/s
	issue16Prefixes   = 8
	issue16PrefixToks = 2048
	issue16Shared     = 0.9
)

type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// issue16Mooncake returns the workload as Mooncake JSONL.
func issue16Mooncake(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x1516))
	const bt = traces.MooncakeBlockTokens
	nextID := uint64(issue16Prefixes * issue16PrefixToks / bt)
	fresh := func(n int, ids []uint64) []uint64 {
		for range n {
			ids = append(ids, nextID)
			nextID++
		}
		return ids
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	t := 0.0
	for range n {
		t += rng.ExpFloat64() / issue16Rate * 1000
		var l mooncakeLine
		l.Timestamp = math.Round(t*1000) / 1000
		l.OutputLength = max(1, int(math.Round(rng.ExpFloat64()*128)))
		if rng.Float64() < issue16Shared {
			p := rng.IntN(issue16Prefixes)
			tail := max(1, int(math.Round(256+64*rng.NormFloat64())))
			l.InputLength = issue16PrefixToks + tail
			per := issue16PrefixToks / bt
			for k := range per {
				l.HashIDs = append(l.HashIDs, uint64(p*per+k))
			}
			l.HashIDs = fresh((tail+bt-1)/bt, l.HashIDs)
		} else {
			l.InputLength = max(1, int(math.Round(rng.ExpFloat64()*1024)))
			l.HashIDs = fresh((l.InputLength+bt-1)/bt, nil)
		}
		_ = enc.Encode(&l)
	}
	return buf.Bytes()
}

// issue16Trace imports the workload as `warden trace import --from
// mooncake` does (block size 16) and reads it back as `warden sim --trace`
// does.
func issue16Trace(tb testing.TB, seed uint64) *Trace {
	tb.Helper()
	return issue16TraceN(tb, seed, issue16Requests)
}

// issue16TraceN is issue16Trace with the first n requests.
func issue16TraceN(tb testing.TB, seed uint64, n int) *Trace {
	tb.Helper()
	var out bytes.Buffer
	w := traces.NewWriter(&out, traces.Header{Format: traces.Format, Version: traces.Version, BlockSize: 16, Source: "issue16"})
	if _, err := traces.Import("mooncake", bytes.NewReader(issue16Mooncake(seed, n)), "issue16.mooncake.jsonl", w, traces.ImportOptions{BlockSize: 16}); err != nil {
		tb.Fatal(err)
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	rd, err := traces.NewReader(&out, "issue16.jsonl", traces.ReaderOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tr := &Trace{Name: "issue16.jsonl", Header: rd.Header()}
	for {
		req, err := rd.Next()
		if err != nil {
			break
		}
		c := req.Clone()
		tr.Requests = append(tr.Requests, &c)
	}
	if len(tr.Requests) != n {
		tb.Fatalf("%d requests read back, want %d", len(tr.Requests), n)
	}
	return tr
}

// issue16FarmYAML is the farm with blocks KV blocks per replica.
func issue16FarmYAML(blocks int) string {
	return fmt.Sprintf(`name: 4x H100 SXM, Llama-3.1-8B (issue 16)
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100 SXM
replicas: 4
tensor_parallel_size: 1
vllm:
  max_num_seqs: 256
  max_num_batched_tokens: 2048
  block_size: 16
  num_gpu_blocks: %d
routing:
  strategy: least-loaded
scrape_interval: 1s
`, blocks)
}

func issue16Farm(tb testing.TB, blocks int) *Farm {
	tb.Helper()
	f, err := ParseFarm([]byte(issue16FarmYAML(blocks)), fmt.Sprintf("issue16-%d.yaml", blocks))
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func issue16Experiment(tb testing.TB, blocks int) Experiment {
	return Experiment{Farm: issue16Farm(tb, blocks), Strategies: []string{"least-loaded"}, Trace: issue16Trace(tb, 1), Seed: 1}
}

// TestIssue16Workload checks the workload's shape (so that the benchmarks
// below measure what the issue says) and writes it with -issue16-out.
func TestIssue16Workload(t *testing.T) {
	tr := issue16Trace(t, 1)
	first := map[uint64]int{} // a prompt's first block -> requests
	out := 0
	for _, r := range tr.Requests {
		first[r.HashIDs[0]]++
		out += r.OutputTokens
	}
	shared := 0
	for _, n := range first {
		if n > 1 {
			shared += n
		}
	}
	last := tr.Requests[len(tr.Requests)-1].ArrivalMs
	if rate := float64(len(tr.Requests)) / (float64(last) / 1000); math.Abs(rate-issue16Rate) > 2 {
		t.Errorf("arrival rate %.1f req/s, want about %g", rate, issue16Rate)
	}
	if mean := float64(out) / float64(len(tr.Requests)); math.Abs(mean-128) > 8 {
		t.Errorf("mean output %.1f tokens, want about 128", mean)
	}
	if len(first) != issue16Prefixes+issue16Requests-shared {
		t.Errorf("%d distinct first blocks, %d requests share one: want %d prefixes", len(first), shared, issue16Prefixes)
	}
	if frac := float64(shared) / float64(len(tr.Requests)); math.Abs(frac-issue16Shared) > 0.02 {
		t.Errorf("%.3f of requests share a prefix, want about %g", frac, issue16Shared)
	}
	if *issue16Out == "" {
		return
	}
	if err := os.MkdirAll(*issue16Out, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"issue16.mooncake.jsonl": issue16Mooncake(1, issue16Requests),
		"farm-a.yaml":            []byte(issue16FarmYAML(1500)),
		"farm-b.yaml":            []byte(issue16FarmYAML(300)),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(*issue16Out, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func benchIssue16(b *testing.B, blocks int) {
	e := issue16Experiment(b, blocks)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		rep, err := Run(context.Background(), e)
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Rows) != 1 || rep.Rows[0].Finished == 0 {
			b.Fatalf("unexpected report: %+v", rep.Rows)
		}
	}
}

// BenchmarkIssue16A is case (a): 1,500 KV blocks per replica (BLIS: 2.95 s,
// 385 MB; the goal is 20 times faster, <= 0.15 s).
func BenchmarkIssue16A(b *testing.B) { benchIssue16(b, 1500) }

// BenchmarkIssue16B is case (b): 300 KV blocks per replica, overload with
// long queues (BLIS: 31.9 s, 425 MB; the goal is <= 1.6 s).
func BenchmarkIssue16B(b *testing.B) { benchIssue16(b, 300) }

// BenchmarkIssue16LoadTrace is the part of `warden sim --trace` before the
// simulation: reading the imported trace (10,000 requests, 1.4M hash ids).
func BenchmarkIssue16LoadTrace(b *testing.B) {
	tr := issue16Trace(b, 1)
	path := filepath.Join(b.TempDir(), "issue16.jsonl")
	w, err := traces.Create(path, tr.Header)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range tr.Requests {
		if err := w.Write(r); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		t, err := LoadTrace(path)
		if err != nil {
			b.Fatal(err)
		}
		if len(t.Requests) != issue16Requests {
			b.Fatalf("%d requests", len(t.Requests))
		}
	}
}

// reportCPU reports the process's CPU time (user + system, GC included)
// per iteration when the returned func is called: on a machine shared with
// other work it varies much less than ns/op, which counts the waits for a
// core.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Milliseconds())/float64(b.N), "cpu-ms/op")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Package traces holds LM Warden's request traces: the record (Request,
// Session), the JSONL trace file format (FORMAT.md), synthetic agent
// sessions, importers for public traces and streaming statistics.
//
// Where to start reading:
//
//   - record.go: Request and Session, the contract shared with sim and live.
//   - format.go: Header, Reader (streaming, constant memory, gzip, line-
//     numbered errors) and Writer. FORMAT.md documents the file format.
//     fastparse.go reads the usual lines without encoding/json, reusing
//     the hash ids a line shares with a recent one; readall.go is
//     Reader.ReadAll, the whole file parsed on several goroutines.
//   - workload.go and synth.go: Workload (the shape of agent sessions, loaded
//     from strict YAML; WORKLOAD.md lists every key) and Generator, an
//     endless deterministic SessionSource of synthetic sessions whose block
//     ids chain as vLLM's prefix cache does (hash.go): turns, additions,
//     pauses and summaries drawn from distributions (dist.go), compaction
//     near a context limit, subagents attached to their parent
//     (NextFamily) and agent kinds, each with its own system prompt.
//     SliceSource and LoadSessions replay a file instead.
//   - presets.go and presets/*.yaml: the named workloads (bench,
//     claude-code, codex, 5090-farm), each figure's source in WORKLOAD.md;
//     summary.go measures a workload on a sample of its sessions (typical
//     context, pauses, subagents, the histogram of prompt lengths).
//   - fit.go: Fitter, a workload fitted to a trace's sessions (warden trace
//     stats --workload-out, warden workload --journal).
//   - import.go and import_*.go: Mooncake, Alibaba Bailian and Azure
//     (import_azure.go) importers. Mooncake and Bailian share one
//     skeleton, import_hashids.go (hashIDDecoder: the lines, the common
//     fields checked, arrivals, the hash ids re-chained to the target
//     block size); each format
//     (import_mooncake.go, import_bailian.go) adds its own fields and
//     sessions. infer.go infers sessions from prefix chains where a trace
//     has none.
//   - text.go: the canonical prompt text and its token blocks, the one
//     rule by which the journal, the emulator and the bench client turn a
//     request body into prefix-cache blocks without a tokenizer.
//   - hist.go: logHist, a fixed-size log-bucket histogram (deterministic,
//     its memory independent of the count) for the stats.
//   - stats.go: Stats, the summary behind `warden trace stats`, including
//     the infinite-cache upper bound of the prefix-cache hit rate and the
//     working set to hold against a farm's KV capacity.
//
// Of the project it imports only internal/strictyaml, the one strict
// decoder of every YAML file warden reads (workload files here): none of
// the project's layers, so that sim, live and the importers can all use it.
package traces

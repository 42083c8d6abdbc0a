// Package hardware knows the GPUs and models warden plans for, and sizes a
// vLLM replica's KV cache the way vLLM does.
//
// Where to start reading:
//
//   - hardware.go: the contract types (GPU, Model, Deployment, KVSizing) that
//     sim/ and cmd/warden use.
//   - catalog.go with catalog/gpus.yaml and catalog/models.yaml: the embedded
//     catalogue (units in the field names, a source per entry; each GPU's
//     interconnect, the link a tensor-parallel group sums its partial
//     results over: NVLink or PCIe, its bandwidth each way, whether the
//     driver gives peer access, the latency of one all-reduce), and
//     LookupGPU / LookupModel, which match names case- and
//     punctuation-insensitively, know aliases ("A4000", "llama-3.1-8b") and
//     NVML device names, and suggest close matches for unknown names.
//   - price.go with catalog/prices.yaml: one dated price list of on-demand
//     rates per GPU-hour (Prices, LookupPrice), what a plan ranks mixed
//     GPU kinds by when the run gives no prices.
//   - hfconfig.go: LoadHFConfig reads a Hugging Face config.json (including
//     multimodal text_config and sliding-window layouts) into a Model.
//   - kv.go: SizeKV (requested memory, weights, the profiler's overheads,
//     blocks of block_size, tensor parallelism; typed errors for a model that
//     does not fit and for a max_model_len the cache cannot hold) and
//     RuleOfThumb (sessions x context against the farm's KV).
//   - profile.go: vLLM's start-up memory profile, one function per mechanism
//     (requested memory and ECC, profile_run's activation peak, non-torch
//     memory, the CUDA graph capture sizes and the V1 runner's estimate, and
//     Model Runner V2's profile, which returns 0), each naming the vLLM file
//     and function it mirrors; goldens in testdata/profile (go test
//     ./hardware -update rewrites them).
//   - probe.go, probe_nvml.go (cgo && linux), probe_stub.go: Probe lists local
//     GPUs through NVML, or returns ErrNoDriver; the binary builds without cgo.
//
// The package is a leaf: it imports nothing of the project, and nothing in it
// starts goroutines.
package hardware

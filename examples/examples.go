package examples

import "embed"

// FS holds every example farm spec (*.yaml), at the root of the file system.
//
//go:embed *.yaml
var FS embed.FS

// Default is the built-in farm of `warden sim` without --farm: four RTX A4000
// cards serving Qwen3-4B, the farm of the product's published benchmark.
//
//go:embed a4000-qwen3-4b.yaml
var Default []byte

// DefaultName is the file name of Default, used in error messages.
const DefaultName = "a4000-qwen3-4b.yaml"

// Workloads holds example workload files (`warden sim --workload`), under
// workloads/: agents-58k.yaml is the 7 x RTX 5090 operators' agent
// sessions, ~40k growing to ~76k tokens with a 5 s think time, in the
// constant shape of before issue 48 (the 5090-farm preset is the same farm's
// sessions with distributions); mixed-agents.yaml is two agent kinds, from
// the claude-code and codex presets, sharing a farm.
//
//go:embed workloads/*.yaml
var Workloads embed.FS

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

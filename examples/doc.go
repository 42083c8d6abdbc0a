// Package examples ships the example farm specs of LM Warden as embedded
// files: the two reference farms of the product (4 x RTX A4000 with
// Qwen3-4B, 7 x RTX 5090 with a 27B model in 4-bit weights) and one
// datacenter farm (8 x H100 SXM, Llama-3.1-70B at tensor parallelism 4).
//
// Start with a4000-qwen3-4b.yaml, which `warden sim` runs when no --farm is
// given (Default; examples.go embeds them: FS). The files are plain YAML read by sim.ParseFarm; copy one
// and edit it to describe your own farm.
package examples

package planner

import _ "embed"

// DefaultPlan is the built-in plan that `warden plan` runs without --plan
// or --gpu: RTX A4000 farms of 2, 4, 6 and 8 cards serving Qwen3-4B to 16
// concurrent agent sessions, least-loaded against affinity routing.
//
//go:embed examples/default.yaml
var DefaultPlan []byte

// DefaultPlanName is the file name of DefaultPlan, used in error messages.
const DefaultPlanName = "examples/default.yaml"

package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "warden",
		Short: "Keep each agent conversation on the vLLM replica that holds its prefix cache",
		Long: `LM Warden places each new conversation on the least-loaded vLLM replica, keeps it
there by its session id, and spills only while its home is over a threshold.

It simulates farms before you buy cards (sim, plan), routes production traffic
(proxy), and writes self-contained HTML reports.`,
		Example: `  warden sim                       # the built-in 4 x RTX A4000 example
  warden kv --gpu "RTX A4000" --model Qwen/Qwen3-4B-Instruct-2507`,
		// --version prints what `warden version` prints.
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("warden {{.Version}}\n")
	// One line per command; each newXCmd lives in its own file.
	root.AddCommand(newVersionCmd())
	root.AddCommand(newSimCmd())
	root.AddCommand(newTraceCmd())
	root.AddCommand(newGPUsCmd())
	root.AddCommand(newKVCmd())
	root.AddCommand(newProxyCmd())
	root.AddCommand(newEPPCmd())
	root.AddCommand(newPlanCmd())
	root.AddCommand(newTuneCmd())
	root.AddCommand(newReportCmd())
	root.AddCommand(newCalibrateCmd())
	root.AddCommand(newWorkloadCmd())
	root.AddCommand(newCheckCmd())
	root.AddCommand(newEmulateCmd())
	root.AddCommand(newBenchCmd())
	root.AddCommand(newCompareCmd())
	root.AddCommand(newCompletionCmd())
	return root
}

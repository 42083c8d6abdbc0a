package main

import (
	"fmt"
	"strings"

	"github.com/agnivade/levenshtein"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	// A mistyped command or flag gets the nearest names: cobra suggests
	// commands within this distance, and flagError flags (pflag has none).
	root.SuggestionsMinimumDistance = suggestDistance
	root.SetFlagErrorFunc(flagError)
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

// suggestDistance is how far (edits) a mistyped name may be from a
// command or flag it suggests.
const suggestDistance = 2

// flagError adds to an unknown flag's error the command's flags nearest to
// it: "unknown flag: --sesions (did you mean --sessions?)".
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return err
	}
	var near []string
	best := suggestDistance + 1
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := levenshtein.ComputeDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		switch {
		case d < best:
			best, near = d, []string{"--" + f.Name}
		case d == best:
			near = append(near, "--"+f.Name)
		}
	})
	if len(near) == 0 {
		return fmt.Errorf("%w (warden %s --help lists the flags)", err, cmd.Name())
	}
	return fmt.Errorf("%w (did you mean %s?)", err, strings.Join(near, " or "))
}

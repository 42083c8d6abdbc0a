package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newCompletionCmd replaces cobra's default completion command, which
// captures os.Stdout when it is created and so ignores SetOut.
func newCompletionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print the shell completion script",
		Example: `  warden completion bash > /etc/bash_completion.d/warden
  source <(warden completion zsh)
  warden completion fish > ~/.config/fish/completions/warden.fish`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		RunE: func(cmd *cobra.Command, args []string) error {
			out, root := cmd.OutOrStdout(), cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(out)
			}
			return fmt.Errorf("unknown shell %q (want bash, zsh, fish or powershell)", args[0])
		},
	}
}

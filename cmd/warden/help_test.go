package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestEveryCommandHasAnExample: `--help` of every command shows an example.
func TestEveryCommandHasAnExample(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		if c.Runnable() && c.Example == "" {
			t.Errorf("%q has no Example", c.CommandPath())
		}
		if c.Short == "" {
			t.Errorf("%q has no Short description", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		out, err := runWarden(t, "completion", shell)
		if err != nil || len(out) < 100 {
			t.Errorf("completion %s: %d bytes, %v", shell, len(out), err)
		}
	}
}

// TestFlagTypoSuggests: a mistyped flag names the command's nearest flags
// (it used to say "unknown flag" alone); one near none says where the list
// is; a mistyped command gets cobra's suggestion.
func TestFlagTypoSuggests(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--sesions", "4"}, "unknown flag: --sesions (did you mean --sessions?)"},
		{[]string{"sim", "--strategy", "affinity"}, "unknown flag: --strategy (did you mean --strategies?)"},
		{[]string{"plan", "--weights", "fp8"}, "(did you mean --weights-dtype?)"},
		{[]string{"kv", "--zzzzzzzz"}, "unknown flag: --zzzzzzzz (warden kv --help lists the flags)"},
		{[]string{"plna"}, "Did you mean this?\n\tplan"},
	} {
		_, err := runWarden(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("warden %s: error %v, want %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
}

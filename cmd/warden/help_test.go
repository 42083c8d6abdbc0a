package main

import (
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

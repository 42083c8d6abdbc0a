package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/lm-warden/warden/hardware"
)

// gpusOptions are the flags of `warden gpus`.
type gpusOptions struct {
	JSON    bool
	Catalog bool
	// probe lists local GPUs; hardware.Probe outside tests.
	probe func() ([]hardware.DetectedGPU, error)
}

func newGPUsCmd() *cobra.Command {
	opts := &gpusOptions{probe: hardware.Probe}
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List the local NVIDIA GPUs, or the built-in GPU and model catalogue",
		Long: `List the local NVIDIA GPUs as NVML reports them (name, memory) with the
catalogue entry each one maps to.

Without an NVIDIA driver (or in a binary built without cgo) there is nothing to
list: the command says so on stderr and exits 1. --catalog needs no driver: it
lists the embedded catalogue of GPUs and models that warden kv and warden sim use.`,
		Example: `  warden gpus
  warden gpus --json
  warden gpus --catalog
  warden gpus --catalog --json | jq '.gpus[].name'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGPUs(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&opts.JSON, "json", false, "print JSON instead of a table")
	cmd.Flags().BoolVar(&opts.Catalog, "catalog", false, "list the embedded catalogue instead of the local GPUs")
	return cmd
}

func runGPUs(_ context.Context, opts *gpusOptions, out io.Writer) error {
	if opts.Catalog {
		return printCatalog(out, opts.JSON)
	}
	gpus, err := opts.probe()
	if err != nil {
		return fmt.Errorf("%w; `warden gpus --catalog` lists the built-in catalogue", err)
	}
	if opts.JSON {
		if gpus == nil {
			gpus = []hardware.DetectedGPU{}
		}
		return writeJSON(out, gpus)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tNAME\tMEMORY (NVML)\tFREE\tCATALOGUE ENTRY")
	for _, g := range gpus {
		entry := "- (not in the catalogue)"
		if g.Catalog != nil {
			entry = fmt.Sprintf("%s (%s CUDA-visible)", g.Catalog.Name, gib(g.Catalog.MemoryBytes))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", g.Index, g.Name, gib(int64(g.MemoryTotalBytes)), gib(int64(g.MemoryFreeBytes)), entry)
	}
	return tw.Flush()
}

// catalogReport is the JSON of `warden gpus --catalog --json`.
type catalogReport struct {
	GPUs   []hardware.GPU   `json:"gpus"`
	Models []hardware.Model `json:"models"`
}

func printCatalog(out io.Writer, asJSON bool) error {
	gpus, models := hardware.GPUs(), hardware.Models()
	if asJSON {
		return writeJSON(out, catalogReport{GPUs: gpus, Models: models})
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tMEMORY (CUDA)\tON THE BOX\tBANDWIDTH\tBF16 DENSE\tFP8 DENSE\tSOURCE")
	for _, g := range gpus {
		fp8 := "-"
		if g.FP8FLOPS > 0 {
			fp8 = fmt.Sprintf("%.0f TFLOP/s", g.FP8FLOPS/1e12)
		}
		fmt.Fprintf(tw, "%s\t%s\t%g GB\t%.0f GB/s\t%.0f TFLOP/s\t%s\t%s\n",
			g.Name, gib(g.MemoryBytes), g.MarketingMemoryGB, g.MemoryBandwidthBytesPerSec/1e9, g.BF16FLOPS/1e12, fp8, g.Source)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPARAMS\tLAYERS\tQ/KV HEADS\tHEAD DIM\tKV/TOKEN (BF16)\tSLIDING WINDOW")
	for _, m := range models {
		sw := "-"
		if m.SlidingLayers > 0 {
			sw = fmt.Sprintf("%d tokens on %d of %d layers", m.SlidingWindowTokens, m.SlidingLayers, m.NumLayers)
		}
		perToken := int64(2*(m.NumLayers-m.SlidingLayers)*m.NumKVHeads*m.HeadDim) * 2
		note := ""
		if m.SlidingLayers > 0 {
			note = " (global layers)"
		}
		fmt.Fprintf(tw, "%s\t%.2fB\t%d\t%d/%d\t%d\t%s%s\t%s\n",
			m.Name, float64(m.ParamCount)/1e9, m.NumLayers, m.NumAttentionHeads, m.NumKVHeads, m.HeadDim, kib(perToken), note, sw)
	}
	return tw.Flush()
}

func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/hardware.GiB) }
func kib(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024) }

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lm-warden/warden/hardware"
)

func TestGPUsCatalog(t *testing.T) {
	out, err := runWarden(t, "gpus", "--catalog")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RTX A4000", "15.72 GiB", "H200", "MI300X", "Qwen/Qwen3-4B-Instruct-2507", "144.0 KiB", "1024 tokens on 52 of 62 layers"} {
		if !strings.Contains(out, want) {
			t.Errorf("catalogue table lacks %q:\n%s", want, out)
		}
	}
	out, err = runWarden(t, "gpus", "--catalog", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var c catalogReport
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatal(err)
	}
	if len(c.GPUs) != len(hardware.GPUs()) || len(c.Models) != len(hardware.Models()) || c.GPUs[0].MemoryBytes == 0 {
		t.Errorf("catalogue JSON: %d GPUs, %d models", len(c.GPUs), len(c.Models))
	}
}

func TestGPUsDetected(t *testing.T) {
	g, _ := hardware.MatchNVMLName("NVIDIA RTX A4000")
	devices := []hardware.DetectedGPU{
		{Index: 0, Name: "NVIDIA RTX A4000", MemoryTotalBytes: 16376 << 20, MemoryFreeBytes: 16000 << 20, Catalog: &g},
		{Index: 1, Name: "NVIDIA A10G", MemoryTotalBytes: 23028 << 20, MemoryFreeBytes: 22000 << 20},
	}
	var out bytes.Buffer
	if err := runGPUs(context.Background(), &gpusOptions{probe: fakeProbe(devices, nil)}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NVIDIA RTX A4000", "RTX A4000 (15.72 GiB CUDA-visible)", "NVIDIA A10G", "not in the catalogue"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runGPUs(context.Background(), &gpusOptions{JSON: true, probe: fakeProbe(devices, nil)}, &out); err != nil {
		t.Fatal(err)
	}
	var got []hardware.DetectedGPU
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Catalog == nil || got[0].Catalog.Name != "RTX A4000" || got[1].Catalog != nil {
		t.Errorf("JSON: %+v", got)
	}
}

func TestGPUsNoDriver(t *testing.T) {
	noDriver := fmt.Errorf("%w (NVML: ERROR_LIBRARY_NOT_FOUND)", hardware.ErrNoDriver)
	var out bytes.Buffer
	err := runGPUs(context.Background(), &gpusOptions{probe: fakeProbe(nil, noDriver)}, &out)
	if !errors.Is(err, hardware.ErrNoDriver) || !strings.HasPrefix(err.Error(), "no NVIDIA driver found") || !strings.Contains(err.Error(), "--catalog") {
		t.Errorf("got %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("wrote to stdout on error: %q", out.String())
	}
	// --catalog never needs the driver.
	if err := runGPUs(context.Background(), &gpusOptions{Catalog: true, probe: fakeProbe(nil, noDriver)}, &out); err != nil {
		t.Errorf("--catalog without driver: %v", err)
	}
}

// On this machine, the real probe: an error wrapping ErrNoDriver, or devices.
func TestGPUsReal(t *testing.T) {
	out, err := runWarden(t, "gpus", "--json")
	if err != nil {
		if !errors.Is(err, hardware.ErrNoDriver) {
			t.Fatalf("got %v, want ErrNoDriver or success", err)
		}
		return
	}
	var got []hardware.DetectedGPU
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) == 0 {
		t.Fatalf("with a driver: %v, %s", err, out)
	}
}

package main

// The helpers every command shares to write its results and read saved
// ones: JSON on stdout, output files, saved results, and the progress bar
// drawn on stderr.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lm-warden/warden/planner"
	"github.com/lm-warden/warden/sim"
	"github.com/lm-warden/warden/web"
)

// writeJSON writes v as indented JSON: every command's --json.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeOutFile writes data into path through a temporary file, so that a
// failed write leaves neither a half file nor the temporary one. Errors
// name path, never the temporary file.
func writeOutFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return outError(path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return outError(path, err)
	}
	return nil
}

// outError says that path could not be written, and why, without the
// temporary file's name.
func outError(path string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	return fmt.Errorf("cannot write %s: %w", path, err)
}

// checkOutPath checks, before any work, that path can be written: its
// directory exists and takes a file, and path is not a directory. "" (no
// file) passes.
func checkOutPath(flag, path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("%s %s: is a directory", flag, path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("%s: %w", flag, outError(path, err))
	}
	name := f.Name()
	_ = f.Close()
	_ = os.Remove(name)
	return nil
}

// writeReport renders r into path; a failed render writes nothing.
func writeReport(path string, r *web.Report) error {
	var b bytes.Buffer
	if err := r.Render(&b); err != nil {
		return err
	}
	return writeOutFile(path, b.Bytes())
}

// readResult reads a saved result file; see decodeResult. Errors after the
// read name the file.
func readResult(path string) (*planner.Result, *sim.Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	res, rep, err := decodeResult(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, rep, nil
}

// decodeResult tells a `warden plan --json` result (its "kind" is
// planner.Kind) from a `warden sim --json` or `warden bench --json` report
// (no kind, at least one row) and decodes it: exactly one of the two
// results is non-nil when the error is nil.
func decodeResult(data []byte) (*planner.Result, *sim.Report, error) {
	var probe struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, nil, fmt.Errorf("not a JSON result: %w", err)
	}
	switch probe.Kind {
	case planner.Kind:
		res, err := planner.ReadResult(data)
		if err != nil {
			return nil, nil, err
		}
		return res, nil, nil
	case "":
		var rep sim.Report
		if err := planner.DecodeJSON(data, &rep); err != nil {
			return nil, nil, fmt.Errorf("want a warden sim --json or warden bench --json report: %w", err)
		}
		if len(rep.Rows) == 0 {
			return nil, nil, fmt.Errorf("the report has no rows")
		}
		return nil, &rep, nil
	}
	return nil, nil, fmt.Errorf("kind %q: want %q (warden plan --json) or a warden sim --json report", probe.Kind, planner.Kind)
}

// isTerminal reports whether w is a character device (a terminal), without
// a dependency beyond the standard library.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// newProgressBar returns the progress bar when show is set and stderr is
// a terminal (terminal, when set, answers that instead: tests), else nil
// (progress.go: its clock is the wall clock's).
func newProgressBar(show bool, stderr io.Writer, terminal func() bool, desc string, throttle time.Duration) *progress {
	if !show {
		return nil
	}
	return newProgress(progressConfig{bar: true, stderr: stderr, terminal: terminal, desc: desc, throttle: throttle})
}

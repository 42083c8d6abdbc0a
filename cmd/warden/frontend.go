package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/lm-warden/warden/live"
	"github.com/spf13/pflag"
)

// addFrontEndFlags declares the flags warden proxy and warden epp share,
// once: --config (required; configWords says what it is), --check,
// --log-level and --session-key-file.
func addFrontEndFlags(f *pflag.FlagSet, config *string, check *bool, logLevel, sessionKeyFile *string, configWords string) {
	f.StringVar(config, "config", "", configWords+" (required)")
	f.BoolVar(check, "check", false, "validate the configuration and exit")
	f.StringVar(logLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
	f.StringVar(sessionKeyFile, "session-key-file", "", "read session_key from this file (a Kubernetes Secret's key mounted as a file); the configuration then carries none")
}

// newLogger is the logger of warden proxy and warden epp: text lines on
// logOut at --log-level.
func newLogger(level string, logOut io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: l})), nil
}

// listenAddr is one address a front end listens on; flag names the flag
// that gave it, to name in an error ("": none, the configuration's).
type listenAddr struct{ addr, flag string }

// frontEnd is what warden proxy and warden epp share once configured:
// the listeners, SIGHUP reloads, and serving until ctx is done.
type frontEnd struct {
	// addrs are the addresses listened on, in order; an empty addr is no
	// listener (nil in serve's list).
	addrs []listenAddr
	// banner is the line that says where it listens, printed once every
	// listener is open and SIGHUP is caught (a reload may follow it at
	// once).
	banner func(lns []net.Listener) string
	// config is the file a reload reads again (for "reloaded FILE"):
	// load reads it, apply swaps the running configuration for it.
	config string
	load   func() (*live.Config, error)
	apply  func(*live.Config) error
	// serve serves on the listeners until ctx is done.
	serve func(ctx context.Context, lns []net.Listener) error
}

// run opens the listeners, catches SIGHUP, prints the banner on out and
// serves, reloading at each SIGHUP (a failed reload is logged and keeps
// the running configuration) until ctx is done or serve returns.
func (f frontEnd) run(ctx context.Context, out io.Writer, log *slog.Logger) error {
	lns := make([]net.Listener, len(f.addrs))
	closeAll := func() {
		for _, l := range lns {
			if l != nil {
				l.Close()
			}
		}
	}
	for i, a := range f.addrs {
		if a.addr == "" {
			continue
		}
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			closeAll()
			if a.flag != "" {
				return fmt.Errorf("%s: %w", a.flag, err)
			}
			return err
		}
		lns[i] = l
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if _, err := fmt.Fprintln(out, f.banner(lns)); err != nil {
		closeAll()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				next, err := f.load()
				if err == nil {
					err = f.apply(next)
				}
				if err != nil {
					log.Error("reload failed; keeping the running configuration", "err", err)
					continue
				}
				fmt.Fprintf(out, "reloaded %s\n", f.config)
			}
		}
	}()
	return f.serve(ctx, lns)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	interrupted := ctx.Err() != nil
	stop()
	if err != nil {
		os.Exit(report(os.Stderr, err, interrupted))
	}
}

// report writes err and returns the exit status: an interrupted run
// (Ctrl-C, SIGTERM) says so in one line, whatever its parts returned (each
// strategy of a simulation its own "context canceled").
func report(w io.Writer, err error, interrupted bool) int {
	if interrupted && errors.Is(err, context.Canceled) {
		fmt.Fprintln(w, "warden: interrupted")
		return 130
	}
	fmt.Fprintln(w, "warden:", err)
	return 1
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// usageError is a bad command line or configuration (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// runNVML runs "nvml census".
func runNVML(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "census" {
		if len(args) > 0 {
			fmt.Fprintf(stderr, "gpu-node-agent nvml: unknown command %q (census)\n", args[0])
		}
		fmt.Fprintln(stderr, "usage: gpu-node-agent nvml census [--simulate PROFILE] [--nvml-call-timeout D] [-o FILE]")
		return 2
	}
	err := runNVMLCensus(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "gpu-node-agent nvml census: %v\n", err)
	if errors.As(err, new(usageError)) || errors.Is(err, errNoSimulator) {
		return 2
	}
	return 1
}

// runNVMLCensus calls every NVML method the agent uses on every GPU and
// MIG device of the node (real NVML, or --simulate) through the agent's
// NVML owner and prints the answers as JSON (nvmlowner.Census). It is
// read-only. Calls answering NOT_SUPPORTED, NO_PERMISSION or timing out
// are data; the one error is an NVML that cannot be initialised.
func runNVMLCensus(args []string, stdout, stderr io.Writer) error {
	cfg := defaults()
	fs := flag.NewFlagSet("nvml census", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Simulate, "simulate", "", "take the census of a simulated node: PROFILE[,mig=GPU:PROF+PROF...] or FILE.json")
	fs.StringVar(&cfg.SimFaults, "sim-faults", "", "faults the simulated node has from the start: KIND[:GPU][=VALUE],..., e.g. hang:3, old-driver (simulate only)")
	fs.Var(&cfg.NVMLCallTimeout, "nvml-call-timeout", "bound on every NVML call; a call that outlives it is recorded as CALL_TIMEOUT and the GPU's later calls are not made")
	out := fs.String("o", "", "write the census to `FILE` instead of stdout")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "log level (logs go to stderr)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if err := cfg.Validate(); err != nil {
		return usageError{err}
	}
	log := newLogger(stderr, "text", cfg.LogLevel)
	hw, err := openHardware(&cfg, log)
	if err != nil {
		return err
	}
	defer hw.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	census, err := hw.Owner().Census(ctx, nvmlowner.CensusOptions{})
	if err != nil {
		return fmt.Errorf("NVML cannot be initialised: %w", err)
	}
	b, err := json.MarshalIndent(census, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if *out == "" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

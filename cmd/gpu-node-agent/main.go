// Command gpu-node-agent serves a node's GPUs (whole and MIG) to the
// kubelet as device-plugin resources, on real NVML. Built with -tags
// simulator (gpu-node-agent-sim) it also runs on a simulated node
// (--simulate, demo); the product binary has no simulator code. main only
// wires: configuration, logging, hardware, then package agent runs it all.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	// Grows the main goroutine's stack before the deep package inits, so
	// that it is copied once instead of five times (its doc).
	_ "github.com/gpu-node-agent/gpu-node-agent/internal/mainstack"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run is main without the process: it returns the exit code.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "version":
			fmt.Fprintln(stdout, "gpu-node-agent", version)
			return 0
		case "topology":
			return runTopology(args[1:], stdout, stderr, getenv)
		case "demo":
			return runDemo(args[1:], stdout, stderr, getenv)
		case "preflight":
			return runPreflight(args[1:], stdout, stderr, getenv)
		case "nvml":
			return runNVML(args[1:], stdout, stderr)
		default:
			fmt.Fprintf(stderr, "gpu-node-agent: unknown command %q (commands: demo, preflight, version, topology dump, topology labels, topology preferred, nvml census)\n", args[0])
			return 2
		}
	}

	cfg, code, ok := validConfig("gpu-node-agent", args, getenv, stderr, (*Config).validatePreflightGate)
	if !ok {
		return code
	}
	log := newLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	// client-go and friends log through klog; send it to the same place.
	klog.SetSlogLogger(log)
	cfg.logNVIDIAIgnored(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal starts a graceful stop, a second one
		// kills the process the default way.
		<-ctx.Done()
		stop()
	}()
	if err := runAgent(ctx, cfg, log, stdout); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

// newLogger builds the process logger; format and level are validated.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	lvl, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// validConfig loads and validates the configuration of prog (the agent or
// a subcommand) from args, env and the config file, with extra checks of
// its own. When it is not ok, the exit code is 0 (help was asked for) or 2
// (a bad configuration, written to stderr).
func validConfig(prog string, args []string, getenv func(string) string, stderr io.Writer, extra ...func(*Config) error) (Config, int, bool) {
	cfg, err := loadConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return cfg, 0, false
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return cfg, 2, false
	}
	errs := []error{cfg.Validate()}
	for _, f := range extra {
		errs = append(errs, f(&cfg))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(stderr, "%s: invalid configuration:\n%v\n", prog, err)
		return cfg, 2, false
	}
	return cfg, 0, true
}

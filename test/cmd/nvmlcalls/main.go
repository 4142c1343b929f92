// Command nvmlcalls measures how many NVML calls a running gpu-node-agent
// makes at steady state: it starts the agent on a simulated node, reads the
// simulator's per-method call counts (GET /calls on --sim-control-address)
// once start-up and the first rescans are over and again at the end, and
// prints the difference as calls per minute, in total and per method.
//
//	nvmlcalls -agent bin/gpu-node-agent -warmup 60s -duration 300s -- \
//	    --simulate dgx-h100 --mig-strategy mixed
//
// The arguments after -- go to the agent; nvmlcalls adds
// --device-plugin-dir (a temporary directory), --metrics-address and
// --sim-control-address (free loopback ports) unless they are given.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

func main() {
	agent := flag.String("agent", "bin/gpu-node-agent-sim", "the gpu-node-agent binary built with the simulator (make build-sim)")
	warmup := flag.Duration("warmup", 60*time.Second, "time after the agent starts at which the first count is read (start-up and discovery are left out)")
	duration := flag.Duration("duration", 300*time.Second, "time after the agent starts at which the last count is read and the agent is stopped")
	top := flag.Int("top", 10, "methods to list, most called first (0: all)")
	logPath := flag.String("agent-log", "", "file for the agent's output (default: discarded, its tail printed if it fails)")
	flag.Parse()
	if *duration <= *warmup {
		fatalf("-duration %s: must be longer than -warmup %s", *duration, *warmup)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *agent, flag.Args(), *warmup, *duration, *top, *logPath); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nvmlcalls: "+format+"\n", args...)
	os.Exit(1)
}

func run(ctx context.Context, agent string, args []string, warmup, duration time.Duration, top int, logPath string) error {
	args, cleanup, err := completeArgs(args)
	if err != nil {
		return err
	}
	defer cleanup()
	control := flagValue(args, "sim-control-address")

	var out *os.File
	if logPath != "" {
		out, err = os.Create(logPath)
	} else {
		out, err = os.CreateTemp("", "nvmlcalls-agent-*.log")
		if err == nil {
			defer os.Remove(out.Name())
		}
	}
	if err != nil {
		return fmt.Errorf("agent log: %w", err)
	}
	defer out.Close()

	cmd := exec.Command(agent, args...)
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent %s: %w", agent, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("agent: %s %s\n", agent, strings.Join(args, " "))

	fail := func(err error) error {
		stopAgent(cmd, exited)
		return fmt.Errorf("%w\n%s", err, tail(out.Name(), 20))
	}
	first, err := readAt(ctx, control, start.Add(warmup), exited)
	if err != nil {
		return fail(fmt.Errorf("calls at %s: %w", warmup, err))
	}
	last, err := readAt(ctx, control, start.Add(duration), exited)
	if err != nil {
		return fail(fmt.Errorf("calls at %s: %w", duration, err))
	}
	if err := stopAgent(cmd, exited); err != nil {
		fmt.Fprintf(os.Stderr, "nvmlcalls: stopping agent: %v\n", err)
	}
	report(os.Stdout, first, last, warmup, duration, top)
	return nil
}

// completeArgs adds the agent flags nvmlcalls needs and the caller left
// out; cleanup removes the temporary device-plugin directory.
func completeArgs(args []string) ([]string, func(), error) {
	cleanup := func() {}
	args = slices.Clone(args)
	if flagValue(args, "device-plugin-dir") == "" {
		dir, err := os.MkdirTemp("", "nvmlcalls-dp-*")
		if err != nil {
			return nil, cleanup, fmt.Errorf("device-plugin dir: %w", err)
		}
		cleanup = func() { os.RemoveAll(dir) }
		args = append(args, "--device-plugin-dir", dir)
	}
	for _, name := range []string{"metrics-address", "sim-control-address"} {
		if flagValue(args, name) != "" {
			continue
		}
		port, err := freeport.Get()
		if err != nil {
			return nil, cleanup, fmt.Errorf("%s: %w", name, err)
		}
		args = append(args, "--"+name, "127.0.0.1:"+strconv.Itoa(port))
	}
	if flagValue(args, "simulate") == "" {
		return nil, cleanup, errors.New("agent arguments: --simulate is required (the call counts come from the simulator)")
	}
	return args, cleanup, nil
}

// flagValue finds --name value or --name=value (one or two dashes) in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// readAt waits until at, then reads the simulator's call counts.
func readAt(ctx context.Context, control string, at time.Time, exited <-chan error) (map[string]uint64, error) {
	select {
	case <-time.After(time.Until(at)):
	case err := <-exited:
		return nil, fmt.Errorf("agent exited early: %v", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return readCalls(ctx, control)
}

func readCalls(ctx context.Context, control string) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+control+"/calls", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get /calls: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("get /calls: %s: %s", resp.Status, b)
	}
	calls := map[string]uint64{}
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		return nil, fmt.Errorf("get /calls: decode: %w", err)
	}
	return calls, nil
}

// stopAgent sends SIGTERM and, if the agent has not exited 15 s later,
// SIGKILL.
func stopAgent(cmd *exec.Cmd, exited <-chan error) error {
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-exited:
		return nil
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-exited
		return errors.New("agent did not exit 15s after SIGTERM; killed")
	}
}

func report(w io.Writer, first, last map[string]uint64, warmup, duration time.Duration, top int) {
	minutes := (duration - warmup).Minutes()
	type row struct {
		method string
		delta  uint64
	}
	var rows []row
	var total, startup uint64
	for m, v := range last {
		d := v - min(v, first[m])
		total += d
		if d > 0 {
			rows = append(rows, row{m, d})
		}
	}
	for _, v := range first {
		startup += v
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.delta != b.delta {
			if a.delta > b.delta {
				return -1
			}
			return 1
		}
		return strings.Compare(a.method, b.method)
	})
	fmt.Fprintf(w, "NVML calls in the first %s: %d\n", warmup, startup)
	fmt.Fprintf(w, "NVML calls from %s to %s: %d = %.1f calls/min (%d methods)\n", warmup, duration, total, float64(total)/minutes, len(rows))
	if top > 0 && len(rows) > top {
		rows = rows[:top]
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-44s %9.1f/min %5.1f%%\n", r.method, float64(r.delta)/minutes, 100*float64(r.delta)/float64(max(total, 1)))
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "agent log tail:\n  " + strings.Join(lines, "\n  ")
}

// Command rssfaults tells what brings the agent binary's pages into its
// resident set: it runs a copy of the binary under `perf record -e
// page-faults -d -g` for a while, then sorts every page fault on the
// binary's own file-backed sections (.text, .rodata, .gopclntab, ...) by
// section and by what the faulting code was doing (the Go runtime
// starting, package initialisation, the agent itself, a goroutine's stack
// growing, the rest of the runtime).
//
// On a file mapping each such fault maps the whole fault-around window
// (64 KiB by default) when its pages are in the page cache, so the count
// of faults times 64 KiB is, near enough, the binary's RssFile.
//
//	rssfaults -bin .build/rssfaults/agent -duration 6s -- --metrics-address 127.0.0.1:0 ...
//
// The binary must carry its symbol table (built without -s) so that perf
// can name the frames; -s moves no section, so the numbers hold for the
// stripped product (`make measure-rss-faults` builds it that way).
package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

func main() {
	bin := flag.String("bin", "", "the agent binary, with its symbol table")
	duration := flag.Duration("duration", 6*time.Second, "how long the agent runs under perf")
	top := flag.Int("top", 15, "how many packages and functions to list per phase")
	module := flag.String("module", "github.com/gpu-node-agent/gpu-node-agent", "the agent's module path: frames under it are the agent's own")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "rssfaults: -bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *duration, *top, *module, flag.Args(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rssfaults:", err)
		os.Exit(1)
	}
}

func run(bin string, d time.Duration, top int, module string, args []string, out io.Writer) error {
	sections, err := fileSections(bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "rssfaults-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A copy, as measure-rss-real runs one: the file the linker has just
	// written sits in the page cache in larger folios.
	agent := filepath.Join(dir, "agent")
	if err := agentproc.CopyBinary(bin, agent); err != nil {
		return err
	}
	data := filepath.Join(dir, "perf.data")
	rec := exec.Command("perf", append([]string{"record", "-q", "-e", "page-faults", "-c", "1", "-d", "-g", "-o", data, "--", agent}, args...)...)
	rec.Dir = dir
	rec.Stdout, rec.Stderr = io.Discard, os.Stderr
	rec.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := rec.Start(); err != nil {
		return fmt.Errorf("perf record (Debian package linux-perf): %w", err)
	}
	time.Sleep(d)
	mem := status(rec.Process.Pid)
	// perf stops recording on SIGINT and ends its workload; the group
	// kill afterwards takes whatever is left.
	_ = rec.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- rec.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-rec.Process.Pid, syscall.SIGKILL)
		<-done
		return errors.New("perf record did not stop within 30s of SIGINT")
	}
	_ = syscall.Kill(-rec.Process.Pid, syscall.SIGKILL)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script := exec.CommandContext(ctx, "perf", "script", "-i", data, "-F", "addr,ip,sym")
	var stderr bytes.Buffer
	script.Stderr = &stderr
	text, err := script.Output()
	if err != nil {
		return fmt.Errorf("perf script: %w: %s", err, stderr.Bytes())
	}
	r := classify(parseScript(text), sections, module)
	if mem != "" {
		fmt.Fprintf(out, "the agent after %s: %s\n", d, mem)
	}
	r.print(out, d, top)
	return nil
}

// fileSections are the binary's allocated, file-backed sections.
func fileSections(bin string) ([]section, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []section
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || s.Size == 0 {
			continue
		}
		out = append(out, section{name: s.Name, start: s.Addr, end: s.Addr + s.Size})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no allocated sections", bin)
	}
	return out, nil
}

// status is the memory lines of /proc/PID/status of perf's workload (its
// child), "" when it can't be found.
func status(perfPID int) string {
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", perfPID, perfPID))
	if err != nil {
		return ""
	}
	for _, child := range strings.Fields(string(children)) {
		b, err := os.ReadFile("/proc/" + child + "/status")
		if err != nil {
			continue
		}
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && (k == "VmRSS" || k == "RssAnon" || k == "RssFile") {
				out = append(out, k+" "+strings.Join(strings.Fields(v), " "))
			}
		}
		return strings.Join(out, ", ")
	}
	return ""
}

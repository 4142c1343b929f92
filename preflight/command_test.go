package preflight

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCommand(t *testing.T) {
	sh := func(script string) []string { return []string{"/bin/sh", "-c", script} }
	tests := []struct {
		name   string
		cmd    CommandConfig
		status Status
		detail string
	}{
		{name: "exits 0", cmd: CommandConfig{Args: sh("echo bandwidth ok")}, status: Pass, detail: "exited 0"},
		{name: "gets the GPUs", cmd: CommandConfig{Args: sh(`test "$GNA_PREFLIGHT_GPUS" = "GPU-a,GPU-b"`)}, status: Pass},
		{name: "exits 3", cmd: CommandConfig{Args: sh("echo 'h2d bandwidth 12.1 GB/s below 50' >&2; exit 3")}, status: Fail,
			detail: "exited with status 3, want 0; output ends: h2d bandwidth 12.1 GB/s below 50"},
		{name: "output cut to its end", cmd: CommandConfig{Args: sh("seq 1 5000; exit 1"), OutputBytes: 16}, status: Fail,
			detail: "output ends: ...4998 | 4999 | 5000"},
		{name: "no output", cmd: CommandConfig{Args: sh("exit 1")}, status: Fail, detail: "status 1, want 0 (no output)"},
		{name: "times out", cmd: CommandConfig{Args: sh("sleep 3600"), Timeout: Duration(200 * time.Millisecond)}, status: Fail,
			detail: "sleep 3600 timed out after 200ms, killed"},
		{name: "not found", cmd: CommandConfig{Args: []string{"/nonexistent/nvbandwidth"}}, status: Fail, detail: "/nonexistent/nvbandwidth did not run"},
		{name: "none configured", status: Skipped, detail: "no command configured (preflight.command.args)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Command: tc.cmd}.WithDefaults()
			r := checkCommand(context.Background(), cfg, []string{"GPU-a", "GPU-b"}, nil)
			if r.Item != ItemCommand || r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s %q, want %s containing %q", r.Status, r.Detail, tc.status, tc.detail)
			}
		})
	}
}

// TestCommandTimeoutKillsItsProcesses: what the command started is
// killed with it at the timeout, not left running.
func TestCommandTimeoutKillsItsProcesses(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cfg := Config{Command: CommandConfig{
		Args: []string{"/bin/sh", "-c", `sleep 3600 & echo $! > "$0"; wait`, pidFile},
		// Long enough for the shell to start its child and write the PID
		// on a loaded machine.
		Timeout: Duration(2 * time.Second),
	}}.WithDefaults()
	r := checkCommand(context.Background(), cfg, nil, nil)
	if r.Status != Fail || !strings.Contains(r.Detail, "timed out") {
		t.Fatalf("%s %q", r.Status, r.Detail)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// A liveness bound, not a timing assertion: the SIGKILL was sent
	// before checkCommand returned; the process only has to be reaped.
	deadline := time.Now().Add(20 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the command's child %d still runs after its timeout", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// running says whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestCommandStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := checkCommand(ctx, Config{Command: CommandConfig{Args: []string{"/bin/sh", "-c", "sleep 3600"}}}.WithDefaults(), nil, nil)
	if r.Status != Fail {
		t.Errorf("%s %q, want fail", r.Status, r.Detail)
	}
}

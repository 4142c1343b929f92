package remediate

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fakeSMI writes an nvidia-smi stand-in that logs its arguments to log
// and answers persistence mode pm; the reset (-r) runs resetScript.
func fakeSMI(t *testing.T, pm, resetScript string) (cmd []string, log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	script := `#!/bin/sh
echo "$*" >> ` + log + `
case "$1" in
--query-gpu=persistence_mode) echo ` + pm + ` ;;
-r) ` + resetScript + ` ;;
esac
`
	p := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{p}, log
}

func calls(t *testing.T, log string) string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestExecResetter(t *testing.T) {
	g := topology.GPU{UUID: "GPU-1", PCIBusID: "00000000:19:00.0"}
	const bus = "-i 00000000:19:00.0"
	for _, tc := range []struct {
		name, pm, reset string
		timeout         time.Duration
		wantCalls       []string
		wantErr         string
		wantTimedOut    bool
	}{
		{"persistence off", "Disabled", "exit 0", time.Minute,
			[]string{"--query-gpu=persistence_mode --format=csv,noheader " + bus, "-r " + bus}, "", false},
		{"persistence on: off, reset, on", "Enabled", "exit 0", time.Minute,
			[]string{"--query-gpu=persistence_mode --format=csv,noheader " + bus, "-pm 0 " + bus, "-r " + bus, "-pm 1 " + bus}, "", false},
		{"failed reset still restores persistence", "Enabled", "echo 'In use by another client' >&2; exit 255", time.Minute,
			[]string{"--query-gpu=persistence_mode --format=csv,noheader " + bus, "-pm 0 " + bus, "-r " + bus, "-pm 1 " + bus},
			"exited with status 255, want 0; output ends: In use by another client", false},
		{"hang", "Disabled", "sleep 3600", 300 * time.Millisecond,
			[]string{"--query-gpu=persistence_mode --format=csv,noheader " + bus, "-r " + bus}, "timed out", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, log := fakeSMI(t, tc.pm, tc.reset)
			timedOut, err := ExecResetter{Command: cmd}.Reset(context.Background(), g, tc.timeout)
			if got := calls(t, log); got != strings.Join(tc.wantCalls, "\n") {
				t.Errorf("calls:\n%s\nwant:\n%s", got, strings.Join(tc.wantCalls, "\n"))
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err %v, want %q", err, tc.wantErr)
			}
			if timedOut != tc.wantTimedOut {
				t.Errorf("timedOut %v", timedOut)
			}
		})
	}
}

func TestFabricManagerRunning(t *testing.T) {
	root := t.TempDir()
	write := func(pid, comm string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, "proc", pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "proc", pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1", "systemd")
	if FabricManagerRunning(root) {
		t.Fatal("found a Fabric Manager that does not run")
	}
	write("812", "nv-fabricmanager")
	if !FabricManagerRunning(root) {
		t.Fatal("missed nv-fabricmanager")
	}
}

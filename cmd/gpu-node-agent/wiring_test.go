//go:build simulator

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// simCalls reads the simulator's NVML call counts.
func simCalls(t *testing.T, addr string) map[string]uint64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var calls map[string]uint64
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatalf("GET /calls: %v", err)
	}
	return calls
}

// TestBadSectionConfig: a bad value in each config section exits 2 before
// anything is served, naming the field.
func TestBadSectionConfig(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		args []string
		want string
	}{
		{name: "health poll interval", yaml: "health:\n  pollInterval: 10ms\n", want: "health.pollInterval 10ms: must be at least 100ms"},
		{name: "health bad duration", yaml: "health:\n  recoveryPeriod: 5x\n", want: "health.recoveryPeriod: "},
		{name: "health duration as a number", yaml: "health:\n  recoveryPeriod: 300\n", want: `health.recoveryPeriod: duration 300 must be a string`},
		{name: "health unknown key", yaml: "health:\n  pollIntervl: 1s\n", want: `health: json: unknown field "pollIntervl"`},
		{name: "health fatal xids flag", args: []string{"--fatal-xids", "79,x"}, want: `"x" is not a number`},
		{name: "taint mode", args: []string{"--taint-mode", "sometimes", "--node-name", "n1"}, want: `taint.mode "sometimes": must be off, dry-run or on`},
		{name: "taint without node name", yaml: "taint:\n  mode: on\n", want: `taint.mode (--taint-mode) "on": needs node-name`},
		{name: "taint mode off unquoted is off", yaml: "taint:\n  mode: off\n  resync: 10ms\n", want: "taint.resync 10ms: must be at least 1s"},
		{name: "taint resync", yaml: "taint:\n  mode: dry-run\n  resync: 10ms\n", args: []string{"--node-name", "n1"}, want: "taint.resync 10ms: must be at least 1s"},
		{name: "metrics interval", args: []string{"--metrics-interval", "10ms"}, want: "metrics.interval (--metrics-interval) 10ms: must be at least 100ms"},
		{name: "metrics web config", yaml: "metrics:\n  webConfigFile: /nonexistent/web.yml\n", want: "metrics.webConfigFile (--web.config.file): "},
		{name: "rdma resource name", yaml: "rdma:\n  resources:\n  - name: \"\"\n", want: "rdma.resources[0].name: must not be empty"},
		{name: "rdma mode", yaml: "rdma:\n  resources:\n  - name: ib\n    mode: foo\n", want: "rdma.resources[0].mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "plugins")
			args := []string{"--simulate", "dgx-h100", "--device-plugin-dir", dir}
			if tc.yaml != "" {
				f := filepath.Join(t.TempDir(), "c.yaml")
				if err := os.WriteFile(f, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", f)
			}
			var stderr bytes.Buffer
			code := run(append(args, tc.args...), io.Discard, &stderr, func(string) string { return "" })
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Error("device-plugin dir created for a bad config")
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the agent's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

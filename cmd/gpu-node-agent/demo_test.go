//go:build simulator

package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDemoBanner checks that the banner names the settings the agent will
// use, wherever they come from, and not the demo's defaults.
func TestDemoBanner(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		// want and notWant are substrings; {dir} is the device-plugin dir.
		want, notWant []string
	}{
		{
			name: "demo defaults",
			want: []string{
				"a simulated DGX H100", "--mig-strategy mixed",
				"metrics            http://127.0.0.1:9400/metrics",
				"simulator control  http://127.0.0.1:9402 ",
				"curl -s -X POST 127.0.0.1:9402/mig",
				"curl -s -X POST 127.0.0.1:9402/faults -d '{\"kind\":\"xid\",\"gpu\":3,\"xid\":79}'",
				"device plugins     {dir}/gpu-node-agent-<resource>.sock",
				"kubelet socket     {dir}/kubelet.sock\n",
				"no kubelet here: the log says so once",
				"RDMA resources     rdma/ib",
				"healthy again 20s (health.recoveryPeriod)",
				"printed below",
			},
		},
		{
			name: "given addresses",
			args: []string{"--metrics-address", "127.0.0.1:19999", "--sim-control-address", "127.0.0.1:19998"},
			want: []string{
				"http://127.0.0.1:19999/metrics",
				"http://127.0.0.1:19998 ",
				"curl -s -X POST 127.0.0.1:19998/mig",
				"curl -s -X DELETE 127.0.0.1:19998/faults",
			},
			notWant: []string{":9400", ":9402"},
		},
		{
			name:    "all interfaces are reached on loopback",
			args:    []string{"--metrics-address", ":19997"},
			want:    []string{"metrics            http://127.0.0.1:19997/metrics"},
			notWant: []string{":9400"},
		},
		{
			name:    "metrics off",
			args:    []string{"--metrics-address="},
			want:    []string{"metrics            off (--metrics-address is empty)"},
			notWant: []string{"/metrics"},
		},
		{
			name:    "simulator control off",
			args:    []string{"--sim-control-address="},
			want:    []string{"simulator control  off (--sim-control-address is empty)"},
			notWant: []string{"curl", ":9402"},
		},
		{
			name:    "device-plugin dir given",
			args:    []string{"--device-plugin-dir", "/run/plugins"},
			want:    []string{"/run/plugins/gpu-node-agent-<resource>.sock", "/run/plugins/kubelet.sock"},
			notWant: []string{"{dir}"},
		},
		{
			name: "recovery period from the environment",
			env:  map[string]string{"GNA_RECOVERY_PERIOD": "45s"},
			want: []string{"healthy again 45s (health.recoveryPeriod)", "an event: healthy again 45s later"},
		},
		{
			name:    "another simulated node",
			args:    []string{"--simulate", "dgx-a100", "--mig-strategy", "single"},
			want:    []string{"a simulated node (--simulate dgx-a100)", "--mig-strategy single", "\"gpu\":0,\"xid\":79"},
			notWant: []string{"DGX H100", "\"gpu\":3"},
		},
		{
			name:    "inventory off",
			args:    []string{"--print-inventory=false"},
			notWant: []string{"printed below"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "demo.yaml")
			if err := os.WriteFile(config, []byte(demoConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append(demoArgs(dir, config), tc.args...)
			_, banner := demoPlan(args, func(k string) string { return tc.env[k] })
			if banner == "" {
				t.Fatal("no banner")
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "{dir}", dir); !strings.Contains(banner, w) {
					t.Errorf("banner lacks %q:\n%s", w, banner)
				}
			}
			for _, w := range tc.notWant {
				if w = strings.ReplaceAll(w, "{dir}", dir); strings.Contains(banner, w) {
					t.Errorf("banner has %q:\n%s", w, banner)
				}
			}
		})
	}
}

// TestDemoPlanPinsPortZero checks that a port 0 is replaced by a real port
// both in the banner and in the flags the agent gets, and that other
// addresses are passed as given.
func TestDemoPlanPinsPortZero(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// wantPinned are the flags whose port 0 must be pinned.
		wantPinned []string
	}{
		{name: "both", args: []string{"--metrics-address=127.0.0.1:0", "--sim-control-address=127.0.0.1:0"}, wantPinned: []string{"--metrics-address", "--sim-control-address"}},
		{name: "metrics only", args: []string{"--metrics-address=127.0.0.1:0"}, wantPinned: []string{"--metrics-address"}},
		{name: "none", args: []string{"--metrics-address=127.0.0.1:19999"}},
		{name: "metrics off", args: []string{"--metrics-address=", "--sim-control-address=127.0.0.1:0"}, wantPinned: []string{"--sim-control-address"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "demo.yaml")
			if err := os.WriteFile(config, []byte(demoConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			given := append(demoArgs(dir, config), tc.args...)
			args, banner := demoPlan(given, func(string) string { return "" })
			if strings.Contains(banner, ":0/") || strings.Contains(banner, ":0 ") {
				t.Errorf("banner names port 0:\n%s", banner)
			}
			extra := args[len(given):]
			if len(extra) != 2*len(tc.wantPinned) {
				t.Fatalf("extra flags %q, want one each for %q", extra, tc.wantPinned)
			}
			for i, flag := range tc.wantPinned {
				if extra[2*i] != flag {
					t.Errorf("extra flag %d is %q, want %q", i, extra[2*i], flag)
				}
				addr := extra[2*i+1]
				host, port, err := net.SplitHostPort(addr)
				if err != nil || host != "127.0.0.1" || port == "0" {
					t.Errorf("%s pinned to %q", flag, addr)
				}
				if !strings.Contains(banner, "http://"+addr) {
					t.Errorf("banner lacks http://%s:\n%s", addr, banner)
				}
			}
		})
	}
}

// TestDemoNamesBoundAddressesAndWaitsQuietly runs the demo with kernel
// chosen ports: the banner names the ports the agent logs it listens on,
// and the missing kubelet is at most one line, never a warning.
func TestDemoNamesBoundAddressesAndWaitsQuietly(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"demo", "--exit-after=2s", "--metrics-address=127.0.0.1:0", "--sim-control-address=127.0.0.1:0"},
		&stdout, &stderr, func(string) string { return "" })
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	out, logs := stdout.String(), stderr.String()
	for _, tc := range []struct {
		name, logLine, banner string
	}{
		{"metrics", `msg="metrics endpoint listening" addr=(\S+)`, "http://%s/metrics"},
		{"simulator control", `msg="simulator control endpoint listening" component=sim addr=(\S+)`, "http://%s "},
	} {
		m := regexp.MustCompile(tc.logLine).FindStringSubmatch(logs)
		if m == nil {
			t.Errorf("%s: no listening line in the log:\n%s", tc.name, logs)
			continue
		}
		if want := strings.Replace(tc.banner, "%s", m[1], 1); !strings.Contains(out, want) {
			t.Errorf("%s: banner lacks %q (the address the agent listens on):\n%s", tc.name, want, out)
		}
	}
	if n := strings.Count(logs, "no kubelet is listening"); n > 1 {
		t.Errorf("%d no-kubelet lines, want at most one:\n%s", n, logs)
	}
	if strings.Contains(logs, "registration with kubelet failed") {
		t.Errorf("registration failures logged above debug level:\n%s", logs)
	}
}

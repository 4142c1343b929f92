package simhw

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// TestOpen opens simulated DGX H100s in a temporary and in a given host
// root: NVML answers, discovery sees the profile's GPUs, a MIG change is
// signalled, and Close removes only a temporary root.
func TestOpen(t *testing.T) {
	tests := []struct {
		name     string
		hostRoot string
		wantTemp bool
	}{
		{name: "default host root is a temporary directory", hostRoot: "/", wantTemp: true},
		{name: "empty host root is a temporary directory", wantTemp: true},
		{name: "given host root", hostRoot: filepath.Join(t.TempDir(), "root")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			model, err := sim.Profile("dgx-h100")
			if err != nil {
				t.Fatal(err)
			}
			h, err := Open(Options{Model: model, Name: "dgx-h100", HostRoot: tc.hostRoot})
			if err != nil {
				t.Fatal(err)
			}
			root := h.HostRoot()
			if tc.wantTemp == (root == tc.hostRoot) {
				t.Errorf("host root %q for %q", root, tc.hostRoot)
			}
			if h.String() != "simulated dgx-h100" || !h.Simulated() {
				t.Errorf("String %q, Simulated %v", h.String(), h.Simulated())
			}
			n, err := h.Discover()
			if err != nil {
				t.Fatal(err)
			}
			if len(n.GPUs) != 8 || h.LastNode() != n {
				t.Errorf("discovered %d GPUs, want 8 (and LastNode the same node)", len(n.GPUs))
			}
			if err := h.Node().SetMIGLayout(0, []string{"3g.40gb", "3g.40gb"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.Changed():
			default:
				t.Error("no change signal after a MIG layout change")
			}
			// Without a control address there is nothing to serve.
			if err := h.Run(context.Background()); err != nil {
				t.Errorf("Run without a control address: %v", err)
			}
			h.Close()
			_, err = os.Stat(root)
			if removed := errors.Is(err, os.ErrNotExist); removed != tc.wantTemp {
				t.Errorf("host root removed by Close: %v, want %v", removed, tc.wantTemp)
			}
		})
	}
}

// TestOpenRefusesBadModel: a model the simulator refuses is an error and
// leaves no temporary directory behind.
func TestOpenRefusesBadModel(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	model, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	model.GPUs[1].UUID = model.GPUs[0].UUID
	if _, err := Open(Options{Model: model, Name: "dup"}); err == nil {
		t.Fatal("Open accepted two GPUs with one UUID")
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestOpenWithNVMLFailing: a node that boots with NVML failing opens (the
// init error is logged, as with the real library), discovers nothing
// while it fails, and discovers its GPUs once the failure is cleared.
func TestOpenWithNVMLFailing(t *testing.T) {
	model, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Open(Options{Model: model, Name: "dgx-h100", StartFaults: []sim.Fault{{Kind: sim.FaultNVMLFailure}}})
	if err != nil {
		t.Fatalf("open with NVML failing: %v", err)
	}
	defer h.Close()
	if n, err := h.Discover(); err == nil {
		t.Fatalf("discovered %d GPUs while NVML fails", len(n.GPUs))
	}
	rec := httptest.NewRecorder()
	h.Node().ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/faults", strings.NewReader(`{"kind":"nvml-failure"}`)))
	if rec.Code/100 != 2 {
		t.Fatalf("clear nvml-failure: %d %s", rec.Code, rec.Body)
	}
	n, err := h.Discover()
	if err != nil {
		t.Fatalf("discover after NVML recovered: %v", err)
	}
	if len(n.GPUs) != 8 {
		t.Errorf("discovered %d GPUs, want 8", len(n.GPUs))
	}
	// A fault the simulator refuses is a configuration error.
	if _, err := Open(Options{Model: model, StartFaults: []sim.Fault{{Kind: "no-such-fault"}}}); err == nil {
		t.Error("open with an unknown start fault succeeded")
	}
}

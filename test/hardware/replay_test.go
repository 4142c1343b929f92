package hardware

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// allowedList is the list of explained divergences.
const allowedList = "replay-allowed.txt"

// simCapture writes a capture of a simulated DGX H100 with GPU 0 in MIG
// mode, as the kit writes one (census and topology snapshot), and returns
// its directory and census.
func simCapture(t *testing.T) (string, *nvmlowner.Census) {
	t.Helper()
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(0, "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nvmlowner.New(node.NVML(), nvmlowner.Config{CallTimeout: 5 * time.Second}, nil).Census(context.Background(), nvmlowner.CensusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, captureCensus), b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, captureTopology))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := topology.WriteSnapshot(f, node.Spec()); err != nil {
		t.Fatal(err)
	}
	read, err := ReadCensus(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, read
}

// TestReplayFindsDivergences holds the replay itself: a capture of the
// simulator replays without a divergence, and each kind planted in it
// (another value of a static call, another return code, a call the
// simulator does not make) is found, once, and an allowed one carries its
// reason.
func TestReplayFindsDivergences(t *testing.T) {
	dir, capture := simCapture(t)
	simulated, err := SimCensus(context.Background(), dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d := Compare(capture, simulated, nil); len(d) != 0 {
		t.Fatalf("the simulator's own capture replays with %d divergences: %v", len(d), d)
	}

	planted := 0
	for i := range capture.Devices {
		dev := &capture.Devices[i]
		for j := range dev.Calls {
			c := &dev.Calls[j]
			switch {
			case dev.Parent == nil && dev.Index == 0 && c.Method == "GetName":
				c.Value = "NVIDIA Other"
				planted++
			case dev.Parent == nil && dev.Index == 1 && c.Method == "GetPowerUsage":
				c.Ret, c.Value = "ERROR_NOT_SUPPORTED", nil
				planted++
			case dev.Parent == nil && dev.Index == 2 && c.Method == "GetTemperature":
				// A reading: its value moves and is not compared.
				c.Value = 1000.0
			}
		}
		if dev.Parent == nil && dev.Index == 3 {
			dev.Calls = append(dev.Calls, nvmlowner.CensusCall{Method: "GetNvLinkState", Args: []any{99.0}, Ret: "SUCCESS", Value: "FEATURE_ENABLED"})
			planted++
		}
	}
	if planted != 3 {
		t.Fatalf("planted %d divergences, want 3", planted)
	}
	allowed := Allowed{{Method: "GetPowerUsage", What: "ret", Reason: "planted"}}
	got := Compare(capture, simulated, allowed)
	want := map[string]bool{
		`gpu 0 GetName(null) value: capture "NVIDIA Other", simulator "NVIDIA H100 80GB HBM3"`:             true,
		`gpu 1 GetPowerUsage(null) ret: capture ERROR_NOT_SUPPORTED, simulator SUCCESS (allowed: planted)`: true,
		`gpu 3 GetNvLinkState([99]) call: capture made, simulator not made`:                                true,
	}
	for _, d := range got {
		if !want[d.String()] {
			t.Errorf("unexpected divergence: %s", d)
		}
		delete(want, d.String())
	}
	for d := range want {
		t.Errorf("divergence not found: %s", d)
	}
}

// TestReplayCaptures replays every committed capture (captures/*/), and
// the one GNA_HW_CAPTURE names: the simulator, running the capture's node,
// must answer every call as the driver did, but for the divergences
// replay-allowed.txt explains.
func TestReplayCaptures(t *testing.T) {
	allowed, err := ReadAllowed(allowedList)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := filepath.Glob(filepath.Join("captures", "*", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range dirs {
		dirs[i] = filepath.Dir(d)
	}
	if dir := os.Getenv(CaptureEnv); dir != "" {
		dirs = append(dirs, dir)
	}
	if len(dirs) == 0 {
		t.Logf("no capture to replay: none is committed under captures/ and %s is not set", CaptureEnv)
		return
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			capture, err := ReadCensus(dir)
			if os.IsNotExist(err) {
				t.Skipf("%s has no census (NVML was unavailable where it was taken)", dir)
			}
			if err != nil {
				t.Fatal(err)
			}
			simulated, err := SimCensus(context.Background(), dir, t.TempDir())
			if err != nil {
				t.Fatalf("simulate capture:%s: %v", dir, err)
			}
			var explained int
			for _, d := range Compare(capture, simulated, allowed) {
				if d.AllowedBecause == "" {
					t.Errorf("%s", d)
					continue
				}
				explained++
				t.Logf("%s", d)
			}
			t.Logf("%s: %d devices replayed, %d divergences explained by %s", dir, len(capture.Devices), explained, allowedList)
		})
	}
}

func TestReadAllowed(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("# comment\n\nGetPowerUsage ret: the board reports no power sensor\n* call: a reason\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := ReadAllowed(good)
	if err != nil || len(a) != 2 || a[0].Reason != "the board reports no power sensor" || a[1].Method != "*" {
		t.Fatalf("ReadAllowed = %+v, %v", a, err)
	}
	for _, bad := range []string{"GetPowerUsage ret", "GetPowerUsage size: why", "GetPowerUsage ret:   "} {
		p := filepath.Join(dir, "bad")
		if err := os.WriteFile(p, []byte(bad+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadAllowed(p); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("ReadAllowed(%q): %v, want an error saying the format", bad, err)
		}
	}
	if _, err := ReadAllowed(allowedList); err != nil {
		t.Errorf("%s: %v", allowedList, err)
	}
}

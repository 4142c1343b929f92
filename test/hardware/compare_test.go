package hardware

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/compare"
	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// simCompareCapture writes the files hw-compare reads as the kit captures
// them on a simulated node: nvidia-smi's answers from one simulated node
// (simsmi's, package nvsmi) and the agent's census, topology and served
// devices from another built from the same model, as the two processes
// do.
func simCompareCapture(t *testing.T, profile string, opts ...sim.ProfileOption) string {
	t.Helper()
	model, err := sim.Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	smiNode, err := sim.New(model, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := nvsmi.Query(smiNode.NVML(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	x, err := nvsmi.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	write(compare.SMIXMLFile, x)
	list, err := nvsmi.List(smiNode.NVML())
	if err != nil {
		t.Fatal(err)
	}
	write(compare.SMIListFile, []byte(list))
	write(compare.UnavailFile, []byte("references/nvidia-smi-nvlink-s.txt: exit 1: simsmi: nvidia-smi nvlink -s: not simulated\n"))

	agentNode, err := sim.New(model, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	census, err := nvmlowner.New(agentNode.NVML(), nvmlowner.Config{CallTimeout: 10 * time.Second}, nil).
		Census(context.Background(), nvmlowner.CensusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(census)
	if err != nil {
		t.Fatal(err)
	}
	write(compare.CensusFile, b)
	var topo bytes.Buffer
	if err := topology.WriteSnapshot(&topo, agentNode.Spec()); err != nil {
		t.Fatal(err)
	}
	write(compare.TopologyFile, topo.Bytes())

	// What the device plugin serves with the mixed MIG strategy: whole
	// GPUs, and the MIG devices of GPUs in MIG mode.
	type dev struct {
		ID     string `json:"id"`
		Health string `json:"health"`
	}
	resources := map[string]map[string][]dev{}
	add := func(res, id string) {
		if resources[res] == nil {
			resources[res] = map[string][]dev{}
		}
		resources[res]["devices"] = append(resources[res]["devices"], dev{ID: id, Health: "Healthy"})
	}
	for _, g := range agentNode.Spec().GPUs {
		if !g.MIGEnabled {
			add("nvidia.com/gpu", g.UUID)
			continue
		}
		for _, m := range g.MIG {
			add("nvidia.com/mig-"+m.Profile, m.UUID)
		}
	}
	b, err = json.Marshal(map[string]any{"exercised": true, "resources": resources})
	if err != nil {
		t.Fatal(err)
	}
	write(compare.KubeletFile, b)
	return dir
}

// editXML changes the capture's nvidia-smi XML.
func editXML(t *testing.T, dir string, edit func(*nvsmi.Log)) {
	t.Helper()
	p := filepath.Join(dir, compare.SMIXMLFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	l, err := nvsmi.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	edit(l)
	if b, err = nvsmi.Marshal(l); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func compareCapture(t *testing.T, dir string, explained string) *compare.Report {
	t.Helper()
	in, err := compare.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := compare.Compare(in)
	ex, err := compare.ParseExplained(strings.NewReader(explained))
	if err != nil {
		t.Fatal(err)
	}
	r.Explain(ex)
	var out bytes.Buffer
	if err := r.Write(&out, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("hw-compare:\n%s", out.String())
	return r
}

// TestCompareSimAgrees: a simulated node's nvidia-smi answers and the
// agent's census, topology and served devices agree, with and without MIG.
func TestCompareSimAgrees(t *testing.T) {
	for _, tc := range []struct {
		name    string
		profile string
		opts    []sim.ProfileOption
		// minCompared guards against a comparison that silently
		// compares nothing.
		minCompared int
	}{
		{name: "dgx-h100", profile: "dgx-h100", minCompared: 250},
		{name: "dgx-h100-mig", profile: "dgx-h100", opts: []sim.ProfileOption{
			sim.WithMIG(0, "1g.10gb", "1g.10gb", "3g.40gb"), sim.WithMIG(5, "7g.80gb"),
		}, minCompared: 250},
		{name: "dgx-a100-mig", profile: "dgx-a100", opts: []sim.ProfileOption{sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb")}, minCompared: 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := compareCapture(t, simCompareCapture(t, tc.profile, tc.opts...), "")
			for _, f := range r.Unexplained() {
				t.Errorf("disagreement: %s", f.Line())
			}
			compared, _, _, _ := r.Counts()
			if compared < tc.minCompared {
				t.Errorf("compared %d values, want at least %d", compared, tc.minCompared)
			}
			if r.ExitCode() != 0 {
				t.Errorf("exit code %d, want 0", r.ExitCode())
			}
			if len(tc.opts) > 0 && !hasFinding(r, compare.Agree, "gpu 0 mig 2", "uuid (-L)") &&
				!hasFinding(r, compare.Agree, "gpu 1 mig 2", "uuid (-L)") {
				t.Error("no MIG device UUID was compared")
			}
		})
	}
}

func hasFinding(r *compare.Report, o compare.Outcome, subject, what string) bool {
	for _, f := range r.Findings {
		if f.Outcome == o && f.Subject == subject && f.What == what {
			return true
		}
	}
	return false
}

// TestComparePlanted: a disagreement planted in nvidia-smi's answers is
// reported (and only as that), makes the exit code 1, and an explanation
// that matches it makes it 0; a value within its tolerance or missing on
// one side is no disagreement.
func TestComparePlanted(t *testing.T) {
	base := simCompareCapture(t, "dgx-h100")
	temp := func(l *nvsmi.Log, gpu int, delta float64) {
		c, ok := nvsmi.Float(l.GPUs[gpu].Temperature.GPU, "C")
		if !ok {
			t.Fatalf("gpu %d temperature %q", gpu, l.GPUs[gpu].Temperature.GPU)
		}
		l.GPUs[gpu].Temperature.GPU = fmt.Sprintf("%g C", c+delta)
	}
	type want struct {
		outcome       compare.Outcome
		subject, what string
	}
	for _, tc := range []struct {
		name      string
		edit      func(*nvsmi.Log)
		explained string
		want      []want
		exit      int
	}{
		{
			name: "uuid",
			edit: func(l *nvsmi.Log) { l.GPUs[2].UUID = "GPU-00000000-0000-0000-0000-000000000002" },
			want: []want{{compare.Disagree, "gpu 2", "uuid"}},
			exit: 1,
		},
		{
			name: "memory-total",
			edit: func(l *nvsmi.Log) { l.GPUs[1].FBMemoryUsage.Total = "40960 MiB" },
			want: []want{{compare.Disagree, "gpu 1", "memory.total"}},
			exit: 1,
		},
		{
			name: "temperature-beyond-tolerance",
			edit: func(l *nvsmi.Log) { temp(l, 4, 12) },
			want: []want{{compare.Disagree, "gpu 4", "temperature.gpu"}},
			exit: 1,
		},
		{
			name: "temperature-within-tolerance",
			edit: func(l *nvsmi.Log) { temp(l, 4, -4) },
			want: []want{{compare.Agree, "gpu 4", "temperature.gpu"}},
			exit: 0,
		},
		{
			name: "ecc-mode",
			edit: func(l *nvsmi.Log) { l.GPUs[3].ECCMode.Current = "Disabled" },
			want: []want{{compare.Disagree, "gpu 3", "ecc.mode.current"}},
			exit: 1,
		},
		{
			name: "ecc-counter-went-down",
			edit: func(l *nvsmi.Log) { l.GPUs[0].ECCErrors.Aggregate.DRAMCorrectable = "7" },
			want: []want{{compare.Disagree, "gpu 0", "ecc.aggregate.corrected"}},
			exit: 1,
		},
		{
			name: "power-na-not-compared",
			edit: func(l *nvsmi.Log) { l.GPUs[6].Power = nvsmi.Power{PowerDraw: nvsmi.NA} },
			want: []want{{compare.NotCompared, "gpu 6", "power.draw"}},
			exit: 0,
		},
		{
			name:      "explained",
			edit:      func(l *nvsmi.Log) { l.GPUs[1].FBMemoryUsage.Total = "40960 MiB" },
			explained: "# known\n^gpu\\s1\\smemory\\.total: the driver reserves memory nvidia-smi leaves out\n",
			want:      []want{{compare.Disagree, "gpu 1", "memory.total"}},
			exit:      0,
		},
		{
			name:      "explanation-does-not-match",
			edit:      func(l *nvsmi.Log) { l.GPUs[1].FBMemoryUsage.Total = "40960 MiB" },
			explained: "^gpu\\s2\\smemory\\.total: another GPU\n",
			want:      []want{{compare.Disagree, "gpu 1", "memory.total"}},
			exit:      1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
				t.Fatal(err)
			}
			editXML(t, dir, tc.edit)
			r := compareCapture(t, dir, tc.explained)
			for _, w := range tc.want {
				if !hasFinding(r, w.outcome, w.subject, w.what) {
					t.Errorf("no %v finding %s %s", w.outcome, w.subject, w.what)
				}
			}
			// The planted value is the only disagreement: the UUID's
			// with the census and with the topology.
			for _, f := range r.Findings {
				if f.Outcome != compare.Disagree {
					continue
				}
				planted := false
				for _, w := range tc.want {
					planted = planted || f.Subject == w.subject && f.What == w.what
				}
				if !planted {
					t.Errorf("unexpected disagreement: %s", f.Line())
				}
			}
			if tc.explained != "" && tc.exit == 0 {
				// The census's and the topology's memory size.
				if _, _, e, _ := r.Counts(); e != 2 {
					t.Errorf("%d explained, want 2", e)
				}
			}
			if got := r.ExitCode(); got != tc.exit {
				t.Errorf("exit code %d, want %d", got, tc.exit)
			}
		})
	}
}

// TestCompareUnreadable: input hw-compare cannot read is an error (its
// exit code 2), not a comparison.
func TestCompareUnreadable(t *testing.T) {
	base := simCompareCapture(t, "dgx-h100")
	for _, tc := range []struct {
		name string
		edit func(dir string) error
	}{
		{"garbled-xml", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, compare.SMIXMLFile), []byte("<nvidia_smi_log><gpu>"), 0o644)
		}},
		{"no-census", func(dir string) error { return os.Remove(filepath.Join(dir, compare.CensusFile)) }},
		{"garbled-topology", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, compare.TopologyFile), []byte("{"), 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
				t.Fatal(err)
			}
			if err := tc.edit(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := compare.Load(dir); err == nil {
				t.Error("Load accepted it")
			}
		})
	}
	if _, err := compare.ParseExplained(strings.NewReader("^gpu\\s0\n")); err == nil {
		t.Error("an explanation without a reason was accepted")
	}
	if _, err := compare.ParseExplained(strings.NewReader("gpu( reason\n")); err == nil {
		t.Error("a bad pattern was accepted")
	}
}

// TestCompareNVLinkStatus: `nvidia-smi -q -x` lists no NVLinks, so the
// active links are held against `nvidia-smi nvlink -s` where the capture
// has it (simsmi does not simulate it: written here from the census); a
// link nvidia-smi calls inactive is a disagreement.
func TestCompareNVLinkStatus(t *testing.T) {
	dir := simCompareCapture(t, "dgx-h100")
	b, err := os.ReadFile(filepath.Join(dir, compare.CensusFile))
	if err != nil {
		t.Fatal(err)
	}
	census, err := compare.ParseCensus(b)
	if err != nil {
		t.Fatal(err)
	}
	var status strings.Builder
	for _, d := range census.Devices {
		if d.Parent != nil {
			continue
		}
		fmt.Fprintf(&status, "GPU %d: NVIDIA H100 80GB HBM3 (UUID: %s)\n", d.Index, d.UUID)
		for _, c := range d.Calls {
			if c.Method != "GetNvLinkState" || c.Ret != "SUCCESS" {
				continue
			}
			speed := "26.562 GB/s"
			if c.Value != "FEATURE_ENABLED" || d.Index == 2 && fmt.Sprint(c.Args[0]) == "5" {
				speed = "<inactive>"
			}
			fmt.Fprintf(&status, "\t Link %v: %s\n", c.Args[0], speed)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, compare.SMINVLinkFile), []byte(status.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	r := compareCapture(t, dir, "")
	if !hasFinding(r, compare.Agree, "gpu 0", "nvlink.active") {
		t.Error("gpu 0's NVLinks were not compared, or disagree")
	}
	if !hasFinding(r, compare.Disagree, "gpu 2", "nvlink.active") {
		t.Error("gpu 2's inactive link 5 is not a disagreement")
	}
	if len(r.Unexplained()) != 1 || r.ExitCode() != 1 {
		t.Errorf("%d disagreements, exit code %d; want only gpu 2's, exit code 1", len(r.Unexplained()), r.ExitCode())
	}
}

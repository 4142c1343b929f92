package preflight

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReportVerdicts(t *testing.T) {
	rep := &Report{Results: []Result{
		{Item: ItemGPUCount, Target: "node", Status: Pass, Detail: "8 GPUs on the PCI bus, 8 in NVML"},
		{Item: ItemPCIe, Target: "GPU 0 (0000:18:00.0)", Device: "GPU-0", Status: Pass, Detail: "PCIe link gen 5 x16, max gen 5 x16"},
		{Item: ItemPCIe, Target: "GPU 3 (0000:33:00.0)", Device: "GPU-3", Status: Fail, Detail: "PCIe link gen 4 x8, max gen 5 x16: width below its maximum"},
		{Item: ItemECC, Target: "GPU 3 (0000:33:00.0)", Device: "GPU-3", Status: Fail, Detail: "ECC disabled (pending disabled), want enabled"},
		{Item: ItemRetiredPages, Target: "GPU 0 (0000:18:00.0)", Device: "GPU-0", Status: Skipped, Detail: "not supported"},
	}}
	if rep.Passed() {
		t.Error("passed with failures")
	}
	for item, want := range map[string]Status{ItemGPUCount: Pass, ItemPCIe: Fail, ItemRetiredPages: Skipped, ItemDCGM: Skipped} {
		if got := rep.ItemStatus(item); got != want {
			t.Errorf("%s: %s, want %s", item, got, want)
		}
	}
	if got := rep.FailedDevices(); len(got) != 1 || got[0] != "GPU-3" {
		t.Errorf("failed devices %v", got)
	}
	full := "preflight failed: pcie-link: GPU 3 (0000:33:00.0): PCIe link gen 4 x8, max gen 5 x16: width below its maximum; " +
		"ecc-mode: GPU 3 (0000:33:00.0): ECC disabled (pending disabled), want enabled"
	if got := rep.Summary(0); got != full {
		t.Errorf("summary\n%q\nwant\n%q", got, full)
	}
	cut := rep.Summary(120)
	if want := "preflight failed: pcie-link: GPU 3 (0000:33:00.0): PCIe link gen 4 x8, max gen 5 x16: width below its maximum; and 1 more"; cut != want {
		t.Errorf("cut summary %q, want %q", cut, want)
	}

	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "ITEM") || !strings.Contains(lines[3], "pcie-link") ||
		!strings.Contains(lines[3], "GPU 3 (0000:33:00.0)") || !strings.Contains(lines[3], "FAIL") || lines[6] != full {
		t.Errorf("table:\n%s", b.String())
	}
	// The columns line up.
	if i, j := strings.Index(lines[0], "STATUS"), strings.Index(lines[3], "FAIL"); i != j {
		t.Errorf("STATUS at %d, FAIL at %d:\n%s", i, j, b.String())
	}
}

// TestReportMerge: a re-check's results replace the full run's for the
// same item and GPU; the rest of the full run, and its start, stay.
func TestReportMerge(t *testing.T) {
	t0, t1, t2 := time.Unix(100, 0), time.Unix(200, 0), time.Unix(300, 0)
	full := &Report{Started: t0, Finished: t1, Results: []Result{
		{Item: ItemGPUCount, Target: "node", Status: Pass},
		{Item: ItemPCIe, Target: "GPU 0", Device: "GPU-0", Status: Pass},
		{Item: ItemPCIe, Target: "GPU 3", Device: "GPU-3", Status: Fail},
		{Item: ItemCommand, Target: "node", Status: Pass},
	}}
	re := &Report{Started: t1, Finished: t2, Results: []Result{
		{Item: ItemPCIe, Target: "GPU 3", Device: "GPU-3", Status: Pass},
		{Item: ItemThrottle, Target: "GPU 3", Device: "GPU-3", Status: Fail, Detail: "hw-slowdown"},
		{Item: ItemECC, Target: "node", Status: Skipped, Detail: "disabled"},
	}}
	m := full.Merge(re)
	if !m.Started.Equal(t0) || !m.Finished.Equal(t2) {
		t.Errorf("merged times %v..%v; want %v..%v", m.Started, m.Finished, t0, t2)
	}
	var got []string
	for _, r := range m.Results {
		got = append(got, r.Item+"/"+r.Device+"/"+string(r.Status))
	}
	want := []string{"gpu-count//pass", "pcie-link/GPU-0/pass", "pcie-link/GPU-3/pass", "throttle/GPU-3/fail", "command//pass"}
	if !slices.Equal(got, want) {
		t.Errorf("merged %v\nwant   %v", got, want)
	}
	if full.ItemStatus(ItemPCIe) != Fail || len(full.Results) != 4 {
		t.Error("Merge changed the full report")
	}
}

func TestExpectedGPUsFromLabels(t *testing.T) {
	cfg := Config{GPUCount: GPUCountConfig{Label: "example.com/gpus"}}
	for _, tc := range []struct {
		cfg    Config
		labels map[string]string
		want   int
		err    string
	}{
		{Config{}, map[string]string{"example.com/gpus": "8"}, 0, ""},
		{cfg, nil, 0, ""},
		{cfg, map[string]string{"example.com/gpus": "8"}, 8, ""},
		{cfg, map[string]string{"example.com/gpus": "0"}, 0, `node label example.com/gpus="0" is not a GPU count`},
		{cfg, map[string]string{"example.com/gpus": "8x"}, 0, `node label example.com/gpus="8x" is not a GPU count`},
	} {
		n, err := ExpectedGPUsFromLabels(tc.cfg, tc.labels)
		if n != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v %v: %d, %v; want %d, %q", tc.cfg.GPUCount, tc.labels, n, err, tc.want, tc.err)
		}
	}
}

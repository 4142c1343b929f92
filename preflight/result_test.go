package preflight

import (
	"bytes"
	"strings"
	"testing"
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

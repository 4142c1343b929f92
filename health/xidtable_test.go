package health

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestClassifyXID(t *testing.T) {
	tests := []struct {
		name string
		xid  uint64
		want XIDClass
	}{
		{"graphics engine exception is an application error", 13, XIDClassApp},
		{"page fault is an application error", 31, XIDClassApp},
		{"43 is an application error (device plugin)", 43, XIDClassApp},
		{"45 is an application error", 45, XIDClassApp},
		{"68 is an application error", 68, XIDClassApp},
		{"context switch timeout 109 is an application error", 109, XIDClassApp},
		{"contained ECC 94 is an application error", 94, XIDClassApp},
		{"double-bit ECC 48 needs a reset", 48, XIDClassReset},
		{"uncontained ECC 95 needs a reset", 95, XIDClassReset},
		{"GSP timeout 119 needs a reset", 119, XIDClassReset},
		{"GSP error 120 needs a reset", 120, XIDClassReset},
		{"fallen off the bus 79 needs a reboot", 79, XIDClassReboot},
		{"NVLink 74", 74, XIDClassNVLink},
		{"NVLink5 147", 147, XIDClassNVLink},
		{"page retirement 63 is informational", 63, XIDClassInfo},
		{"recovery action changed 154 is informational", 154, XIDClassInfo},
		{"unknown XID is informational", 9999, XIDClassInfo},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClassifyXID(tc.xid); got != tc.want {
				t.Fatalf("ClassifyXID(%d) = %s, want %s", tc.xid, got, tc.want)
			}
		})
	}
}

func TestXIDTableWellFormed(t *testing.T) {
	tab := XIDTable()
	if !slices.IsSortedFunc(tab, func(a, b XIDEntry) int { return int(a.XID) - int(b.XID) }) {
		t.Fatal("table not sorted by XID")
	}
	for i, e := range tab {
		if i > 0 && tab[i-1].XID == e.XID {
			t.Errorf("XID %d listed twice", e.XID)
		}
		if e.Class == "" || e.Bucket == "" || e.Meaning == "" || e.Source == "" {
			t.Errorf("XID %d incomplete: %+v", e.XID, e)
		}
	}
	tab[0].Class = "changed"
	if XIDTable()[0].Class == "changed" {
		t.Fatal("XIDTable returned the table itself, not a copy")
	}
}

func TestDefaultFatalXIDsFromTable(t *testing.T) {
	d := DefaultFatalXIDs()
	for _, x := range []uint64{46, 48, 62, 64, 74, 79, 95, 119, 120, 140, 144, 150, 158} {
		if !slices.Contains(d, x) {
			t.Errorf("default fatal XIDs lack %d", x)
		}
	}
	for _, x := range []uint64{13, 31, 43, 45, 63, 68, 92, 94, 109, 154} {
		if slices.Contains(d, x) {
			t.Errorf("default fatal XIDs contain %d", x)
		}
	}
}

func TestConfigFatalXID(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Config
		xid         uint64
		fatal, hold bool
	}{
		{"default reboot class holds", Config{}, 79, true, true},
		{"default nvlink recovers", Config{}, 147, true, false},
		{"default app is counted", Config{}, 109, false, false},
		{"operator adds an app XID: event, no hold", Config{FatalXIDs: []uint64{13, 79}}, 13, true, false},
		{"operator list keeps the hold of a reset XID", Config{FatalXIDs: []uint64{13, 48}}, 48, true, true},
		{"operator removes 79", Config{FatalXIDs: []uint64{48}}, 79, false, false},
		{"with defaults applied", Config{}.WithDefaults(), 95, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fatal, hold := tc.cfg.FatalXID(tc.xid)
			if fatal != tc.fatal || hold != tc.hold {
				t.Fatalf("FatalXID(%d) = %v, %v; want %v, %v", tc.xid, fatal, hold, tc.fatal, tc.hold)
			}
		})
	}
}

// xidMarkdown renders docs/xids.md from the XID table.
func xidMarkdown() string {
	var b strings.Builder
	b.WriteString(`# XIDs and what gpu-node-agent does with them

Generated from ` + "`health.XIDTable()`" + ` (health/xidtable.go) by
` + "`GNA_UPDATE_DOCS=1 go test -run TestXIDDocUpToDate ./health/`" + `; do not edit.

| Class | Effect |
| --- | --- |
| ` + "`app`" + ` | application error: counted (` + "`gpu_node_agent_xid_errors_total`" + `), never makes a device unfit, never taints |
| ` + "`info`" + ` | informational or unexpected: counted only (also every XID not listed here) |
| ` + "`nvlink`" + ` | device unfit; recovers ` + "`health.recoveryPeriod`" + ` after the last occurrence (with flap damping) |
| ` + "`reset`" + ` | device unfit and held so until evidence of a GPU reset, a reboot or an operator clear; then the recovery period starts |
| ` + "`reboot`" + ` | as ` + "`reset`" + ` (a reset or a reboot releases it) |

` + "`health.fatalXIDs`" + ` (flag ` + "`--fatal-xids`" + `) replaces the default fatal set (every
` + "`nvlink`" + `, ` + "`reset`" + ` and ` + "`reboot`" + ` XID). A listed XID of class ` + "`reset`" + ` or
` + "`reboot`" + ` holds until reset; any other listed XID recovers like ` + "`nvlink`" + `.

An operator clears held faults with the Node annotation
` + "`gpu-node-agent.io/clear-faults: <GPU or MIG UUID>|all`" + `; the agent acts on it
once, removes it and posts an Event (` + "`FaultsCleared`" + ` or ` + "`ClearFaultsRejected`" + `).

## Sources

- NVIDIA XID catalog for Ampere and newer GPUs, column "Resolution Bucket
  (Immediate Action)": https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
  as shipped in NVIDIA/NVSentinel
  ` + "`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv`" + `
  at commit 6f8b0fcfa8e502bdda78fabf96facef729a9285b.
- NVIDIA/k8s-device-plugin ` + "`internal/rm/health.go`" + ` (getDisabledHealthCheckXids:
  13, 31, 43, 45, 68, 109 are application errors; "the GPU should still be
  healthy") at commit 02597b97a66aee924ae59788e8de24955d07f2d0. Where it and
  the catalog mapping differ (43: IGNORE, 109: RESET_GPU) the device plugin
  is followed.
- Mapping of buckets to classes: RESTART_APP, WORKFLOW_XID_45 → app;
  RESET_GPU, WORKFLOW_XID_48 → reset; RESTART_BM, RESTART_VM → reboot;
  WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR → nvlink; IGNORE, CHECK_*,
  UPDATE_SWFW, UNEXPECTED_ERR_REPORT_ISSUE, FOLLOW_OTHER_XID (154) → info.

## Table

| XID | Class | Meaning | Catalog mnemonic | Catalog bucket | Source |
| ---: | --- | --- | --- | --- | --- |
`)
	for _, e := range XIDTable() {
		fmt.Fprintf(&b, "| %d | `%s` | %s | `%s` | %s | %s |\n", e.XID, e.Class, e.Meaning, e.Mnemonic, e.Bucket, e.Source)
	}
	return b.String()
}

// TestXIDDocUpToDate keeps docs/xids.md in step with the table.
func TestXIDDocUpToDate(t *testing.T) {
	const path = "../docs/xids.md"
	want := xidMarkdown()
	if os.Getenv("GNA_UPDATE_DOCS") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("docs/xids.md is stale: run GNA_UPDATE_DOCS=1 go test -run TestXIDDocUpToDate ./health/")
	}
}

package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// testdata/perf-script.txt holds eight samples, unedited, from `perf
// script -F addr,ip,sym` of the product agent run by `make
// measure-rss-faults` on this machine (no GPU); secs are the sections of
// that binary (readelf -S).
var secs = []section{
	{".text", 0x415180, 0x415180 + 0xb21dc7},
	{".rodata", 0xf37000, 0xf37000 + 0x385a78},
	{".gopclntab", 0x12bca80, 0x12bca80 + 0x847ab2},
	{".itablink", 0x1b0d040, 0x1b0d040 + 0x2da0},
	{".noptrdata", 0x1b40c40, 0x1b40c40 + 0x68721},
}

const module = "github.com/gpu-node-agent/gpu-node-agent"

func TestClassifyPerfScript(t *testing.T) {
	b, err := os.ReadFile("testdata/perf-script.txt")
	if err != nil {
		t.Fatal(err)
	}
	samples := parseScript(b)
	if len(samples) != 8 {
		t.Fatalf("parsed %d samples, want 8", len(samples))
	}
	if s := samples[1]; s.addr != 0x1b0d040 || !reflect.DeepEqual(s.frames, []string{"runtime.itabsinit", "runtime.schedinit", "runtime.rt0_go.abi0"}) {
		t.Fatalf("sample 1 = %#x %v", s.addr, s.frames)
	}

	r := classify(samples, secs, module)
	// Left out: the kernel zeroing the partial page after .noptrdata at
	// exec (its address is the section's end), and two faults on the
	// heap.
	if r.total != 5 {
		t.Errorf("total = %d, want 5", r.total)
	}
	want := map[string]map[string]int{
		phaseStart:  {".itablink": 1},
		phaseStack:  {".gopclntab": 1},
		phaseInit:   {".text": 1, ".gopclntab": 1},
		phaseAgent:  {".gopclntab": 1},
		phaseOthers: {},
	}
	if !reflect.DeepEqual(r.faults, want) {
		t.Errorf("faults = %v, want %v", r.faults, want)
	}
	if want := map[string]int{"github.com/vishvananda/netlink": 1, "k8s.io/apimachinery/pkg/apis/meta/v1": 1}; !reflect.DeepEqual(r.initPkgs, want) {
		t.Errorf("init packages = %v, want %v", r.initPkgs, want)
	}
	if want := map[string]int{module + "/nvmlowner.(*lane).run": 1}; !reflect.DeepEqual(r.agentFuncs, want) {
		t.Errorf("agent functions = %v, want %v", r.agentFuncs, want)
	}

	var out strings.Builder
	r.print(&out, 6*time.Second, 5)
	for _, s := range []string{
		"5 page faults on the binary's file-backed sections in 6s (each maps up to 64 KiB: at most 0.3 MiB)",
		"| faults by what ran | .text | .gopclntab | .itablink | total |",
		"| " + phaseInit + " | 1 | 1 | 0 | 2 |",
		"     1  github.com/vishvananda/netlink",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report lacks %q:\n%s", s, out.String())
		}
	}
}

func TestPhaseOf(t *testing.T) {
	for _, c := range []struct {
		frames []string
		want   string
	}{
		// An init of our own package is package init, not the agent.
		{[]string{module + "/preflight.map.init.0", "runtime.doInit1", "runtime.main"}, phaseInit},
		// initLocked is no init function.
		{[]string{module + "/nvmlowner.(*Hardware).initLocked", "main.main", "runtime.main"}, phaseAgent},
		{[]string{"runtime.gcDrain", "runtime.gcBgMarkWorker"}, phaseOthers},
		{[]string{"net/http.(*conn).serve"}, phaseOthers},
	} {
		if got := phaseOf(c.frames, module); got != c.want {
			t.Errorf("phaseOf(%v) = %q, want %q", c.frames, got, c.want)
		}
	}
	if got := packageOf("k8s.io/apimachinery/pkg/runtime.(*Scheme).AddKnownTypes"); got != "k8s.io/apimachinery/pkg/runtime" {
		t.Errorf("packageOf = %q", got)
	}
	if got := packageOf("runtime.main"); got != "runtime" {
		t.Errorf("packageOf = %q", got)
	}
}

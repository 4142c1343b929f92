//go:build simulator

package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestDemo runs exactly what `make demo` runs, bounded, and checks the
// inventory it prints.
func TestDemo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"demo", "--exit-after=2s", "--sim-control-address=127.0.0.1:0", "--metrics-address=127.0.0.1:0"}, &stdout, &stderr, func(string) string { return "" })
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	t.Logf("demo output:\n%s", out)
	for _, want := range []string{
		// GPUs 0 and 1 (NUMA 0) are MIG-enabled; the other six are whole.
		`nvidia\.com/gpu\s+6\s+6\s+0:2 1:4`,
		`nvidia\.com/mig-1g\.10gb\s+9\s+9\s+0:9`,
		`nvidia\.com/mig-2g\.20gb\s+1\s+1\s+0:1`,
		`nvidia\.com/mig-3g\.40gb\s+1\s+1\s+0:1`,
		`nvidia\.com/gpu\s+GPU-\S+\s+GPU 7\s+healthy\s+1`,
		`nvidia\.com/mig-3g\.40gb\s+MIG-\S+\s+GPU 0 MIG 0\s+healthy\s+0`,
		`nvidia\.com/mig-1g\.10gb\s+MIG-\S+\s+GPU 1 MIG 6\s+healthy\s+0`,
		// The demo config serves the simulated InfiniBand ports.
		`rdma/ib\s+8\s+8\s+0:4 1:4`,
		`NODE: fit`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(out, "NOT SERVED") {
		t.Errorf("demo reports unserved resources")
	}
}

// TestDemoFault runs the demo, injects the XID its banner suggests through
// the simulator's control endpoint, and checks that the inventory is
// reprinted with GPU 3 unhealthy and the node unfit, then fit again after
// the (shortened) recovery period.
func TestDemoFault(t *testing.T) {
	var stdout syncBuffer
	var stderr bytes.Buffer
	ctl := freeport.Addr(t)
	code := make(chan int, 1)
	go func() {
		// --exit-after only bounds a run the test does not stop itself.
		code <- run([]string{"demo", "--exit-after=5m", "--recovery-period=1s", "--metrics-interval=200ms", "--sim-control-address=" + ctl, "--metrics-address=127.0.0.1:0"},
			&stdout, &stderr, func(string) string { return "" })
	}()
	testutil.WaitFor(t, "the first inventory", func() bool { return strings.Contains(stdout.String(), "NODE: fit") })
	// An XID is an event: one sent before the health monitor has registered
	// its NVML event set is lost, as on real hardware. The first inventory
	// can come before that on a loaded machine, so send it again until the
	// inventory shows it (a repeat only restarts the 1 s recovery).
	for i := 0; ; i++ {
		testutil.SimFault(t, ctl, "POST", `{"kind":"xid","gpu":3,"xid":79}`)
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) && !strings.Contains(stdout.String(), "NODE: UNFIT") {
			time.Sleep(20 * time.Millisecond)
		}
		if strings.Contains(stdout.String(), "NODE: UNFIT") {
			break
		}
		if i == 5 {
			t.Fatalf("the node never became unfit after %d XIDs", i+1)
		}
	}
	// XID 79 is held until a reset: once the agent has read the driver's
	// request for one (a reset it never saw asked for leaves no evidence),
	// reset the GPU, and it recovers after the recovery period.
	before := simCalls(t, ctl)["GetFieldValues"]
	// Two cycles' worth of field reads after the xid hold a whole cycle
	// that started after it (every GPU read once per cycle).
	testutil.WaitFor(t, "a full sampling cycle after the xid", func() bool { return simCalls(t, ctl)["GetFieldValues"] >= before+16 })
	testutil.SimFault(t, ctl, "POST", `{"kind":"gpu-reset","gpu":3}`)
	faulty := regexp.MustCompile(`(?s)changed, now serving ===\nRESOURCE\s+DEVICES\s+HEALTHY\s+PER NUMA NODE\nnvidia\.com/gpu\s+6\s+5\s.*nvidia\.com/gpu\s+GPU-\S+\s+GPU 3\s+UNHEALTHY\s+0.*NODE: UNFIT\n  GPU-\S+: [^\n]*xid 79`)
	fitAgain := regexp.MustCompile(`(?s)changed, now serving.*nvidia\.com/gpu\s+6\s+6\s.*NODE: fit`)
	recovered := func(out string) bool {
		loc := faulty.FindStringIndex(out)
		return loc != nil && fitAgain.MatchString(out[loc[1]:])
	}
	testutil.WaitFor(t, "an inventory with GPU 3 UNHEALTHY and the node UNFIT (xid 79), then one with every GPU healthy and the node fit again after the reset and the recovery period",
		func() bool { return recovered(stdout.String()) })
	// Stop the demo as Ctrl-C does: run's signal handler takes SIGINT and
	// stops gracefully (no other test of this package runs beside this
	// one, and --exit-after is minutes away).
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if c := <-code; c != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", c, stderr.String())
	}
	t.Logf("demo output:\n%s", stdout.String())
}

func TestRunRejectsBadConfigBeforeServing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plugins")
	var stderr bytes.Buffer
	code := run([]string{"--simulate", "dgx-h100", "--mig-strategy", "foo", "--device-plugin-dir", dir}, io.Discard, &stderr, func(string) string { return "" })
	if code == 0 {
		t.Fatal("exit code 0 for a bad mig-strategy")
	}
	if !strings.Contains(stderr.String(), `mig-strategy: "foo" is not one of none, single, mixed`) {
		t.Errorf("stderr = %q", stderr.String())
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("device-plugin dir created before validation: %v", err)
	}
}

func TestRunUnknownProfile(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"--simulate", "dgx-h999", "--device-plugin-dir", testutil.ShortTempDir(t), "--metrics-address="}, io.Discard, &stderr, func(string) string { return "" })
	if code != 2 || !strings.Contains(stderr.String(), `simulate: unknown profile "dgx-h999" (known: dgx-1v, dgx-2, dgx-a100, dgx-b200, dgx-h100, dgx-h200, gb200-nvl72, pcie-8gpu)`) {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestTopologyDump(t *testing.T) {
	var out, stderr bytes.Buffer
	code := run([]string{"topology", "dump", "--simulate", "dgx-h100,mig=2:3g.40gb+3g.40gb"}, &out, &stderr, nil)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	node, err := topology.ParseSnapshot(out.Bytes())
	if err != nil {
		t.Fatalf("dump is not a snapshot: %v\n%s", err, out.String())
	}
	if len(node.GPUs) != 8 || len(node.GPUs[2].MIG) != 2 || node.GPUs[2].MIG[0].Profile != "3g.40gb" {
		t.Errorf("dump: %d GPUs, GPU 2 MIG %+v", len(node.GPUs), node.GPUs[2].MIG)
	}
	if code := run([]string{"topology", "dump", "--mig-strategy", "mixed"}, io.Discard, io.Discard, nil); code == 0 {
		t.Error("topology dump accepted an agent-only flag")
	}
}

// TestTopologyLabels: topology labels prints the labels the agent writes,
// under the agent's own settings (mig-strategy), one key=value a line.
func TestTopologyLabels(t *testing.T) {
	noEnv := func(string) string { return "" }
	var out, stderr bytes.Buffer
	code := run([]string{"topology", "labels", "--simulate", "gb200-nvl72", "--log-level", "warn"}, &out, &stderr, noEnv)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if !slices.IsSorted(lines) {
		t.Errorf("lines not sorted:\n%s", out.String())
	}
	for _, want := range []string{"nvidia.com/gpu.clique=3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90.7", "nvidia.com/gpu.count=4", "nvidia.com/gpu.family=blackwell"} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "nvidia.com/mig.strategy=") }) {
		t.Errorf("mig.strategy under the default none:\n%s", out.String())
	}

	out.Reset()
	code = run([]string{"topology", "labels", "--simulate", "dgx-h100,mig=2:3g.40gb+3g.40gb", "--mig-strategy", "mixed"}, &out, &stderr, noEnv)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"nvidia.com/mig.strategy=mixed", "nvidia.com/mig-3g.40gb.count=2"} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "gpu.clique") {
		t.Errorf("a DGX H100 got a clique label:\n%s", out.String())
	}

	stderr.Reset()
	if code := run([]string{"topology", "labels", "--mig-strategy", "both"}, io.Discard, &stderr, noEnv); code != 2 || !strings.Contains(stderr.String(), "mig-strategy") {
		t.Errorf("bad mig-strategy: exit %d, stderr %q", code, stderr.String())
	}
}

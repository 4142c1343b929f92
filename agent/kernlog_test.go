package agent

import (
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// TestKernelLogWhileNVMLHangs: with every NVML call on GPU 1 blocked (the
// simulator's hang fault) an XID 79 still makes GPU 1 unhealthy in
// ListAndWatch, through the kernel log the simulator writes
// (<host-root>/dev/kmsg): the simulator holds a hung GPU's NVML events
// until the hang ends, and the NVML call timeout is longer than the test,
// so neither NVML's event nor the hang check can be what marks it.
func TestKernelLogWhileNVMLHangs(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval = 0
	cfg.NVMLCallTimeout = 10 * time.Minute
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	node := simOf(a)
	uuid := node.Spec().GPUs[1].UUID
	ctx, _ := startAgent(t, a)
	stream, first := watchFirst(t, ctx, dir, "nvidia.com/gpu")
	if len(first.Devices) != 8 {
		t.Fatalf("nvidia.com/gpu: %d devices, want 8", len(first.Devices))
	}
	if err := node.InjectFault(sim.Fault{Kind: sim.FaultHang, GPU: 1}); err != nil {
		t.Fatal(err)
	}
	// Unblock GPU 1's calls before the agent stops (cleanups run last in,
	// first out: this one before startAgent's stop).
	t.Cleanup(func() { _ = node.ClearFault(sim.Fault{Kind: sim.FaultHang, GPU: 1}) })

	injected := time.Now()
	if err := node.InjectFault(sim.Fault{Kind: sim.FaultXID, GPU: 1, XID: 79}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch: %v", err)
		}
		i := slices.IndexFunc(resp.Devices, func(d *pluginapi.Device) bool { return d.ID == uuid })
		if i >= 0 && resp.Devices[i].Health == pluginapi.Unhealthy {
			break
		}
	}
	t.Logf("GPU 1 unhealthy in ListAndWatch %v after XID 79 was injected, its NVML calls hanging", time.Since(injected))
	st := a.mon.Status(uuid)
	if !slices.Contains(st.Causes, "xid-79") {
		t.Errorf("GPU 1 causes %v, want xid-79", st.Causes)
	}
	if slices.Contains(st.Causes, health.CheckTimeout) {
		t.Errorf("GPU 1 causes %v: the hang check, not the kernel log, marked it", st.Causes)
	}
	for _, g := range node.Spec().GPUs {
		if g.UUID != uuid && !a.mon.Healthy(g.UUID) {
			t.Errorf("GPU %d (%s) unhealthy too", g.Index, g.UUID)
		}
	}
}

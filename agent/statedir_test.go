package agent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestStateDirKeepsGPUUnhealthyAcrossRestart runs the agent on a simulated
// DGX H100 with a state dir, makes GPU 5 unhealthy with XID 79 through the
// simulator's control endpoint, and stops the agent. A new agent on the
// same state dir (a fresh simulated node of the same profile: the same
// UUIDs, and a driver that no longer asks for a reset, so nothing read
// from NVML says the GPU is faulty) must serve GPU 5 Unhealthy in its very
// first ListAndWatch response: the kubelet never sees it healthy.
func TestStateDirKeepsGPUUnhealthyAcrossRestart(t *testing.T) {
	stateDir := t.TempDir()
	const gpuIndex = 5

	// The first agent: fault GPU 5.
	a1, dir1, ctl1 := openStateDirAgent(t, stateDir)
	ctx, stop := startAgent(t, a1)
	// The deadline only bounds a broken run (Recv below fails with it).
	watchCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, first := watchFirst(t, watchCtx, dir1, "nvidia.com/gpu")
	ids1 := deviceIDs(first)
	for _, d := range first.Devices {
		if d.Health != pluginapi.Healthy {
			t.Fatalf("fresh state dir: device %s is %s before any fault", d.ID, d.Health)
		}
	}
	faulty := simOf(a1).Spec().GPUs[gpuIndex].UUID
	// NVML, like the simulator, drops an XID raised before the event set
	// is registered.
	testutil.WaitFor(t, "the health monitor's XID event set", a1.mon.Listening)
	testutil.SimFault(t, ctl1, "POST", `{"kind":"xid","gpu":5,"xid":79}`)
	for health := pluginapi.Healthy; health != pluginapi.Unhealthy; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch after the XID: %v", err)
		}
		health = deviceHealth(resp, faulty)
	}
	if err := stop(); err != nil {
		t.Fatalf("first agent: %v", err)
	}

	// The second agent, on the same state dir.
	a2, dir2, _ := openStateDirAgent(t, stateDir)
	if got := simOf(a2).Spec().GPUs[gpuIndex].UUID; got != faulty {
		t.Fatalf("the new simulated node's GPU %d is %s, was %s: the profile's UUIDs are not stable", gpuIndex, got, faulty)
	}
	ctx, _ = startAgent(t, a2)
	_, first = watchFirst(t, ctx, dir2, "nvidia.com/gpu")
	if ids2 := deviceIDs(first); !slices.Equal(ids1, ids2) {
		t.Fatalf("the restarted agent serves %v, the first served %v", ids2, ids1)
	}
	for _, d := range first.Devices {
		want := pluginapi.Healthy
		if d.ID == faulty {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("first ListAndWatch response after the restart: %s is %s, want %s", d.ID, d.Health, want)
		}
	}
}

// openStateDirAgent opens a simulated DGX H100 agent with the given health
// state dir, its device-plugin dir and simulator control address.
func openStateDirAgent(t *testing.T, stateDir string) (a *Agent, pluginDir, control string) {
	t.Helper()
	pluginDir = testutil.ShortTempDir(t)
	control = freeport.Addr(t)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = pluginDir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = control
	cfg.RescanInterval = 0
	cfg.Health.StateDir = stateDir // --state-dir
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return a, pluginDir, control
}

// deviceIDs are a ListAndWatch response's device IDs, sorted.
func deviceIDs(r *pluginapi.ListAndWatchResponse) []string {
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.ID)
	}
	slices.Sort(ids)
	return ids
}

// deviceHealth is device id's health in r ("" if r does not list it).
func deviceHealth(r *pluginapi.ListAndWatchResponse, id string) string {
	for _, d := range r.Devices {
		if d.ID == id {
			return d.Health
		}
	}
	return ""
}

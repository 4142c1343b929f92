package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
)

func socketFor(dir, resource string) string {
	return filepath.Join(dir, "gpu-node-agent-"+strings.ReplaceAll(resource, "/", "-")+".sock")
}

func dialPlugin(t testing.TB, path string) pluginapi.DevicePluginClient {
	t.Helper()
	testutil.WaitFor(t, path, func() bool { _, err := os.Stat(path); return err == nil })
	// Wait for ready, as the kubelet's own client does: a socket that has
	// just appeared may not accept the very first connection.
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// TestAgentServesSimulatedNode runs the agent in-process on a simulated
// DGX H100 and talks to its sockets as the kubelet would: ListAndWatch,
// Allocate, and a MIG layout change at run time.
func TestAgentServesSimulatedNode(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.GPU.MIGStrategy = gpu.MIGStrategyMixed
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval = 0
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	simRoot := a.hw.HostRoot()
	ctx, stop := startAgent(t, a)
	gpuClient := dialPlugin(t, socketFor(dir, "nvidia.com/gpu"))
	stream, first := watchFirst(t, ctx, dir, "nvidia.com/gpu")
	if len(first.Devices) != 8 {
		t.Fatalf("nvidia.com/gpu: %d devices, want 8", len(first.Devices))
	}
	perNUMA := map[int64]int{}
	for _, d := range first.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s", d.ID, d.Health)
		}
		if d.Topology == nil || len(d.Topology.Nodes) != 1 {
			t.Errorf("device %s: topology %v, want one NUMA node", d.ID, d.Topology)
			continue
		}
		perNUMA[d.Topology.Nodes[0].ID]++
	}
	if perNUMA[0] != 4 || perNUMA[1] != 4 {
		t.Errorf("devices per NUMA node = %v, want 4 on each of 0 and 1", perNUMA)
	}

	ids := []string{first.Devices[0].ID, first.Devices[1].ID}
	resp, err := gpuClient.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != strings.Join(ids, ",") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q", got, strings.Join(ids, ","))
	}
	_, err = gpuClient.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("unknown device: error %v, want InvalidArgument", err)
	}

	// MIG on GPU 0 at run time: one whole GPU leaves nvidia.com/gpu and a
	// new resource appears, without restarting anything.
	if err := simOf(a).SetMIGLayout(0, []string{"3g.40gb", "3g.40gb"}); err != nil {
		t.Fatal(err)
	}
	next, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(next.Devices) != 7 {
		t.Errorf("after MIG on GPU 0: nvidia.com/gpu has %d devices, want 7", len(next.Devices))
	}
	_, migList := watchFirst(t, ctx, dir, "nvidia.com/mig-3g.40gb")
	if len(migList.Devices) != 2 {
		t.Errorf("nvidia.com/mig-3g.40gb: %d devices, want 2", len(migList.Devices))
	}

	// Graceful stop removes the sockets and the temporary host root.
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, r := range []string{"nvidia.com/gpu", "nvidia.com/mig-3g.40gb"} {
		if _, err := os.Stat(socketFor(dir, r)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket for %s left behind: %v", r, err)
		}
	}
	if _, err := os.Stat(simRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary host root %s left behind: %v", simRoot, err)
	}
}

// startAgent runs a until stop is called or the test or benchmark ends
// (go test's -timeout bounds a broken run), and returns the context it runs
// under. stop may be called more than once; it returns the agent's run
// error, which also fails the test if stop was left to the cleanup.
func startAgent(tb testing.TB, a *Agent) (ctx context.Context, stop func() error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("agent run: %v", err)
		}
	})
	return ctx, stop
}

// watchFirst opens a ListAndWatch stream on resource's socket in dir and
// reads its first device list.
func watchFirst(tb testing.TB, ctx context.Context, dir, resource string) (pluginapi.DevicePlugin_ListAndWatchClient, *pluginapi.ListAndWatchResponse) {
	tb.Helper()
	stream, err := dialPlugin(tb, socketFor(dir, resource)).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		tb.Fatalf("%s ListAndWatch: %v", resource, err)
	}
	first, err := stream.Recv()
	if err != nil {
		tb.Fatalf("%s ListAndWatch: first list: %v", resource, err)
	}
	return stream, first
}

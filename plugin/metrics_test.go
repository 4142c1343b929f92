package plugin

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	e := newTestEnv(t, Options{Registerer: reg})
	e.kubelet.mu.Lock()
	e.kubelet.failNext = 1
	e.kubelet.mu.Unlock()
	gpu := &fakeResource{name: "nvidia.com/gpu", devs: fourGPUs()}
	mig := &fakeResource{name: "nvidia.com/mig-1g.10gb", devs: gpus(1)}
	e.m.Sync([]Resource{gpu})
	eventually(t, "registered", func() bool { return e.m.Registered()[gpu.name] })
	e.m.Sync([]Resource{gpu, mig})
	eventually(t, "mig registered", func() bool { return e.m.Registered()[mig.name] })

	c := e.client(t, gpu.name)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.ListAndWatch(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "stream open", func() bool { return e.m.servers[gpu.name].watcherCount() == 1 })
	alloc := func(id string) {
		c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
	}
	alloc("GPU-0")
	alloc("GPU-1")
	alloc("nope")
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-3"}}}}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("unhealthy allocate: %v", err)
	}

	t.Run("lint", func(t *testing.T) {
		problems, err := testutil.GatherAndLint(reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	})
	for _, tc := range []struct {
		name   string
		metric string
		want   string
	}{
		{"registered", "gpu_node_agent_plugin_registered", `
# HELP gpu_node_agent_plugin_registered Whether the device plugin for a resource is registered with the kubelet (1) or not (0).
# TYPE gpu_node_agent_plugin_registered gauge
gpu_node_agent_plugin_registered{resource="nvidia.com/gpu"} 1
gpu_node_agent_plugin_registered{resource="nvidia.com/mig-1g.10gb"} 1
`},
		{"registrations", "gpu_node_agent_plugin_registrations_total", `
# HELP gpu_node_agent_plugin_registrations_total Registration attempts with the kubelet, by resource and result (success or failure).
# TYPE gpu_node_agent_plugin_registrations_total counter
gpu_node_agent_plugin_registrations_total{resource="nvidia.com/gpu",result="failure"} 1
gpu_node_agent_plugin_registrations_total{resource="nvidia.com/gpu",result="success"} 1
gpu_node_agent_plugin_registrations_total{resource="nvidia.com/mig-1g.10gb",result="success"} 1
`},
		{"requests", "gpu_node_agent_plugin_requests_total", `
# HELP gpu_node_agent_plugin_requests_total Device-plugin gRPC requests served, by resource, method and gRPC status code.
# TYPE gpu_node_agent_plugin_requests_total counter
gpu_node_agent_plugin_requests_total{code="FailedPrecondition",method="Allocate",resource="nvidia.com/gpu"} 1
gpu_node_agent_plugin_requests_total{code="InvalidArgument",method="Allocate",resource="nvidia.com/gpu"} 1
gpu_node_agent_plugin_requests_total{code="OK",method="Allocate",resource="nvidia.com/gpu"} 2
gpu_node_agent_plugin_requests_total{code="OK",method="GetDevicePluginOptions",resource="nvidia.com/gpu"} 1
gpu_node_agent_plugin_requests_total{code="OK",method="GetDevicePluginOptions",resource="nvidia.com/mig-1g.10gb"} 1
`},
		{"streams", "gpu_node_agent_plugin_list_and_watch_streams", `
# HELP gpu_node_agent_plugin_list_and_watch_streams Open ListAndWatch streams, by resource.
# TYPE gpu_node_agent_plugin_list_and_watch_streams gauge
gpu_node_agent_plugin_list_and_watch_streams{resource="nvidia.com/gpu"} 1
gpu_node_agent_plugin_list_and_watch_streams{resource="nvidia.com/mig-1g.10gb"} 0
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), tc.metric); err != nil {
				t.Error(err)
			}
		})
	}
	if n := testutil.CollectAndCount(reg, "gpu_node_agent_plugin_request_duration_seconds"); n != 3 {
		t.Errorf("request_duration_seconds has %d series, want 3 (gpu Allocate and GetDevicePluginOptions, mig GetDevicePluginOptions)", n)
	}

	// A removed resource's gauges go; its counters stay.
	e.m.Sync([]Resource{gpu})
	if n := testutil.CollectAndCount(reg, "gpu_node_agent_plugin_registered"); n != 1 {
		t.Errorf("registered has %d series after removal, want 1", n)
	}
	if n := testutil.CollectAndCount(reg, "gpu_node_agent_plugin_list_and_watch_streams"); n != 1 {
		t.Errorf("streams has %d series after removal, want 1", n)
	}
}

package metrics

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeKubelet serves the pod-resources List API on a unix socket, like
// the kubelet's pod-resources server.
type fakeKubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	resp *podresourcesv1.ListPodResourcesResponse
}

func (f *fakeKubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return f.resp, nil
}

func startFakeKubelet(t *testing.T, socket string, resp *podresourcesv1.ListPodResourcesResponse) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen %s: %v", socket, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &fakeKubelet{resp: resp})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
}

func container(name, resource string, ids ...string) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{
		Name:    name,
		Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
	}
}

// podLabels returns pod/namespace/container of the DCGM_FI_DEV_FB_USED
// sample with the given UUID and GPU_I_ID.
func podLabels(t *testing.T, c *Collector, uuid, gi string) [3]string {
	t.Helper()
	reg := testRegistry(t, c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "DCGM_FI_DEV_FB_USED" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l[labelUUID] == uuid && l[labelGIID] == gi {
				return [3]string{l[labelPod], l[labelNamespace], l[labelContainer]}
			}
		}
	}
	t.Fatalf("no FB_USED sample for %s GI %q", uuid, gi)
	return [3]string{}
}

func TestPodAttribution(t *testing.T) {
	mn := newMockNode(t, 3, migLayout{2: {"3g.40gb", "1g.10gb"}})
	gpu0, gpu1, gpu2 := mn.node.GPUs[0].UUID, mn.node.GPUs[1].UUID, mn.node.GPUs[2].UUID
	mig1 := mn.node.GPUs[2].MIG[1].UUID
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	c, _ := newTestCollector(t, mn, Config{PodResourcesSocket: socket})

	// No socket yet: attribution is off, metrics are still served.
	collectNow(t, c)
	if got := podLabels(t, c, gpu0, ""); got != [3]string{} {
		t.Errorf("labels without a kubelet = %v, want empty", got)
	}

	startFakeKubelet(t, socket, &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("trainer", "nvidia.com/gpu", gpu0),
			container("sidecar", "example.com/other", "dev-7"),
		}},
		{Name: "infer-1", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{
			container("server", "nvidia.com/mig-1g.10gb", mig1),
		}},
		{Name: "shared", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("app", "nvidia.com/gpu", gpu1+"::3"),
		}},
	}})
	collectNow(t, c)

	tests := []struct {
		name     string
		uuid, gi string
		want     [3]string
	}{
		{"whole GPU", gpu0, "", [3]string{"train-0", "ml", "trainer"}},
		{"replicated device ID", gpu1, "", [3]string{"shared", "ml", "app"}},
		{"MIG device", gpu2, "2", [3]string{"infer-1", "serving", "server"}},
		{"unallocated MIG device", gpu2, "1", [3]string{}},
		{"MIG parent is not the MIG device's pod", gpu2, "", [3]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := podLabels(t, c, tt.uuid, tt.gi); got != tt.want {
				t.Errorf("pod labels = %v, want %v", got, tt.want)
			}
		})
	}
	if got := testutil.ToFloat64(c.pods.errors); got != 0 {
		t.Errorf("pod-resources errors = %v, want 0", got)
	}
}

func TestPodAttributionKubeletGoneCountsErrorNotFailure(t *testing.T) {
	mn := newMockNode(t, 1, nil)
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	// A socket file nobody listens on: a crashed kubelet.
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	l.Close()
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("stale socket file: %v", err)
	}
	c, reg := newTestCollector(t, mn, Config{PodResourcesSocket: socket})
	collectNow(t, c)
	if got := testutil.ToFloat64(c.pods.errors); got != 1 {
		t.Errorf("pod-resources errors = %v, want 1", got)
	}
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 1 {
		t.Errorf("GPU_TEMP series = %d, want 1 despite the kubelet being down", n)
	}
}

package metrics

import (
	"context"
	"sync"
	"testing"
	"time"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// fakePods is a pod source (the usage tracker) with a settable answer.
type fakePods struct {
	mu sync.Mutex
	a  *usage.Assignments
	ch chan struct{}
}

func newFakePods() *fakePods { return &fakePods{ch: make(chan struct{}, 1)} }

func (f *fakePods) Assignments() *usage.Assignments {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.a
}

func (f *fakePods) Subscribe() <-chan struct{} { return f.ch }

// set makes pods the kubelet's answer (none: the List failed, unknown)
// and signals a cycle.
func (f *fakePods) set(pods ...*podresourcesv1.PodResources) {
	f.mu.Lock()
	if pods == nil {
		f.a = nil
	} else {
		f.a = usage.NewAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: pods}, nil)
	}
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
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
	l, ok := findPodLabels(t, c, uuid, gi)
	if !ok {
		t.Fatalf("no FB_USED sample for %s GI %q", uuid, gi)
	}
	return l
}

func findPodLabels(t *testing.T, c *Collector, uuid, gi string) ([3]string, bool) {
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
				return [3]string{l[labelPod], l[labelNamespace], l[labelContainer]}, true
			}
		}
	}
	return [3]string{}, false
}

func TestPodAttribution(t *testing.T) {
	mn := newMockNode(t, 3, migLayout{2: {"3g.40gb", "1g.10gb"}})
	gpu0, gpu1, gpu2 := mn.node.GPUs[0].UUID, mn.node.GPUs[1].UUID, mn.node.GPUs[2].UUID
	mig1 := mn.node.GPUs[2].MIG[1].UUID
	pods := newFakePods()
	c, reg := newTestCollector(t, mn, Config{Pods: pods})

	// No answer from the kubelet yet: attribution is off, metrics are
	// still served.
	collectNow(t, c)
	if got := podLabels(t, c, gpu0, ""); got != [3]string{} {
		t.Errorf("labels without a kubelet = %v, want empty", got)
	}
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 3 {
		t.Errorf("GPU_TEMP series = %d, want 3 despite no kubelet answer", n)
	}

	pods.set(
		&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("trainer", "nvidia.com/gpu", gpu0),
			container("sidecar", "example.com/other", "dev-7"),
		}},
		&podresourcesv1.PodResources{Name: "infer-1", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{
			container("server", "nvidia.com/mig-1g.10gb", mig1),
		}},
		&podresourcesv1.PodResources{Name: "shared", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("app", "nvidia.com/gpu", gpu1+"::3"),
		}},
	)
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

	// The kubelet stops answering (nil): series stay, unattributed.
	pods.set()
	collectNow(t, c)
	if got := podLabels(t, c, gpu0, ""); got != [3]string{} {
		t.Errorf("labels with the kubelet down = %v, want empty", got)
	}
}

// TestRendersAfterPodSource: with a pod source the collector renders on
// its signal (after the source has read that cycle's pods).
func TestRendersAfterPodSource(t *testing.T) {
	mn := newMockNode(t, 1, nil)
	pods := newFakePods()
	c, _ := newTestCollector(t, mn, Config{Pods: pods})
	rendered := make(chan struct{}, 16)
	c.rendered = func() { rendered <- struct{}{} }
	c.sampler.SampleNow(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	pods.set(&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
		container("trainer", "nvidia.com/gpu", mn.node.GPUs[0].UUID)}})
	// Renders at start and for SetNode may come first; one after the
	// pod source's signal carries its pods. (The timeout only bounds a
	// hang.)
	want := [3]string{"train-0", "ml", "trainer"}
	for labelled := false; !labelled; {
		select {
		case <-rendered:
			got, _ := findPodLabels(t, c, mn.node.GPUs[0].UUID, "")
			labelled = got == want
		case <-time.After(30 * time.Second):
			t.Fatal("no render with the pod source's pods")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

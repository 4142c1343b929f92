package agent

import (
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
	"github.com/gpu-node-agent/gpu-node-agent/usage/usagetest"
)

// gpuPod is a pod holding GPU uuid through the device plugin, as the
// kubelet's pod-resources List names it.
func gpuPod(namespace, name, uuid string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Name: name, Namespace: namespace, Containers: []*podresourcesv1.ContainerResources{
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{uuid}}}},
	}}
}

// TestMoveAdviceAnnotation: two pods each holding one GPU of the
// simulated DGX H100 (eight GPUs on one NVSwitch fabric) leave a free
// NVLink block of 6: the Node's move advice names both (moving them
// frees all 8), with the priority and owner kind read from the API
// server, and the advice gauges say so; when one ends the advice names
// the other; when both have ended the annotation is gone. Nothing is
// evicted.
func TestMoveAdviceAnnotation(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	startFakeKubelet(t, dir)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.MetricsInterval = 200 * time.Millisecond
	cfg.NodeName = "gpu-node-1"
	cfg.Taint.Mode = kubeapi.TaintOff
	cfg.MoveAdvice = true
	cfg.Health.DCGMMode = "off"
	yes := true
	prio := int32(1000)
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-a", UID: "uid-a",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", Controller: &yes}}},
			Spec: corev1.PodSpec{NodeName: cfg.NodeName, Priority: &prio}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "notebook-b", UID: "uid-b"},
			Spec: corev1.PodSpec{NodeName: cfg.NodeName}},
	)
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	a, err := openAgent(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	gpus := simOf(a).Spec().GPUs
	kubelet := usagetest.ServePodResources(t, usage.PodResourcesSocketPath(a.hw.HostRoot()),
		gpuPod("ml", "train-a", gpus[1].UUID), gpuPod("ml", "notebook-b", gpus[6].UUID))
	ctx, _ := startAgent(t, a)

	advice := func() (kubeapi.MoveAdvice, bool) {
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := n.Annotations[kubeapi.MoveAdviceAnnotation]
		if !ok {
			return kubeapi.MoveAdvice{}, false
		}
		var adv kubeapi.MoveAdvice
		if err := json.Unmarshal([]byte(v), &adv); err != nil {
			t.Fatalf("%s %q: %v", kubeapi.MoveAdviceAnnotation, v, err)
		}
		return adv, true
	}
	podNames := func(adv kubeapi.MoveAdvice) []string {
		var out []string
		for _, p := range adv.Pods {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return out
	}

	var adv kubeapi.MoveAdvice
	testutil.WaitFor(t, "the move advice naming both pods", func() bool {
		got, ok := advice()
		adv = got
		return ok && len(got.Pods) == 2
	})
	if adv.BlockNow != 6 || adv.BlockIfMoved != 8 || !adv.WholeNode || !slices.Equal(adv.GPUs, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("advice %+v, want block 6 now, 8 (GPUs 0-7, the whole node) once both moved", adv)
	}
	if got := podNames(adv); !slices.Equal(got, []string{"ml/notebook-b", "ml/train-a"}) {
		t.Errorf("pods %v, want ml/notebook-b and ml/train-a", got)
	}
	b, tr := adv.Pods[0], adv.Pods[1]
	if !slices.Equal(tr.GPUs, []int{1}) || tr.Priority == nil || *tr.Priority != 1000 || tr.OwnerKind == nil || *tr.OwnerKind != "Job" {
		t.Errorf("train-a %+v, want GPU 1, priority 1000, owner Job", tr)
	}
	if !slices.Equal(b.GPUs, []int{6}) || b.Priority == nil || *b.Priority != 0 || b.OwnerKind == nil || *b.OwnerKind != "" {
		t.Errorf("notebook-b %+v, want GPU 6, priority 0, no owner", b)
	}
	if got := gauge(t, a.reg, "gpu_node_agent_move_advice_pods", ""); got != 2 {
		t.Errorf("gpu_node_agent_move_advice_pods %v, want 2", got)
	}
	if got := gauge(t, a.reg, "gpu_node_agent_whole_node_free_if_moved_gpus", ""); got != 8 {
		t.Errorf("gpu_node_agent_whole_node_free_if_moved_gpus %v, want 8", got)
	}

	// train-a ends: notebook-b alone stands between 7 free GPUs and 8.
	kubelet.Set(gpuPod("ml", "notebook-b", gpus[6].UUID))
	testutil.WaitFor(t, "the advice naming notebook-b alone", func() bool {
		got, ok := advice()
		adv = got
		return ok && slices.Equal(podNames(got), []string{"ml/notebook-b"})
	})
	if adv.BlockNow != 7 || adv.BlockIfMoved != 8 {
		t.Errorf("advice %+v, want block 7 now, 8 once notebook-b moved", adv)
	}

	// Both gone: every GPU free, no advice.
	kubelet.Set()
	testutil.WaitFor(t, "the move advice removed", func() bool {
		_, ok := advice()
		return !ok
	})
	if got := gauge(t, a.reg, "gpu_node_agent_move_advice_pods", ""); got != 0 {
		t.Errorf("gpu_node_agent_move_advice_pods %v, want 0", got)
	}
	for _, act := range client.Actions() {
		if act.GetResource().Resource == "pods" && act.GetVerb() != "get" {
			t.Errorf("advice only, yet a pod %s", act.GetVerb())
		}
		if c, ok := act.(k8stesting.CreateAction); ok && c.GetSubresource() == "eviction" {
			t.Errorf("an eviction: %v", c)
		}
	}
}

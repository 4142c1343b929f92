package agent

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestAgentTaintsAndLabelsNode runs the agent with a node name against a
// fake API server whose client only becomes available on the second try:
// devices are served meanwhile, then the node gets the topology labels
// (with GFD's sharing labels of its time-sliced GPUs) and the NIC
// annotation, and an injected XID taints it until the device recovers.
func TestAgentTaintsAndLabelsNode(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.NodeName = "gpu-node-1"
	cfg.Taint.Mode = kubeapi.TaintOn
	cfg.Health.RecoveryPeriod = time.Second
	cfg.Health.DCGMMode = "off"
	cfg.GPU.TimeSlicing = &gpu.TimeSlicing{Resources: []gpu.SharedResource{{Name: gpu.ResourceGPU, Replicas: 4}}}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	tries := 0
	cfg.KubeRetry = 50 * time.Millisecond
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		if tries++; tries == 1 {
			return kubeapi.Clients{}, os.ErrNotExist // no API access at start
		}
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.node == nil {
		t.Fatal("no node object with a node name and tainting on")
	}
	ctx, _ := startAgent(t, a)

	getNode := func() *corev1.Node {
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ourTaint := func(n *corev1.Node) bool {
		for _, tn := range n.Spec.Taints {
			if tn.Key == cfg.Taint.WithDefaults().Key {
				return true
			}
		}
		return false
	}
	// Labels are applied as soon as the node is discovered, which can be
	// before the reconciler records what it serves: wait for both.
	testutil.WaitFor(t, "topology labels on the node", func() bool {
		n := getNode()
		return n.Annotations[kubeapi.OwnedLabelsAnnotation] != "" && len(n.Labels) > 0 && a.rec.current().node != nil
	})
	want := topology.Labels(a.rec.current().node, cfg.GPU.MIGStrategy, cfg.GPU.TimeSlicing.LabelSharing())
	if want[topology.LabelGPUReplicas] != "4" || want[topology.LabelGPUSharingStrategy] != "time-slicing" {
		t.Errorf("want labels without the GPUs' sharing: %v", want)
	}
	n := getNode()
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	// The simulated NICs' PCIe distances to the GPUs come in the same patch.
	wantAnn := topology.Annotations(a.rec.current().node)
	if len(wantAnn) == 0 {
		t.Error("the simulated dgx-h100 has no NIC annotation")
	}
	for k, v := range wantAnn {
		if n.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, n.Annotations[k], v)
		}
	}
	if ourTaint(n) {
		t.Fatal("healthy node tainted")
	}

	testutil.WaitFor(t, "the health monitor listening for XIDs", a.mon.Listening)
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"xid","gpu":2,"xid":79}`)
	testutil.WaitFor(t, "taint after the xid", func() bool { return ourTaint(getNode()) })
	// XID 79 holds until the GPU is reset.
	waitResetRequested(t, a.mon, a.rec.current().node.GPUs[2].UUID)
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"gpu-reset","gpu":2}`)
	testutil.WaitFor(t, "taint removed after the reset and recovery", func() bool { return !ourTaint(getNode()) })
}

// TestNoteNVML: NVML that won't load on a node with NVIDIA GPUs on its PCI
// bus is a node-wide fault (the node is unfit); without such GPUs it is
// not; discovery working again clears it.
func TestNoteNVML(t *testing.T) {
	pci := func(t *testing.T, vendor, class string) string {
		root := t.TempDir()
		d := filepath.Join(root, "sys/bus/pci/devices/0000:17:00.0")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "vendor"), []byte(vendor+"\n"), 0o644)
		os.WriteFile(filepath.Join(d, "class"), []byte(class+"\n"), 0o644)
		return root
	}
	tests := []struct {
		name    string
		root    string
		wantFit bool
	}{
		{"nvidia 3D controller", pci(t, "0x10de", "0x030200"), false},
		{"nvidia VGA controller", pci(t, "0x10de", "0x030000"), false},
		{"nvidia bridge only", pci(t, "0x10de", "0x068000"), true},
		{"other vendor's GPU", pci(t, "0x1002", "0x030200"), true},
		{"no pci tree", t.TempDir(), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mon, err := health.NewMonitor(health.Config{}, nil, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			noteNVML(mon, health.Config{}, tc.root, nil, nvmlowner.ErrUnavailable, nil)
			fit, why := mon.NodeFit()
			if fit != tc.wantFit {
				t.Fatalf("fit = %v (%v), want %v", fit, why, tc.wantFit)
			}
			if !fit && !strings.Contains(strings.Join(why, ";"), "nvml unavailable with NVIDIA GPUs") {
				t.Errorf("reasons %v", why)
			}
			// Discovery works and lists the GPU on the bus.
			last := &topology.Node{GPUs: []topology.GPU{{UUID: "GPU-0", PCIBusID: "0000:17:00.0"}}}
			noteNVML(mon, health.Config{}, tc.root, last, nil, nil)
			// Recovery takes the recovery period; the cause itself is gone.
			if st := mon.Status(health.NodeID); !fit && !strings.Contains(strings.Join(st.Reasons, ";"), "cleared") {
				t.Errorf("after discovery works: node reasons %v, want the cause cleared", st.Reasons)
			}
		})
	}
}

// fakeMetadata is a metadata client whose fleet is the one node: the
// safeguard allows it the one slot.
func fakeMetadata(t *testing.T, node string) *metadatafake.FakeMetadataClient {
	t.Helper()
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return metadatafake.NewSimpleMetadataClient(scheme, &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: node}})
}

package agent

import (
	"bytes"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-node-agent/gpu-node-agent/agent/simhw"
	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// TestLabelsSurviveNVMLErrors: a GPU lost at run time, and an agent
// restarted while NVML fails, leave every label on the Node as the last
// complete discovery wrote it: no label patch is sent until a complete
// discovery differs, which these do not.
func TestLabelsSurviveNVMLErrors(t *testing.T) {
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = testutil.ShortTempDir(t)
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.NodeName = "gpu-node-1"
	cfg.Taint.Mode = kubeapi.TaintOff
	cfg.Health.DCGMMode = "off"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := openAgent(cfg, log, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := startAgent(t, a)
	nodeLabels := func() map[string]string {
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Labels
	}
	testutil.WaitFor(t, "labels on the node", func() bool { return nodeLabels()["nvidia.com/gpu.product"] != "" })
	labelled := nodeLabels()
	if got := len(labelled); got < 25 {
		t.Fatalf("%d labels on the node, want at least GFD's 25: %v", got, labelled)
	}
	patches := labelPatches(client)

	// A GPU lost at run time: discovered Lost, labels untouched.
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"gpu-lost","gpu":3}`)
	a.Rescan()
	testutil.WaitFor(t, "gpu 3 discovered lost", func() bool {
		n := a.rec.current().node
		return n != nil && n.GPUs[3].Lost
	})
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, `{"kind":"gpu-lost","gpu":3}`)
	a.Rescan()
	testutil.WaitFor(t, "gpu 3 back", func() bool {
		n := a.rec.current().node
		return n != nil && !n.GPUs[3].Lost
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// A restart whose NVML fails from the first discovery on.
	model, err := sim.Profile(cfg.Simulate)
	if err != nil {
		t.Fatal(err)
	}
	hw, err := simhw.Open(simhw.Options{Model: model, Name: cfg.Simulate,
		NVML: nvmlowner.Config{CallTimeout: cfg.NVMLCallTimeout}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	hw.Node().ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(`{"kind":"nvml-failure"}`)))
	if rec.Code/100 != 2 {
		t.Fatalf("nvml-failure: %d %s", rec.Code, rec.Body)
	}
	cfg2 := cfg.Config
	cfg2.Health.StateDir = filepath.Join(hw.HostRoot(), "var/lib/gpu-node-agent")
	b, err := Open(cfg2, hw, log, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, b)
	testutil.WaitFor(t, "the restarted agent's failed discovery", func() bool { return b.rec.current().errs["discovery"] != nil })
	// The labeler has started (it watches the Node) and has had nothing
	// to apply: the discovery failed and no node was handed to it.
	testutil.WaitFor(t, "the restarted agent's node watch", func() bool { return b.node != nil && len(client.Actions()) > 0 })

	if got := nodeLabels(); !maps.Equal(got, labelled) {
		t.Errorf("labels changed:\n got  %v\n want %v", got, labelled)
	}
	if got := labelPatches(client); got != patches {
		t.Errorf("%d label patches after the first labelling, want none", got-patches)
	}
}

// labelPatches counts the patches of the Node that carry labels.
func labelPatches(client *fake.Clientset) int {
	n := 0
	for _, act := range client.Actions() {
		if p, ok := act.(k8stesting.PatchAction); ok && act.GetResource().Resource == "nodes" &&
			bytes.Contains(p.GetPatch(), []byte(`"labels"`)) {
			n++
		}
	}
	return n
}

// TestCliqueLabelFollowsFabric: on a multi-node NVLink node the agent
// writes nvidia.com/gpu.clique; a GPU whose fabric registration is back
// in progress removes it from the Node (a complete discovery without it),
// and the registration completing puts it back.
func TestCliqueLabelFollowsFabric(t *testing.T) {
	const clique = "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90.7"
	cfg := defaults()
	cfg.Simulate = "gb200-nvl72"
	cfg.DevicePluginDir = testutil.ShortTempDir(t)
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.NodeName = "gpu-node-1"
	cfg.Taint.Mode = kubeapi.TaintOff
	cfg.Health.DCGMMode = "off"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := startAgent(t, a)
	label := func() (string, bool) {
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := n.Labels["nvidia.com/gpu.clique"]
		return v, ok
	}
	testutil.WaitFor(t, "the clique label", func() bool { v, _ := label(); return v == clique })

	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"fabric-not-ready","gpu":1}`)
	a.Rescan()
	testutil.WaitFor(t, "the clique label removed while gpu 1 registers", func() bool { _, ok := label(); return !ok })

	testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, `{"kind":"fabric-not-ready","gpu":1}`)
	a.Rescan()
	testutil.WaitFor(t, "the clique label back", func() bool { v, _ := label(); return v == clique })
}

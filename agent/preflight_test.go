package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/agent/simhw"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// fakeGate is the Node side of the preflight gate: it says whether the
// Node is proven and records the verdicts handed to it.
type fakeGate struct {
	proven   bool
	labels   map[string]string
	verdicts chan kubeapi.PreflightVerdict
	// fail is how many reads of the record fail first.
	fail int
	// rerun is the operator's re-run requests (nil: none come).
	rerun chan struct{}
}

func (g *fakeGate) PreflightRerun() <-chan struct{} { return g.rerun }

func (g *fakeGate) PreflightRecord(ctx context.Context) (bool, map[string]string, error) {
	if g.fail > 0 {
		g.fail--
		return false, nil, fmt.Errorf("nodes %q not found", "gpu-node-1")
	}
	return g.proven, g.labels, ctx.Err()
}

func (g *fakeGate) SetPreflight(v kubeapi.PreflightVerdict) { g.verdicts <- v }

// preflightHW opens a simulated DGX H100 for the preflighter tests, with
// its fault endpoint as a function.
func preflightHW(t *testing.T) (*simhw.Hardware, func(method, body string)) {
	t.Helper()
	model, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	hw, err := simhw.Open(simhw.Options{Model: model, Name: "dgx-h100", NVML: nvmlowner.Config{CallTimeout: nvmlowner.DefaultCallTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hw.Close)
	ctl := hw.Node().ControlHandler()
	fault := func(method, body string) {
		t.Helper()
		rec := httptest.NewRecorder()
		ctl.ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
		if rec.Code/100 != 2 {
			t.Fatalf("%s /faults %s: %d %s", method, body, rec.Code, rec.Body)
		}
	}
	return hw, fault
}

// newTestPreflighter is a preflighter on hw with a registry of its own;
// observations go to obs.
func newTestPreflighter(t *testing.T, hw Hardware, cfg preflight.Config, asg *usage.Assignments) (*preflighter, *prometheus.Registry, *observations) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := preflight.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs := &observations{}
	node, err := hw.Discover()
	if err != nil {
		t.Fatal(err)
	}
	return &preflighter{
		cfg: Config{Preflight: cfg}, hw: hw, metrics: m, checker: preflight.New(cfg, nil),
		observe:     obs.add,
		node:        func() *topology.Node { return node },
		assignments: func() *usage.Assignments { return asg },
		log:         slog.New(slog.DiscardHandler),
	}, reg, obs
}

type observations struct {
	mu   sync.Mutex
	list []health.Observation
}

func (o *observations) add(x health.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.list = append(o.list, x)
}

// take returns and forgets what was observed.
func (o *observations) take() []health.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.list
	o.list = nil
	return l
}

// holding is a pod-resources answer in which one container holds ids.
func holding(ids ...string) *usage.Assignments {
	return usage.NewAssignments(&podresourcesv1.ListPodResourcesResponse{
		PodResources: []*podresourcesv1.PodResources{{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			{Name: "trainer", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: ids}}},
		}}},
	}, nil)
}

// gatedConfig is an agent on a simulated DGX H100 with preflight.enabled
// (retries every 20 ms) against a fake API server holding node, and the
// fake's clientset.
func gatedConfig(t *testing.T, node *corev1.Node) (testConfig, *fake.Clientset) {
	t.Helper()
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = testutil.ShortTempDir(t)
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.NodeName = node.Name
	cfg.NodeLabels = false
	cfg.Taint.Mode = kubeapi.TaintOff
	cfg.Health.DCGMMode = "off"
	cfg.Preflight = preflight.Config{Enabled: true, RetryInterval: preflight.Duration(20 * time.Millisecond)}
	client := fake.NewClientset(node)
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	return cfg, client
}

// preflightState is the Node's preflight taint and condition (nil for
// none) and whether it carries the re-run annotation.
func preflightState(t *testing.T, client *fake.Clientset, name string) (taint *corev1.Taint, cond *corev1.NodeCondition, rerun bool) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == kubeapi.DefaultPreflightTaintKey {
			taint = &n.Spec.Taints[i]
		}
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == kubeapi.DefaultPreflightCondition {
			cond = &n.Status.Conditions[i]
		}
	}
	_, rerun = n.Annotations[kubeapi.PreflightRerunAnnotation]
	return taint, cond, rerun
}

// TestPreflightGatesUntilPass: on a node never proven the gating run
// fails while GPU 3's link is degraded (the verdict names the item and
// the GPU, the node stays gated and the run is repeated), and passes
// once the link trains at its maximum again; then it stops.
func TestPreflightGatesUntilPass(t *testing.T) {
	hw, fault := preflightHW(t)
	fault(http.MethodPost, `{"kind":"pcie-degraded","gpu":3}`)
	p, reg, _ := newTestPreflighter(t, hw, preflight.Config{Enabled: true, RetryInterval: preflight.Duration(time.Millisecond)}, nil)
	gate := &fakeGate{verdicts: make(chan kubeapi.PreflightVerdict)}
	p.gate = gate
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(t.Context())
	}()
	v := <-gate.verdicts
	if !v.Ran || v.Passed || !strings.Contains(v.Message, "pcie-link") || !strings.Contains(v.Message, "GPU 3 (") {
		t.Fatalf("first verdict %+v; want a failure naming pcie-link and GPU 3", v)
	}
	if got := gauge(t, reg, "gpu_node_agent_preflight_passed", ""); got != 0 {
		t.Errorf("gpu_node_agent_preflight_passed %v after a failed run", got)
	}
	// The retry runs again with the fault in place: still failed.
	if v := <-gate.verdicts; v.Passed {
		t.Fatalf("second verdict passed with the link still degraded: %+v", v)
	}
	fault(http.MethodDelete, `{"kind":"pcie-degraded","gpu":3}`)
	for v := range gate.verdicts {
		if v.Passed {
			if !strings.HasPrefix(v.Message, "preflight passed") {
				t.Errorf("passing verdict's message %q", v.Message)
			}
			break
		}
	}
	<-done // no re-check interval: the runner ends after the pass
	if got := gauge(t, reg, "gpu_node_agent_preflight_passed", ""); got != 1 {
		t.Errorf("gpu_node_agent_preflight_passed %v after the pass", got)
	}
}

// TestPreflightRecordRetried: a Node record that cannot be read (the
// Node not registered yet) is read again, and the gate then runs; it does
// not stop the preflight.
func TestPreflightRecordRetried(t *testing.T) {
	hw, _ := preflightHW(t)
	p, _, _ := newTestPreflighter(t, hw, preflight.Config{Enabled: true}, nil)
	p.recordRetry = time.Millisecond
	gate := &fakeGate{fail: 2, verdicts: make(chan kubeapi.PreflightVerdict, 1)}
	p.gate = gate
	p.run(t.Context())
	select {
	case v := <-gate.verdicts:
		if !v.Passed {
			t.Errorf("verdict %+v on a healthy node", v)
		}
	default:
		t.Error("no verdict after the record could be read")
	}
}

// TestPreflightProvenNodeNotRun: a Node an earlier run proved is not run
// again (its GPUs may be busy): no verdict, no series.
func TestPreflightProvenNodeNotRun(t *testing.T) {
	hw, _ := preflightHW(t)
	p, reg, _ := newTestPreflighter(t, hw, preflight.Config{Enabled: true}, nil)
	p.gate = &fakeGate{proven: true, verdicts: make(chan kubeapi.PreflightVerdict, 1)}
	p.run(t.Context())
	if n, err := promtestutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("%d preflight series (err %v) on a proven node; want none", n, err)
	}
}

// TestPreflightRerunOnRequest: on a proven node nothing runs until an
// operator's re-run request; then every item runs as on a new node (GPU
// 3's degraded link fails it), again until it passes; a later request
// runs it once more.
func TestPreflightRerunOnRequest(t *testing.T) {
	hw, fault := preflightHW(t)
	fault(http.MethodPost, `{"kind":"pcie-degraded","gpu":3}`)
	p, reg, _ := newTestPreflighter(t, hw, preflight.Config{Enabled: true, RetryInterval: preflight.Duration(time.Millisecond)}, nil)
	gate := &fakeGate{proven: true, verdicts: make(chan kubeapi.PreflightVerdict), rerun: make(chan struct{}, 1)}
	p.gate = gate
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx)
	}()
	select {
	case v := <-gate.verdicts:
		t.Fatalf("verdict %+v on a proven node before any request", v)
	case <-time.After(50 * time.Millisecond):
	}
	if n, err := promtestutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("%d preflight series (err %v) before the request; want none", n, err)
	}
	gate.rerun <- struct{}{}
	if v := <-gate.verdicts; v.Passed || !strings.Contains(v.Message, "pcie-link: GPU 3 (") {
		t.Fatalf("verdict %+v after the request, want the degraded link", v)
	}
	fault(http.MethodDelete, `{"kind":"pcie-degraded","gpu":3}`)
	for v := range gate.verdicts {
		if v.Passed {
			break
		}
	}
	gate.rerun <- struct{}{}
	if v := <-gate.verdicts; !v.Passed {
		t.Fatalf("verdict %+v after the second request, want a pass", v)
	}
	cancel()
	<-done
}

// TestPreflightExpectedCountLabel: the expected count comes from the node
// label preflight.gpuCount.label names; a value that is no count fails
// the item naming the label.
func TestPreflightExpectedCountLabel(t *testing.T) {
	hw, _ := preflightHW(t)
	cfg := preflight.Config{Enabled: true, GPUCount: preflight.GPUCountConfig{Label: "example.com/gpus"}}
	for _, tc := range []struct {
		value, want string
		pass        bool
	}{
		{"8", "8 expected (label example.com/gpus)", true},
		{"16", "16 expected (label example.com/gpus)", false},
		{"eight", `node label example.com/gpus="eight" is not a GPU count`, false},
	} {
		p, _, _ := newTestPreflighter(t, hw, cfg, nil)
		rep := p.full(t.Context(), map[string]string{"example.com/gpus": tc.value})
		var got preflight.Result
		for _, r := range rep.Results {
			if r.Item == preflight.ItemGPUCount {
				got = r
			}
		}
		if (got.Status == preflight.Pass) != tc.pass || !strings.Contains(got.Detail, tc.want) {
			t.Errorf("label %q: gpu-count %s %q; want pass=%v and %q", tc.value, got.Status, got.Detail, tc.pass, tc.want)
		}
	}
}

// TestPreflightBusyNodeSkipsDisruptiveItems: when pods already hold GPUs
// (preflight switched on for a node in use), the gating run reads every
// GPU but does not run the command, which would load them.
func TestPreflightBusyNodeSkipsDisruptiveItems(t *testing.T) {
	hw, _ := preflightHW(t)
	cfg := preflight.Config{Enabled: true, Command: preflight.CommandConfig{Args: []string{"false"}}}
	gpu2 := hw.Node().Spec().GPUs[2].UUID
	for _, tc := range []struct {
		asg  *usage.Assignments
		want preflight.Status
	}{
		{nil, preflight.Fail}, // no answer: as a new node, the command runs (and fails)
		{holding(), preflight.Fail},
		{holding(gpu2), preflight.Skipped},
	} {
		p, _, _ := newTestPreflighter(t, hw, cfg, tc.asg)
		rep := p.full(t.Context(), nil)
		if got := rep.ItemStatus(preflight.ItemCommand); got != tc.want {
			t.Errorf("command %s; want %s (%+v)", got, tc.want, rep.Results)
		}
		if tc.want == preflight.Skipped && !strings.Contains(fmt.Sprint(rep.Results), "not run: pods hold GPU 2") {
			t.Errorf("skipped command does not say why: %+v", rep.Results)
		}
		if got := rep.ItemStatus(preflight.ItemPCIe); got != preflight.Pass {
			t.Errorf("pcie-link %s; the reading items run on a busy node too", got)
		}
	}
}

// TestPreflightCommandFaults: the simulated node's command-fail and
// command-slow faults act on the configured command through the real exec
// path: a failure with the simulator's message, a timeout killing the
// sleeping shell; cleared, the command runs and passes.
func TestPreflightCommandFaults(t *testing.T) {
	hw, fault := preflightHW(t)
	cfg := preflight.Config{Enabled: true, Command: preflight.CommandConfig{Args: []string{"true"}, Timeout: preflight.Duration(200 * time.Millisecond)}}
	command := func() preflight.Result {
		t.Helper()
		p, _, _ := newTestPreflighter(t, hw, cfg, nil)
		for _, r := range p.full(t.Context(), nil).Results {
			if r.Item == preflight.ItemCommand {
				return r
			}
		}
		t.Fatal("no command result")
		return preflight.Result{}
	}
	if r := command(); r.Status != preflight.Pass {
		t.Fatalf("no fault: %+v", r)
	}
	fault(http.MethodPost, `{"kind":"command-fail","exitCode":3}`)
	if r := command(); r.Status != preflight.Fail || !strings.Contains(r.Detail, "true exited with status 3") ||
		!strings.Contains(r.Detail, "simulated preflight command failure") {
		t.Errorf("command-fail: %+v", r)
	}
	fault(http.MethodDelete, `{"kind":"command-fail"}`)
	fault(http.MethodPost, `{"kind":"command-slow","seconds":60}`)
	if r := command(); r.Status != preflight.Fail || !strings.Contains(r.Detail, "true timed out after 200ms, killed") {
		t.Errorf("command-slow: %+v", r)
	}
	fault(http.MethodDelete, `{"kind":"command-slow"}`)
	if r := command(); r.Status != preflight.Pass {
		t.Errorf("cleared: %+v", r)
	}
}

// TestPreflightRecheck: a re-check reads only the GPUs no pod holds (not
// one of GPU 0's), reports a failed item as a fault of its GPU and clears
// it once the GPU passes again; the series follow.
func TestPreflightRecheck(t *testing.T) {
	hw, fault := preflightHW(t)
	spec := hw.Node().Spec()
	gpu0, gpu1 := spec.GPUs[0].UUID, spec.GPUs[1].UUID
	fault(http.MethodPost, `{"kind":"pcie-degraded","gpu":0}`)
	fault(http.MethodPost, `{"kind":"pcie-degraded","gpu":1}`)
	p, reg, obs := newTestPreflighter(t, hw, preflight.Config{RecheckInterval: preflight.Duration(time.Hour)}, holding(gpu0))
	p.recheck(t.Context())
	got := obs.take()
	fatal := func(l []health.Observation, id, key string) bool {
		return slices.ContainsFunc(l, func(o health.Observation) bool {
			return o.DeviceID == id && o.Key == key && o.Check == health.CheckPreflight && o.Fatal && strings.Contains(o.Reason, "PCIe link")
		})
	}
	if !fatal(got, gpu1, preflight.ItemPCIe) {
		t.Errorf("no pcie-link fault for idle GPU 1 in %+v", got)
	}
	for _, o := range got {
		if o.DeviceID == gpu0 {
			t.Errorf("GPU 0, held by a pod, was re-checked: %+v", o)
		}
		if o.Fatal && o.DeviceID != gpu1 {
			t.Errorf("unexpected fault %+v", o)
		}
	}
	// Every item of every idle GPU is reported: 7 GPUs.
	if want := 7 * len(preflight.GPUItems); len(got) != want {
		t.Errorf("%d observations; want %d (every per-GPU item of the 7 idle GPUs)", len(got), want)
	}
	if n := gauge(t, reg, "gpu_node_agent_preflight_failed", gpu1); n != 1 {
		t.Errorf("gpu_node_agent_preflight_failed for GPU 1 = %v", n)
	}
	fault(http.MethodDelete, `{"kind":"pcie-degraded","gpu":1}`)
	p.recheck(t.Context())
	got = obs.take()
	if !slices.ContainsFunc(got, func(o health.Observation) bool {
		return o.DeviceID == gpu1 && o.Key == preflight.ItemPCIe && o.Cleared
	}) {
		t.Errorf("GPU 1's pcie-link fault not cleared after it passed: %+v", got)
	}
	if slices.ContainsFunc(got, func(o health.Observation) bool { return o.Fatal }) {
		t.Errorf("faults after every idle GPU passed: %+v", got)
	}
	if got := gauge(t, reg, "gpu_node_agent_preflight_passed", ""); got != 1 {
		t.Errorf("gpu_node_agent_preflight_passed %v after every idle GPU passed", got)
	}
	if got := gauge(t, reg, "gpu_node_agent_preflight_failed", gpu1); got != -1 {
		t.Errorf("gpu_node_agent_preflight_failed for GPU 1 still %v after it passed", got)
	}
}

// TestPreflightRecheckWaitsForKubelet: without the kubelet's answer no
// GPU is re-checked (any may be busy).
func TestPreflightRecheckWaitsForKubelet(t *testing.T) {
	hw, _ := preflightHW(t)
	p, _, obs := newTestPreflighter(t, hw, preflight.Config{RecheckInterval: preflight.Duration(time.Hour)}, nil)
	p.recheck(t.Context())
	if got := obs.take(); len(got) != 0 {
		t.Errorf("re-checked without knowing which GPUs pods hold: %+v", got)
	}
}

// gauge is the value of the series of family name that has a label
// with value label (any series when label is empty); -1 when none.
func gauge(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == label }) {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// TestAgentPreflightGate wires the whole agent: preflight.enabled with a
// node name (tainting off: the gate has its own switch) taints the Node
// that never passed, keeps it tainted with GPUPreflight=False naming GPU
// 3's degraded link, and untaints it (GPUPreflight=True) once the link
// trains at its maximum again and a retry passes; the preflight series
// follow.
func TestAgentPreflightGate(t *testing.T) {
	cfg, client := gatedConfig(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}})
	cfg.MetricsAddress = freeport.Addr(t)
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The link is degraded before the agent starts (as --sim-faults).
	if err := simOf(a).InjectFault(sim.Fault{Kind: sim.FaultPCIeDegraded, GPU: 3}); err != nil {
		t.Fatal(err)
	}
	ctx, _ := startAgent(t, a)
	gpu3 := simOf(a).Spec().GPUs[3]
	testutil.WaitFor(t, "GPUPreflight=False naming GPU 3's link, and the taint", func() bool {
		taint, c, _ := preflightState(t, client, cfg.NodeName)
		return taint != nil && taint.Value == "failed" && taint.Effect == corev1.TaintEffectNoSchedule &&
			c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "pcie-link: GPU 3 ("+gpu3.PCIBusID+")")
	})
	base := "http://" + cfg.MetricsAddress
	testutil.WaitFor(t, "the failed item's series", func() bool {
		_, body := httpGet(base + "/metrics")
		return strings.Contains(body, `gpu_node_agent_preflight_failed{device="`+gpu3.UUID+`",item="pcie-link"} 1`) &&
			strings.Contains(body, "gpu_node_agent_preflight_passed 0")
	})
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, `{"kind":"pcie-degraded","gpu":3}`)
	testutil.WaitFor(t, "the taint removed and GPUPreflight=True", func() bool {
		taint, c, _ := preflightState(t, client, cfg.NodeName)
		return taint == nil && c != nil && c.Status == corev1.ConditionTrue
	})
	_, body := httpGet(base + "/metrics")
	if !strings.Contains(body, "gpu_node_agent_preflight_passed 1") || strings.Contains(body, "gpu_node_agent_preflight_failed{") {
		t.Errorf("series after the pass:\n%s", grepLines(body, "gpu_node_agent_preflight_"))
	}

	// The link degrades again and an operator asks for a re-run: the
	// whole preflight runs on the proven node, which is tainted failed.
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"pcie-degraded","gpu":3}`)
	n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Annotations = map[string]string{kubeapi.PreflightRerunAnnotation: "link reseated"}
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the re-run taints the node failed and the request is removed", func() bool {
		taint, c, requested := preflightState(t, client, cfg.NodeName)
		return !requested && taint != nil && taint.Value == "failed" && c != nil && strings.Contains(c.Message, "pcie-link: GPU 3 (")
	})
}

// TestAgentPreflightAfterReboot: a Node whose preflight passed before
// the host's last boot is gated again, as a new node: the re-run finds
// GPU 3's degraded link and taints the node failed; once the link is
// back the pass is recorded with a transition after the boot.
func TestAgentPreflightAfterReboot(t *testing.T) {
	boot := time.Now().Add(-time.Minute).Truncate(time.Second)
	passedBefore := metav1.NewTime(boot.Add(-time.Hour))
	cfg, client := gatedConfig(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: kubeapi.DefaultPreflightCondition,
			Status: corev1.ConditionTrue, Reason: "PreflightPassed", Message: "preflight passed (12 items passed)",
			LastHeartbeatTime: passedBefore, LastTransitionTime: passedBefore}}}})
	cfg.BootTime = boot
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.preflightGateConfig().BootTime; !got.Equal(boot) {
		t.Fatalf("the gate's boot time %v, want /proc/stat's %v", got, boot)
	}
	if err := simOf(a).InjectFault(sim.Fault{Kind: sim.FaultPCIeDegraded, GPU: 3}); err != nil {
		t.Fatal(err)
	}
	startAgent(t, a)
	testutil.WaitFor(t, "the rebooted node tainted failed, naming GPU 3's link", func() bool {
		taint, c, _ := preflightState(t, client, cfg.NodeName)
		return taint != nil && taint.Value == "failed" && c != nil && c.Status == corev1.ConditionFalse &&
			strings.Contains(c.Message, "pcie-link: GPU 3 (")
	})
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, `{"kind":"pcie-degraded","gpu":3}`)
	testutil.WaitFor(t, "the taint removed and GPUPreflight=True since the boot", func() bool {
		taint, c, _ := preflightState(t, client, cfg.NodeName)
		return taint == nil && c != nil && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.Time.Before(boot)
	})
}

// TestHostBootTime: btime of /proc/stat under the host root; a missing
// file or line is an error naming it, and keepAcrossReboots (or an
// unreadable boot time) gives the gate none.
func TestHostBootTime(t *testing.T) {
	root := t.TempDir()
	if _, err := hostBootTime(root); err == nil {
		t.Fatal("no error without /proc/stat")
	}
	boot := time.Unix(1764201600, 0)
	if err := writeProcStat(root, boot); err != nil {
		t.Fatal(err)
	}
	got, err := hostBootTime(root)
	if err != nil || !got.Equal(boot) {
		t.Fatalf("hostBootTime = %v, %v; want %v", got, err, boot)
	}
	noBtime := t.TempDir()
	if err := os.MkdirAll(filepath.Join(noBtime, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noBtime, "proc", "stat"), []byte("cpu  1 2 3 4 5 6 7 8 0 0\nctxt 3\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := hostBootTime(noBtime); err == nil || !strings.Contains(err.Error(), "no btime in "+filepath.Join(noBtime, "proc", "stat")) {
		t.Fatalf("hostBootTime without btime: %v", err)
	}

	hw, _ := preflightHW(t)
	a := &Agent{cfg: Config{Preflight: preflight.Config{Enabled: true, KeepAcrossReboots: true}}, hw: hw, log: slog.New(slog.DiscardHandler)}
	if err := writeProcStat(hw.HostRoot(), boot); err != nil {
		t.Fatal(err)
	}
	if got := a.preflightGateConfig().BootTime; !got.IsZero() {
		t.Fatalf("keepAcrossReboots: the gate's boot time %v, want none", got)
	}
	a.cfg.Preflight.KeepAcrossReboots = false
	if got := a.preflightGateConfig().BootTime; !got.Equal(boot) {
		t.Fatalf("the gate's boot time %v, want %v", got, boot)
	}
}

func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

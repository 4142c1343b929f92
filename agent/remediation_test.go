package agent

import (
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
	"github.com/gpu-node-agent/gpu-node-agent/usage/usagetest"
)

// TestAgentRemediation runs the whole loop in the simulator, the agent
// against a fake API server and an empty kubelet: a reset-class XID on an
// idle GPU ends in a reset (through the agent's NVML release and the
// simulated node's resetter) and the GPU healthy again; a reset that
// fails or hangs (the simulator's reset-fail and reset-hang faults)
// becomes a reboot request, the sentinel file and the Node condition.
func TestAgentRemediation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  string // the reset's outcome fault, "" for none
		result string
	}{
		{"reset works", "", remediate.ResultSuccess},
		{"reset fails", sim.FaultResetFail, remediate.ResultFailed},
		{"reset hangs", sim.FaultResetHang, remediate.ResultTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t)
			cfg := defaults()
			cfg.Simulate = "dgx-h100"
			cfg.DevicePluginDir = dir
			cfg.MetricsAddress = ""
			cfg.SimControlAddress = ""
			cfg.RescanInterval = 0
			cfg.NodeName = "gpu-node-1"
			cfg.Taint.Mode = kubeapi.TaintOn
			cfg.Health.RecoveryPeriod = time.Second
			cfg.Health.PollInterval = 200 * time.Millisecond
			cfg.Health.DCGMMode = "off"
			cfg.Remediation = remediate.Config{
				RetryInterval: remediate.Duration(200 * time.Millisecond),
				Reset:         remediate.ResetConfig{Enabled: true, Timeout: remediate.Duration(time.Second)},
				Reboot:        remediate.RebootConfig{Enabled: true},
			}.WithDefaults()
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
			cfg.KubeClients = func() (kubeapi.Clients, error) {
				return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
			}
			a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if a.remediator == nil {
				t.Fatal("no remediator with remediation.reset enabled")
			}
			root := a.hw.HostRoot()
			usagetest.ServePodResources(t, usage.PodResourcesSocketPath(root))
			sentinel := filepath.Join(root, remediate.DefaultSentinelPath)
			if err := os.MkdirAll(filepath.Dir(sentinel), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, _ := startAgent(t, a)
			testutil.WaitFor(t, "the health monitor listening for XIDs", a.mon.Listening)
			testutil.WaitFor(t, "discovery", func() bool { return a.rec.current().node != nil })
			gpu := a.rec.current().node.GPUs[3].UUID
			if tc.fault != "" {
				if err := simOf(a).InjectFault(sim.Fault{Kind: tc.fault, GPU: 3}); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			if err := simOf(a).InjectFault(sim.Fault{Kind: sim.FaultXID, GPU: 3, XID: 48}); err != nil {
				t.Fatal(err)
			}
			events := func(reason string) []string {
				list, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, e := range list.Items {
					if e.Reason == reason {
						out = append(out, e.Message)
					}
				}
				return out
			}
			condition := func() *corev1.NodeCondition {
				n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for i := range n.Status.Conditions {
					if string(n.Status.Conditions[i].Type) == remediate.DefaultRebootCondition {
						return &n.Status.Conditions[i]
					}
				}
				return nil
			}
			if tc.fault == "" {
				testutil.WaitFor(t, "GPUResetSucceeded", func() bool { return len(events("GPUResetSucceeded")) == 1 })
				reset := time.Since(start)
				testutil.WaitFor(t, "the GPU healthy again", func() bool { return a.mon.Healthy(gpu) })
				t.Logf("xid 48 on idle GPU 3: reset after %s, healthy after %s (recovery period 1s, poll 200ms)",
					reset.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
				if _, err := os.Stat(sentinel); err == nil || len(events("RebootRequested")) > 0 {
					t.Error("a reboot was requested after a reset that worked")
				}
			} else {
				testutil.WaitFor(t, "the reboot sentinel", func() bool { _, err := os.Stat(sentinel); return err == nil })
				testutil.WaitFor(t, "the reboot condition", func() bool { c := condition(); return c != nil && c.Status == corev1.ConditionTrue })
				t.Logf("xid 48 on GPU 3, reset %s: reboot requested after %s", tc.result, time.Since(start).Round(time.Millisecond))
				// Events are posted in the background: wait for it.
				testutil.WaitFor(t, "the GPUResetFailed Event", func() bool { return len(events("GPUResetFailed")) > 0 })
				failed := events("GPUResetFailed")
				if len(failed) != 1 || !strings.Contains(failed[0], gpu) {
					t.Errorf("GPUResetFailed events %q, want one naming %s", failed, gpu)
				}
				if a.mon.Healthy(gpu) {
					t.Error("GPU healthy after a reset that did not work")
				}
				// The request stands while the GPU needs it; the operator
				// then resets the GPU by hand instead of rebooting: the
				// agent sees the reset and withdraws its request.
				time.Sleep(time.Second) // several retry intervals
				if _, err := os.Stat(sentinel); err != nil {
					t.Fatalf("the reboot request went while the GPU still needs a reset: %v", err)
				}
				if err := simOf(a).ClearFault(sim.Fault{Kind: tc.fault, GPU: 3}); err != nil {
					t.Fatal(err)
				}
				if err := simOf(a).InjectFault(sim.Fault{Kind: sim.FaultGPUReset, GPU: 3}); err != nil {
					t.Fatal(err)
				}
				testutil.WaitFor(t, "the sentinel removed", func() bool { _, err := os.Stat(sentinel); return os.IsNotExist(err) })
				testutil.WaitFor(t, "the condition False", func() bool { c := condition(); return c != nil && c.Status == corev1.ConditionFalse })
			}
			if got := counter(t, a, tc.result); got != 1 {
				t.Errorf("gpu_node_agent_remediation_total{action=reset,result=%s} = %v, want 1", tc.result, got)
			}
		})
	}
}

// counter reads gpu_node_agent_remediation_total{action="reset",result}.
func counter(t *testing.T, a *Agent, result string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpu_node_agent_remediation_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == remediate.ActionReset && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestDrainDevices: with remediation.drain on, a GPU that needs a reset
// and its MIG devices get the NoExecute device taint (the device-taint
// eviction controller drains their claims' pods); not in a dry run, not
// for a reboot, not with drain off.
func TestDrainDevices(t *testing.T) {
	node := &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0", MIGEnabled: true, MIG: []topology.MIGDevice{{UUID: "MIG-0a"}, {UUID: "MIG-0b"}}},
		{Index: 1, UUID: "GPU-1"},
		{Index: 2, UUID: "GPU-2"},
	}}
	for _, tc := range []struct {
		name  string
		drain remediate.DrainConfig
		want  []string
	}{
		{"drain on", remediate.DrainConfig{Enabled: true}, []string{"GPU-0", "MIG-0a", "MIG-0b"}},
		{"dry run", remediate.DrainConfig{Enabled: true, DryRun: true}, nil},
		{"drain off", remediate.DrainConfig{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mon, err := health.NewMonitor(health.Config{DCGMMode: "off", MIGDevicesServed: true}, nil, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			mon.SetNode(node)
			// A reset-class fault on a MIG device of GPU 0, a reboot-class
			// one on GPU 2.
			mon.Observe(health.Observation{DeviceID: "MIG-0a", Check: health.CheckXID, Key: "xid 95", XID: 95, Fatal: true, Event: true, Reason: "xid 95"})
			mon.Observe(health.Observation{DeviceID: "GPU-2", Check: health.CheckXID, Key: "xid 79", XID: 79, Fatal: true, Event: true, Reason: "xid 79"})
			a := &Agent{cfg: Config{Remediation: remediate.Config{Reset: remediate.ResetConfig{Enabled: true}, Drain: tc.drain}}, mon: mon}
			got := slices.Sorted(maps.Keys(a.drainDevices(node)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("drainDevices = %v, want %v", got, tc.want)
			}
		})
	}
}

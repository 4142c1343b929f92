package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// TestLabelsSurviveAgentRestartWithNVMLError: the agent binary (simulate
// mode, a DGX H100 with MIG, --node-labels) labels a Node on the real API
// server; it is stopped and started again with NVML failing from the
// start (the whole library: nvmlInit fails; or one GPU answering
// GPU_IS_LOST), and a watch records every update of the Node from the
// first agent's exit on. No update may remove, change or add a label
// while the restarted agent runs on a failing NVML, nor once NVML
// recovers (no flapping): its labeler writes only from a complete
// discovery, which equals the first agent's. As a negative control the
// same check is run over a removal of one label by someone else, which it
// must report (the agent then puts the label back).
func TestLabelsSurviveAgentRestartWithNVMLError(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	tests := []struct {
		name string
		node string
		// fault is the --sim-faults value of the restart and the fault
		// the control API then clears (GPU index for gpu-lost).
		fault     agentproc.Fault
		simFaults string
		// failing is an agent log line showing the restarted agent has
		// run a discovery on the failing NVML.
		failing string
		// recovered is the log line of its first complete discovery.
		recovered string
		// discoveryCall is an NVML call every discovery makes (counted
		// by the simulator's GET /calls).
		discoveryCall string
	}{
		{
			name: "nvml init fails", node: "gpu-labels-nvml-failure",
			fault: agentproc.Fault{Kind: "nvml-failure"}, simFaults: "nvml-failure",
			failing: "device discovery failed", recovered: "device discovery works again",
			discoveryCall: "Init",
		},
		{
			name: "a GPU lost", node: "gpu-labels-gpu-lost",
			fault: agentproc.Fault{Kind: "gpu-lost", GPU: 3}, simFaults: "gpu-lost:3",
			failing: "node labels kept as they are: discovery incomplete", recovered: "node labels follow discovery again",
			discoveryCall: "DeviceGetCount",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			createNode(t, c.Client, tc.node)
			hostRoot := t.TempDir()
			pluginDir, err := os.MkdirTemp("", "gna-labels-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(pluginDir) })
			start := func(extra ...string) (*agentproc.Agent, agentproc.SimControl) {
				control := "127.0.0.1:" + strconv.Itoa(agentproc.FreePort(t))
				args := append([]string{
					"--simulate", "dgx-h100,mig=0:1g.10gb+1g.10gb+2g.20gb+3g.40gb",
					"--mig-strategy", "mixed",
					// The same simulated host root (and state dir in it)
					// across the restart, as on a real node.
					"--host-root", hostRoot,
					"--device-plugin-dir", pluginDir,
					"--sim-control-address", control,
					"--metrics-address=",
					"--node-name", tc.node,
					"--kubeconfig", c.Kubeconfig,
					"--node-labels",
					"--taint-mode", "off",
					"--rescan-interval", "300ms",
					"--log-level", "debug",
				}, extra...)
				return agentproc.Start(t, args...), agentproc.SimControl{Base: "http://" + control}
			}

			first, _ := start()
			testutil.WaitForWithin(t, time.Minute, "the first agent's labels on the node", func() bool {
				return getNode(t, c.Client, tc.node).Labels["nvidia.com/gpu.product"] != ""
			})
			if err := first.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			before := getNode(t, c.Client, tc.node)
			labelled := before.Labels
			owned := strings.Split(before.Annotations[kubeapi.OwnedLabelsAnnotation], ",")
			if len(owned) < 25 || labelled["nvidia.com/mig-1g.10gb.count"] == "" {
				t.Fatalf("the first agent set %d labels (%v), want at least GFD's 25 with MIG ones: %v", len(owned), owned, labelled)
			}
			rec := recordNode(t, c.Client, tc.node, before.ResourceVersion)

			// The restart, NVML failing from the start.
			second, control := start("--sim-faults", tc.simFaults)
			testutil.WaitForWithin(t, time.Minute, "the restarted agent's discovery on the failing NVML", func() bool {
				return strings.Contains(second.Output(), tc.failing)
			})
			// Rescans (every 300ms) on the failing NVML: the labeler, whose
			// node watch is up by now, has had every chance to write.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			base := nvmlCalls(ctx, t, control, tc.discoveryCall)
			testutil.WaitForWithin(t, time.Minute, "three more discoveries on the failing NVML", func() bool {
				return nvmlCalls(ctx, t, control, tc.discoveryCall) >= base+3
			})
			if err := control.ClearFault(ctx, tc.fault); err != nil {
				t.Fatal(err)
			}
			testutil.WaitForWithin(t, time.Minute, "the restarted agent's first complete discovery", func() bool {
				return strings.Contains(second.Output(), tc.recovered)
			})

			// Negative control, which also shows the labeler acting on
			// the recovered discovery: someone removes one label; the
			// agent puts it back, in a patch computed from everything it
			// wants (any other difference would be in it too).
			const removed = "nvidia.com/gpu.product"
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, removed)
			if _, err := c.Client.CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			testutil.WaitForWithin(t, time.Minute, "the agent to put "+removed+" back", func() bool {
				return getNode(t, c.Client, tc.node).Labels[removed] != ""
			})
			updates := rec.stop(t, getNode(t, c.Client, tc.node).ResourceVersion)

			// The updates before the foreign removal are the restart's.
			cut := slices.IndexFunc(updates, func(n *corev1.Node) bool { _, ok := n.Labels[removed]; return !ok })
			if cut < 0 {
				t.Fatalf("the watch saw no update without %s: the negative control shows nothing (%d updates)", removed, len(updates))
			}
			restart, control2 := updates[:cut], updates[cut:]
			t.Logf("%d node updates during the restart and recovery, %d in the negative control", len(restart), len(control2))
			for _, n := range restart {
				if diff := labelDiff(labelled, n.Labels); diff != "" {
					t.Errorf("update rv %s during the restart changed the node's labels: %s", n.ResourceVersion, diff)
				}
			}
			if diff := labelDiff(labelled, control2[0].Labels); diff != fmt.Sprintf("removed %s=%s", removed, labelled[removed]) {
				t.Errorf("negative control: the removal reads %q", diff)
			}
			if diff := labelDiff(labelled, getNode(t, c.Client, tc.node).Labels); diff != "" {
				t.Errorf("labels after the recovery: %s", diff)
			}
		})
	}
}

// labelDiff says how got differs from want: labels removed, changed and
// added, each sorted by key; "" when they are equal.
func labelDiff(want, got map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := got[k]; !ok {
			out = append(out, fmt.Sprintf("removed %s=%s", k, want[k]))
		} else if v != want[k] {
			out = append(out, fmt.Sprintf("changed %s=%s to %s", k, want[k], v))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("added %s=%s", k, got[k]))
		}
	}
	return strings.Join(out, "; ")
}

// nvmlCalls is how often the simulated node behind control has answered
// the NVML call name (GET /calls).
func nvmlCalls(ctx context.Context, t testing.TB, control agentproc.SimControl, name string) uint64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, control.Base+"/calls", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /calls: %v", err)
	}
	defer resp.Body.Close()
	calls := map[string]uint64{}
	if err := json.NewDecoder(resp.Body).Decode(&calls); err != nil {
		t.Fatalf("GET /calls: %v", err)
	}
	return calls[name]
}

// Package conformance drives the built gpu-node-agent binary in simulate
// mode against the kubelet's own device-manager code, as a kubelet would:
// its registration server and plugin client, and its topology manager with
// the device manager as hint provider.
//
// The same test sources run against two Kubernetes versions: this
// directory's module (test/, k8s.io/kubernetes v1.37) and
// test/conformance/kubelet134 (its own go.mod, v1.34), whose test files
// are symlinks to these. Only version_test.go differs between the two: it
// adapts that version's kubelet API to what the shared tests call.
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// demoNode is the node `make demo` and the e2e cluster use: a DGX H100 with
// GPU 0 cut into 3g.40gb+2g.20gb+1g.10gb+1g.10gb and GPU 1 into 7x 1g.10gb.
const demoNode = "dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"

// waitTimeout bounds every wait for the agent to reach a state; generous,
// the machine is shared.
const waitTimeout = 30 * time.Second

// node is a running agent with the kubelet stand-in it registers with.
type node struct {
	kubelet *devicemanager.Kubelet
	agent   *agentproc.Agent
	control agentproc.SimControl
}

// startNode serves kubelet.sock in a fresh directory and starts the agent
// on it with the given --simulate and --mig-strategy values.
func startNode(t *testing.T, simulate, strategy string, extra ...string) *node {
	t.Helper()
	dir := pluginDir(t)
	k, err := devicemanager.Start(dir, newRegistrationServer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Errorf("stop registration server: %v", err)
		}
	})
	a, control := startAgent(t, dir, simulate, strategy, extra...)
	return &node{kubelet: k, agent: a, control: control}
}

// pluginDir makes a fresh device-plugin directory, removed when the test
// ends.
func pluginDir(t *testing.T) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "gna-conf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startAgent starts the agent in simulate mode on the device-plugin
// directory dir, where a kubelet already serves kubelet.sock.
func startAgent(t *testing.T, dir, simulate, strategy string, extra ...string) (*agentproc.Agent, agentproc.SimControl) {
	t.Helper()
	ctlAddr := "127.0.0.1:" + strconv.Itoa(agentproc.FreePort(t))
	args := append([]string{
		"--simulate", simulate,
		"--mig-strategy", strategy,
		"--device-plugin-dir", dir,
		"--sim-control-address", ctlAddr,
		"--metrics-address", "127.0.0.1:" + strconv.Itoa(agentproc.FreePort(t)),
	}, extra...)
	return agentproc.Start(t, args...), agentproc.SimControl{Base: "http://" + ctlAddr}
}

// served is the kubelet's view: resource -> devices, for the resources
// connected in the current generation that have sent a device list.
func served(plugins map[string]devicemanager.Plugin, generation int) map[string][]*pluginapi.Device {
	out := map[string][]*pluginapi.Device{}
	for _, name := range devicemanager.Connected(plugins, generation) {
		if devs := plugins[name].Devices; len(devs) > 0 {
			out[name] = devs
		}
	}
	return out
}

func counts(s map[string][]*pluginapi.Device) map[string]int {
	out := map[string]int{}
	for name, devs := range s {
		out[name] = len(devs)
	}
	return out
}

// waitCounts waits until exactly the resources in want are served, with
// those device counts, and returns what is served.
func (n *node) waitCounts(t *testing.T, want map[string]int) map[string][]*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	gen := n.kubelet.Generation()
	var last map[string][]*pluginapi.Device
	_, err := n.kubelet.WaitFor(ctx, func(p map[string]devicemanager.Plugin) bool {
		last = served(p, gen)
		return maps.Equal(counts(last), want)
	})
	if err != nil {
		select {
		case <-n.agent.Exited():
			t.Fatalf("agent exited (%v) before serving %v; served %v", n.agent.Err(), want, counts(last))
		default:
		}
		t.Fatalf("resources served by the agent: got %v, want %v: %v", fmtCounts(counts(last)), fmtCounts(want), err)
	}
	return last
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// numaHistogram counts a resource's devices per NUMA node (-1: no
// topology, -2: more than one node).
func numaHistogram(devs []*pluginapi.Device) map[int]int {
	out := map[int]int{}
	for _, d := range devs {
		switch {
		case d.Topology == nil || len(d.Topology.Nodes) == 0:
			out[-1]++
		case len(d.Topology.Nodes) > 1:
			out[-2]++
		default:
			out[int(d.Topology.Nodes[0].ID)]++
		}
	}
	return out
}

// simState is the part of the simulator's GET /state (a topology snapshot)
// the tests read.
type simState struct {
	GPUs []struct {
		Index    int    `json:"index"`
		UUID     string `json:"uuid"`
		NUMANode int    `json:"numaNode"`
		MIG      []struct {
			UUID    string `json:"uuid"`
			Profile string `json:"profile"`
		} `json:"mig"`
	} `json:"gpus"`
	NICs []struct {
		Name     string `json:"name"`
		NUMANode int    `json:"numaNode"`
	} `json:"nics"`
}

func (n *node) state(t *testing.T) simState {
	t.Helper()
	return getState(t, n.control)
}

// getState reads the simulated node's topology from its control endpoint.
func getState(t *testing.T, c agentproc.SimControl) simState {
	t.Helper()
	resp, err := http.Get(c.Base + "/state")
	if err != nil {
		t.Fatalf("get simulator state: %v", err)
	}
	defer resp.Body.Close()
	var s simState
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("decode simulator state: %v", err)
	}
	return s
}

// admitted is the pods a test had the kubelet admit, which its device
// manager reads as the active pods.
type admitted struct {
	mu   sync.Mutex
	pods []*v1.Pod
}

// active lists the admitted pods: startTopologyKubelet's activePods.
func (a *admitted) active() []*v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.pods)
}

// admit asks kl to admit pod and records it when admitted.
func (a *admitted) admit(kl topologyKubelet, pod *v1.Pod) admitResult {
	r := kl.Admit(pod)
	if r.Admit {
		a.mu.Lock()
		a.pods = append(a.pods, pod)
		a.mu.Unlock()
	}
	return r
}

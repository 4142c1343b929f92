// Package e2e runs the agent as a DaemonSet on a real single-node cluster
// (see package cluster) and checks what the kubelet, the scheduler and pods
// see. One cluster is shared by the tests of this package, in order.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// agent is the chart-installed agent; agentErr says why there is none.
var (
	agent    *agentdeploy.Agent
	agentErr error
)

// installAgent loads the agent image and installs the chart in simulate
// mode; a failure is reported by every test that needs the agent.
func installAgent(ctx context.Context) {
	start := time.Now()
	if agentErr = shared.ImportAgentImage(ctx, ""); agentErr != nil {
		return
	}
	if agent, agentErr = agentdeploy.Install(ctx, shared, agentdeploy.Options{
		// A short recovery period, so the health scenario's node recovers
		// within the test after its fault is cleared; polls (and so the
		// GPU process check's cycles) every e2ePollInterval instead of
		// 10 s, so what a poll sees (a zombie, a reset) is seen sooner;
		// the GPU process check as the zombie scenario wants it.
		Values: map[string]any{"config": map[string]any{"health": map[string]any{
			"recoveryPeriod": "10s", "pollInterval": e2ePollInterval.String(), "zombies": zombieValues}}},
	}); agentErr != nil {
		return
	}
	if _, agentErr = agent.WaitReady(ctx, shared); agentErr != nil {
		if logs, err := agent.Logs(ctx, shared); err == nil {
			agentErr = fmt.Errorf("%w; agent log:\n%s", agentErr, logs)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "e2e: agent installed (%v) and Ready in %s\n", agent.Objects, time.Since(start).Round(time.Millisecond))
}

// e2ePollInterval is the e2e agent's health poll (and NVML sampling)
// interval.
const e2ePollInterval = 2 * time.Second

// needAgent fails the test when the agent could not be installed.
func needAgent(t *testing.T) *agentdeploy.Agent {
	t.Helper()
	if agentErr != nil {
		t.Fatalf("agent not installed: %v", agentErr)
	}
	return agent
}

// shared is the cluster every test of the package uses.
var shared *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: the single-node cluster needs root (kubelet, containerd, runc)")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := cluster.Up(ctx, cluster.Options{
		Node:       true,
		NodeLabels: nodeLabels,
		Log: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "e2e cluster: "+format+"\n", args...)
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start cluster: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e cluster: up in %s, dir %s\n", time.Since(start).Round(time.Millisecond), c.Dir)
	logVersions(ctx, c)
	shared = c
	installAgent(ctx)
	code := m.Run()
	if code != 0 {
		c.DumpLogs(func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }, 40)
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stop cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// logVersions prints the versions the run used (apiserver, kubelet,
// container runtime), so a log says what was tested.
func logVersions(ctx context.Context, c *cluster.Cluster) {
	if v, err := c.Client.Discovery().ServerVersion(); err == nil {
		fmt.Fprintf(os.Stderr, "e2e cluster: kube-apiserver %s\n", v.GitVersion)
	}
	if n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{}); err == nil {
		fmt.Fprintf(os.Stderr, "e2e cluster: node %s: kubelet %s, runtime %s\n", n.Name, n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion)
	}
}

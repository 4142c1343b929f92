// Command demo-cluster starts the e2e single-node cluster, installs the
// agent's chart (simulated DGX H100 with MIG on two GPUs) and a sample pod
// asking for two GPUs, prints how to look at it and keeps everything
// running until Ctrl-C, then stops it all.
package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

func main() {
	os.Exit(run())
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "demo-cluster: "+format+"\n", args...)
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	upCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := cluster.Up(upCtx, cluster.Options{Node: true, Log: logf})
	if err != nil {
		logf("start cluster: %v", err)
		return 1
	}
	defer func() {
		logf("stopping the cluster")
		if err := c.Stop(); err != nil {
			logf("stop: %v", err)
		}
	}()
	a, err := deploy(upCtx, c)
	if err != nil {
		logf("%v", err)
		logf("cluster left up for inspection: kubeconfig %s, logs in %s; Ctrl-C stops it", c.Kubeconfig, c.LogDir)
		<-ctx.Done()
		return 1
	}
	capacity, _, err := c.NodeResources(upCtx, "nvidia.com/")
	if err != nil {
		logf("%v", err)
	}
	if rdmaCap, _, err := c.NodeResources(upCtx, "rdma/"); err == nil && capacity != nil {
		maps.Copy(capacity, rdmaCap)
	}
	fmt.Printf(`
The cluster is up: one node (%s) running gpu-node-agent as a DaemonSet on a
simulated DGX H100 (MIG on GPUs 0 and 1, --mig-strategy mixed).

  node resources: %s
  sample pod:     default/gpu-sample (nvidia.com/gpu: 2, rdma/ib: 2)
  agent metrics:  http://127.0.0.1:%d/metrics
  sim control:    %s  (e.g. curl -X POST %s/mig -d '{"gpu":1,"profiles":["3g.40gb","3g.40gb"]}')

  export KUBECONFIG=%s
  kubectl get nodes -o jsonpath='{.items[0].status.allocatable}'
  kubectl logs gpu-sample | grep -E 'NVIDIA_VISIBLE_DEVICES|RDMA_DEVICES|^DEVICE'

Component logs are in %s. Ctrl-C stops everything.
`, c.NodeName, cluster.FormatResources(capacity), a.MetricsPort, a.Control.Base, a.Control.Base, c.Kubeconfig, c.LogDir)
	<-ctx.Done()
	return 0
}

// deploy installs the agent and the sample pod and waits for both.
func deploy(ctx context.Context, c *cluster.Cluster) (*agentdeploy.Agent, error) {
	if err := c.ImportAgentImage(ctx, ""); err != nil {
		return nil, fmt.Errorf("import agent image: %w", err)
	}
	if err := c.LoadWorkloadImage(ctx); err != nil {
		return nil, fmt.Errorf("load workload image: %w", err)
	}
	a, err := agentdeploy.Install(ctx, c, agentdeploy.Options{})
	if err != nil {
		return nil, fmt.Errorf("install chart: %w", err)
	}
	logf("chart applied: %s", strings.Join(a.Objects, ", "))
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := a.WaitReady(rctx, c); err != nil {
		logs, _ := a.Logs(ctx, c)
		return a, fmt.Errorf("%w\nagent log:\n%s", err, logs)
	}
	if err := c.WaitNodeResources(rctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
		return a, err
	}
	if err := c.WaitNodeResources(rctx, "rdma/", agentdeploy.DemoRDMA, agentdeploy.DemoRDMA); err != nil {
		return a, err
	}
	logf("agent Ready, node resources registered")
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-sample", Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           cluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					"nvidia.com/gpu": *resource.NewQuantity(2, resource.DecimalSI),
					"rdma/ib":        *resource.NewQuantity(2, resource.DecimalSI),
				}},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return a, fmt.Errorf("create sample pod: %w", err)
	}
	for {
		p, err := c.Client.CoreV1().Pods("default").Get(rctx, "gpu-sample", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			logf("sample pod running")
			return a, nil
		}
		select {
		case <-rctx.Done():
			return a, fmt.Errorf("sample pod not running: %w", rctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

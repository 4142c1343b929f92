package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

const testNamespace = "default"

// workloadOnce imports the workload image once per run.
var workloadOnce = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return shared.LoadWorkloadImage(ctx)
})

// workloadPod is a hostNetwork pod running the workload image (prints its
// environment, then sleeps) with the given extended-resource limits.
func workloadPod(t *testing.T, name string, limits map[string]int64) *corev1.Pod {
	t.Helper()
	return labelledWorkloadPod(t, name, limits, nil)
}

// labelledWorkloadPod is workloadPod with labels.
func labelledWorkloadPod(t *testing.T, name string, limits map[string]int64, labels map[string]string) *corev1.Pod {
	t.Helper()
	if err := workloadOnce(); err != nil {
		t.Fatalf("load workload image: %v", err)
	}
	rl := corev1.ResourceList{}
	for res, n := range limits {
		rl[corev1.ResourceName(res)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace, Labels: labels},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           cluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Resources:       corev1.ResourceRequirements{Limits: rl},
			}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := shared.Client.CoreV1().Pods(testNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
	return created
}

func deletePod(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	zero := int64(0)
	err := shared.Client.CoreV1().Pods(testNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", name, err)
		return
	}
	// Wait until it is gone so its devices are free for the next test.
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := shared.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("pod %s not gone: %v", name, err)
	}
}

// poll calls cond every 250 ms until it returns true, an error, or ctx ends.
func poll(ctx context.Context, cond func(context.Context) (bool, error)) error {
	for {
		ok, err := cond(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitPodRunning waits until the pod's container runs and returns the pod.
func waitPodRunning(t *testing.T, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = shared.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s ended: %s %s", name, pod.Status.Phase, pod.Status.Message)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s not running: %v; status: %s", name, err, podSummary(pod))
	}
	return pod
}

// podSummary is the pod's phase, conditions and container states.
func podSummary(pod *corev1.Pod) string {
	if pod == nil {
		return "<no pod>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s node=%q", pod.Status.Phase, pod.Spec.NodeName)
	for _, c := range pod.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, " %s=waiting(%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, " %s=terminated(%s, exit %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		case cs.State.Running != nil:
			fmt.Fprintf(&b, " %s=running", cs.Name)
		}
	}
	return b.String()
}

// podLog reads the workload's log (through the API server and the
// kubelet, like kubectl logs) once it has printed everything: its
// environment, then its /dev/infiniband nodes.
func podLog(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		raw, err := shared.Client.CoreV1().Pods(testNamespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		logs = string(raw)
		return strings.Contains(logs, "--- end of devices"), nil
	})
	if err != nil {
		t.Fatalf("logs of pod %s: %v; got:\n%s", name, err, logs)
	}
	return logs
}

// podEnv is the workload's printed environment.
func podEnv(t *testing.T, name string) map[string]string {
	t.Helper()
	logs, _, _ := strings.Cut(podLog(t, name), "--- end of environment")
	env := map[string]string{}
	for _, line := range strings.Split(logs, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// TestWorkloadPodRuns checks the harness itself: a pod is scheduled onto
// the node, containerd runs it with runc and its log reaches the API.
func TestWorkloadPodRuns(t *testing.T) {
	workloadPod(t, "plain", nil)
	waitPodRunning(t, "plain", 2*time.Minute)
	env := podEnv(t, "plain")
	if env["HOSTNAME"] == "" {
		t.Errorf("workload environment has no HOSTNAME: %v", env)
	}
}

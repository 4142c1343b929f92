package conformance

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// TestRollingUpdateWithSurge is a node during a DaemonSet rollout that
// surges: the new agent pod starts beside the old one (each with its own
// pod UID, so its own sockets), then the old one stops.
//
// Since 1.37 the kubelet's device manager keeps one endpoint per socket:
// the old agent's disconnect promotes the new one, the devices never
// leave, and a pod is admitted and given devices by the new agent. Before
// 1.37 it keeps one plugin per resource, and the old agent's disconnect
// closes the client it holds, which by then is the new agent's, and marks
// the resource's devices unhealthy until the agent registers again: the
// reason the chart does not surge by default. The test holds both: on an
// older kubelet it checks that the devices do leave, so that the day they
// stop leaving the documentation is updated too.
func TestRollingUpdateWithSurge(t *testing.T) {
	t.Logf("kubelet code: k8s.io/kubernetes %s", kubeletVersion)
	dir := pluginDir(t)
	pods := &admitted{}
	kl := startTopologyKubelet(t, filepath.Join(dir, devicemanager.KubeletSocket), dgxH100Machine(t), "none", "container", pods.active)
	old, _ := startAgent(t, dir, "dgx-h100", "none", "--pod-uid", "0a1d0000-0000-4000-8000-000000000001")
	waitAllocatableGPUs(t, kl, old, 8)
	want := counts(kl.Allocatable())
	t.Logf("old agent serves %s", fmtCounts(want))

	// The new pod's agent: both serve until the old one stops.
	next, _ := startAgent(t, dir, "dgx-h100", "none", "--pod-uid", "0e700000-0000-4000-8000-000000000002")
	waitOutput(t, next, "registered with kubelet", len(want))
	if got := counts(kl.Allocatable()); !maps.Equal(got, want) {
		t.Fatalf("with both agents serving the device manager has %s, want %s", fmtCounts(got), fmtCounts(want))
	}

	// Sample what the device manager offers while the old agent stops.
	stop := make(chan struct{})
	type sample struct {
		at  time.Time
		got map[string]int
	}
	samples := make(chan []sample, 1)
	go func() {
		var out []sample
		last := want
		for {
			got := counts(kl.Allocatable())
			if !maps.Equal(got, last) {
				out = append(out, sample{time.Now(), got})
				last = got
			}
			select {
			case <-stop:
				samples <- out
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	stopped := time.Now()
	if err := old.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !keepsEndpointPerSocket {
		// The kubelet drops the new agent's client: the devices leave.
		deadline := time.Now().Add(waitTimeout)
		for len(kl.Allocatable()["nvidia.com/gpu"]) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("kubelet %s still offers %s after the old agent stopped; it used to drop the new agent's plugin: update \"Rolling updates\" in docs/install.md and the chart", kubeletVersion, fmtCounts(counts(kl.Allocatable())))
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(stop)
		<-samples
		t.Logf("kubelet %s: the old agent stopping took the new agent's devices away (allocatable %s), as documented", kubeletVersion, fmtCounts(counts(kl.Allocatable())))
		return
	}
	waitAllocatableGPUs(t, kl, next, 8)
	// Stay a while: a late disconnect or a second registration would show.
	time.Sleep(time.Second)
	close(stop)
	changes := <-samples
	var gap time.Duration
	var lowest map[string]int
	for i, s := range changes {
		if !maps.Equal(s.got, want) {
			if lowest == nil || s.got["nvidia.com/gpu"] < lowest["nvidia.com/gpu"] {
				lowest = s.got
			}
			end := time.Now()
			if i+1 < len(changes) {
				end = changes[i+1].at
			}
			gap += end.Sub(s.at)
		}
	}
	if got := counts(kl.Allocatable()); !maps.Equal(got, want) {
		t.Fatalf("after the old agent stopped the device manager has %s, want %s (changes: %v)", fmtCounts(got), fmtCounts(want), changes)
	}
	if lowest == nil {
		t.Logf("old agent stopped: allocatable never changed (sampled every 1 ms for %s)", time.Since(stopped).Round(time.Millisecond))
	} else {
		t.Logf("old agent stopped: allocatable fell to %s for %s, then came back", fmtCounts(lowest), gap.Round(time.Millisecond))
	}
	if lowest != nil {
		t.Errorf("kubelet %s keeps an endpoint per socket, yet allocatable fell to %s", kubeletVersion, fmtCounts(lowest))
	}

	// The new agent allocates.
	pod := devicePod("after-rollout", map[string]int{"nvidia.com/gpu": 2})
	if r := pods.admit(kl, pod); !r.Admit {
		t.Fatalf("pod refused after the rollout: %s: %s", r.Reason, r.Message)
	}
	if devs := kl.Devices(string(pod.UID), "main")["nvidia.com/gpu"]; len(devs) != 2 {
		t.Fatalf("pod admitted after the rollout got %v, want 2 GPUs", devs)
	}
	if env, err := kl.Envs(pod, "main"); err != nil || env["NVIDIA_VISIBLE_DEVICES"] == "" {
		t.Errorf("pod after the rollout: NVIDIA_VISIBLE_DEVICES %q (%v), want the new agent's answer", env["NVIDIA_VISIBLE_DEVICES"], err)
	}
}

// waitAllocatableGPUs waits until the device manager offers n
// nvidia.com/gpu.
func waitAllocatableGPUs(t *testing.T, kl topologyKubelet, agent *agentproc.Agent, n int) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for len(kl.Allocatable()["nvidia.com/gpu"]) != n {
		select {
		case <-time.After(5 * time.Millisecond):
		case <-agent.Exited():
			t.Fatalf("agent exited (%v) before the device manager offered %d GPUs", agent.Err(), n)
		case <-deadline:
			t.Fatalf("device manager offers %s, want %d nvidia.com/gpu", fmtCounts(counts(kl.Allocatable())), n)
		}
	}
}

// waitOutput waits until the agent printed line at least n times.
func waitOutput(t *testing.T, agent *agentproc.Agent, line string, n int) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for strings.Count(agent.Output(), line) < n {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-agent.Exited():
			t.Fatalf("agent exited (%v) before printing %q %d times", agent.Err(), line, n)
		case <-deadline:
			t.Fatalf("agent printed %q %d times, want %d", line, strings.Count(agent.Output(), line), n)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// onDemandGPU is the demo node's GPU that TestDRAMIGOnDemand puts in MIG
// mode with no MIG device (GPUs 0 and 1 are in MIG mode with every slice
// used).
const onDemandGPU = 2

// TestDRAMIGOnDemand serves the demo node through DRA with dra.migOnDemand
// and a GPU put in MIG mode with no MIG device, and checks on the real
// scheduler, kubelet and containerd:
//
//   - the GPU is published as partitionable devices: its counter set
//     (memory slices and engines) and a device per placement of every
//     profile, none of the busy MIG GPUs' placements, and not the GPU whole;
//   - an unchanged pod asking for nvidia.com/mig-4g.40gb: 1 gets the 4g
//     placement: its MIG device is made on that GPU (the simulator lists
//     it) and is the one in the container;
//   - a pod asking for nvidia.com/mig-7g.80gb: 1 is not scheduled while
//     the 4g device holds half the slices (the scheduler counts them);
//   - deleting the first pod destroys its MIG device, after which the
//     second pod is scheduled and gets a 7g device made for it, destroyed
//     in turn when it ends.
func TestDRAMIGOnDemand(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	requireNoDevicePluginPods(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	defaults := a.Options
	// Registered first, so it runs last: after the pods' cleanups and the
	// GPU's MIG mode is off again.
	t.Cleanup(func() { restoreDeviceplugin(t, a, defaults) })
	opts := defaults
	opts.DRA = draKinds
	opts.Values = cloneValues(defaults.Values)
	opts.Values["dra"] = map[string]any{"migOnDemand": true}
	start := time.Now()
	if _, err := a.Reinstall(ctx, shared, opts); err != nil {
		t.Fatalf("reinstall the agent with DRA and MIG on demand: %v\nagent log:\n%s", err, agentLog(a))
	}
	// The simulated node lives in the agent's pod: MIG mode goes on in
	// the new one, as an operator's nvidia-smi -mig 1 would.
	if err := a.Control.EnableMIG(ctx, onDemandGPU); err != nil {
		t.Fatalf("MIG mode on GPU %d: %v", onDemandGPU, err)
	}
	t.Cleanup(func() { migModeOff(t, a) })
	const (
		place4g = "4g.40gb"
		place7g = "7g.80gb"
	)
	dev4g := dra.PlacementName(onDemandGPU, place4g, 0)
	dev7g := dra.PlacementName(onDemandGPU, place7g, 0)
	devs := waitSliceDevices(ctx, t, "the DRA install with MIG on demand", func(devs map[string]resourcev1.Device) error {
		for _, d := range []string{dev4g, dev7g} {
			if _, ok := devs[d]; !ok {
				return fmt.Errorf("%s not published", d)
			}
		}
		if _, ok := devs[dra.GPUName(onDemandGPU)]; ok {
			return fmt.Errorf("%s is in MIG mode and still published whole", dra.GPUName(onDemandGPU))
		}
		return nil
	})
	var placements []string
	for name := range devs {
		if strings.Contains(name, "-at-") {
			placements = append(placements, name)
			if !strings.HasPrefix(name, dra.GPUName(onDemandGPU)+"-") {
				t.Errorf("placement %s published on a GPU whose slices are all used", name)
			}
		}
	}
	sets := counterSets(ctx, t)
	set, ok := sets[dra.CounterSetName(onDemandGPU)]
	if !ok {
		t.Fatalf("counter sets %v lack %s", slices.Sorted(maps.Keys(sets)), dra.CounterSetName(onDemandGPU))
	}
	t.Logf("agent reinstalled with MIG on demand after %s: GPU %d published as %d placements %v and counter set %s %s",
		time.Since(start).Round(time.Millisecond), onDemandGPU, len(placements), slices.Sorted(slices.Values(placements)),
		dra.CounterSetName(onDemandGPU), counterSummary(set))
	if c := devs[dev4g].ConsumesCounters; len(c) != 1 || c[0].CounterSet != dra.CounterSetName(onDemandGPU) || len(c[0].Counters) == 0 {
		t.Errorf("%s consumes %+v, want counters of %s", dev4g, c, dra.CounterSetName(onDemandGPU))
	}

	// (1) A 4g.40gb device made for an unchanged pod.
	const pod4g, pod7g = "mig-on-demand-4g", "mig-on-demand-7g"
	t0 := time.Now()
	workloadPod(t, pod4g, map[string]int64{"nvidia.com/mig-" + place4g: 1})
	p := waitPodRunning(t, pod4g, 3*time.Minute)
	ran := time.Since(t0)
	if got := claimDevices(ctx, t, p); !slices.Equal(got, []string{dev4g}) {
		t.Fatalf("pod %s was allocated %v, want %s", pod4g, got, dev4g)
	}
	made := gpuMIG(t, a, onDemandGPU)
	if len(made) != 1 || made[0].Profile != place4g || made[0].Placement.Start != 0 {
		t.Fatalf("GPU %d has MIG devices %+v, want one %s at slice 0", onDemandGPU, made, place4g)
	}
	if env := podEnv(t, pod4g)["NVIDIA_VISIBLE_DEVICES"]; env != made[0].UUID {
		t.Errorf("pod %s sees NVIDIA_VISIBLE_DEVICES=%q, want the made %s", pod4g, env, made[0].UUID)
	}
	t.Logf("pod %s Running %s after creation with %s, made as %s (GI %d, CI %d)", pod4g, ran.Round(time.Millisecond),
		dev4g, made[0].UUID, made[0].GPUInstance, made[0].ComputeInstance)

	// (2) The 7g placement overlaps the made 4g one: not schedulable.
	workloadPod(t, pod7g, map[string]int64{"nvidia.com/mig-" + place7g: 1})
	uctx, ucancel := context.WithTimeout(ctx, time.Minute)
	pending, err := waitUnschedulable(uctx, pod7g)
	ucancel()
	if err != nil {
		t.Fatalf("pod %s with the slices taken: %v (%s)", pod7g, err, podSummary(pending))
	}
	t.Logf("pod %s unschedulable while %s holds slices 0-3: %s", pod7g, dev4g, podSummary(pending))

	// (3) The 4g pod ends: its MIG device is destroyed, and the 7g pod
	// gets the whole GPU's placement.
	t1 := time.Now()
	deletePod(t, pod4g)
	gone := waitGPUMIG(ctx, t, a, func(ms []topology.MIGDevice) bool {
		return !slices.ContainsFunc(ms, func(m topology.MIGDevice) bool { return m.UUID == made[0].UUID })
	}, "the 4g device destroyed")
	t.Logf("MIG device %s destroyed %s after its pod's deletion began", made[0].UUID, gone.Sub(t1).Round(time.Millisecond))
	p = waitPodRunning(t, pod7g, 3*time.Minute)
	t.Logf("pod %s Running %s after the 4g pod's deletion began", pod7g, time.Since(t1).Round(time.Millisecond))
	if got := claimDevices(ctx, t, p); !slices.Equal(got, []string{dev7g}) {
		t.Fatalf("pod %s was allocated %v, want %s", pod7g, got, dev7g)
	}
	made = gpuMIG(t, a, onDemandGPU)
	if len(made) != 1 || made[0].Profile != place7g {
		t.Fatalf("GPU %d has MIG devices %+v, want one %s", onDemandGPU, made, place7g)
	}
	if env := podEnv(t, pod7g)["NVIDIA_VISIBLE_DEVICES"]; env != made[0].UUID {
		t.Errorf("pod %s sees NVIDIA_VISIBLE_DEVICES=%q, want the made %s", pod7g, env, made[0].UUID)
	}
	t2 := time.Now()
	deletePod(t, pod7g)
	gone = waitGPUMIG(ctx, t, a, func(ms []topology.MIGDevice) bool { return len(ms) == 0 }, "the 7g device destroyed")
	t.Logf("MIG device %s destroyed %s after its pod's deletion began; GPU %d has no MIG device", made[0].UUID, gone.Sub(t2).Round(time.Millisecond), onDemandGPU)
}

// migModeOff turns MIG off on onDemandGPU again (the demo layout) once
// the kubelet has unprepared what was made on it: the simulator refuses a
// layout change while a GPU has processes, and the MIG devices made for
// the pods go when their claims are unprepared.
func migModeOff(t *testing.T, a *agentdeploy.Agent) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitGPUMIG(ctx, t, a, func(ms []topology.MIGDevice) bool { return len(ms) == 0 }, "the made MIG devices gone before MIG mode goes off")
	if err := a.Control.SetMIG(ctx, onDemandGPU, nil); err != nil {
		t.Errorf("MIG mode off on GPU %d: %v", onDemandGPU, err)
	}
}

// cloneValues copies the top level of chart values, so that setting a key
// leaves the defaults alone.
func cloneValues(v map[string]any) map[string]any {
	out := make(map[string]any, len(v)+1)
	for k, x := range v {
		out[k] = x
	}
	return out
}

// counterSets are the counter sets of the node's pool, by name.
func counterSets(ctx context.Context, t *testing.T) map[string]resourcev1.CounterSet {
	t.Helper()
	list, err := listSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourcev1.CounterSet{}
	for _, s := range list {
		for _, c := range s.Spec.SharedCounters {
			out[c.Name] = c
		}
	}
	return out
}

func counterSummary(c resourcev1.CounterSet) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c.Counters)) {
		v := c.Counters[k].Value
		parts = append(parts, k+"="+v.String())
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// claimDevices are the devices of the pod's extended-resource claim.
func claimDevices(ctx context.Context, t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	st := p.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("pod %s runs without an extended-resource claim", p.Name)
	}
	var out []string
	for _, r := range getClaim(ctx, t, st.ResourceClaimName).Status.Allocation.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

// gpuMIG are the MIG devices the simulator lists on GPU index.
func gpuMIG(t *testing.T, a *agentdeploy.Agent, index int) []topology.MIGDevice {
	t.Helper()
	for _, g := range simTopology(t, a).GPUs {
		if g.Index == index {
			return g.MIG
		}
	}
	t.Fatalf("the simulated node has no GPU %d", index)
	return nil
}

// waitGPUMIG waits until the MIG devices of onDemandGPU satisfy ok and
// returns when they first did.
func waitGPUMIG(ctx context.Context, t *testing.T, a *agentdeploy.Agent, ok func([]topology.MIGDevice) bool, what string) time.Time {
	t.Helper()
	var last []topology.MIGDevice
	err := poll(ctx, func(context.Context) (bool, error) {
		last = gpuMIG(t, a, onDemandGPU)
		return ok(last), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; GPU %d has %+v", what, err, onDemandGPU, last)
	}
	return time.Now()
}

// waitUnschedulable waits until the scheduler reports pod name
// unschedulable and returns it.
func waitUnschedulable(ctx context.Context, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if pod, err = shared.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		if pod.Spec.NodeName != "" {
			return false, fmt.Errorf("scheduled to %s", pod.Spec.NodeName)
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	return pod, err
}

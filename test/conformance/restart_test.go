package conformance

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// restartBound is a generous bound on re-registration after a kubelet
// restart (the agent's goal is 1 s); the measured times go to the log.
const restartBound = 10 * time.Second

var demoMixedCounts = map[string]int{
	"nvidia.com/gpu": 6, "nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-1g.10gb": 9,
}

// TestKubeletRestart restarts the kubelet's registration server 20 times
// the way a kubelet restart looks to a plugin (kubelet.sock removed, the
// plugin directory cleaned of sockets, a new kubelet.sock) and checks that
// every resource registers again with its full device list each time.
func TestKubeletRestart(t *testing.T) {
	n := startNode(t, demoNode, "mixed")
	n.waitCounts(t, demoMixedCounts)

	const restarts = 20
	var times []time.Duration
	for i := 0; i < restarts; i++ {
		if err := n.kubelet.Stop(); err != nil {
			t.Fatalf("restart %d: stop: %v", i, err)
		}
		start := time.Now()
		if err := n.kubelet.Serve(); err != nil {
			t.Fatalf("restart %d: serve: %v", i, err)
		}
		gen := n.kubelet.Generation()
		ctx, cancel := context.WithTimeout(context.Background(), restartBound)
		var last map[string]int
		_, err := n.kubelet.WaitFor(ctx, func(p map[string]devicemanager.Plugin) bool {
			last = counts(served(p, gen))
			return maps.Equal(last, demoMixedCounts)
		})
		cancel()
		if err != nil {
			t.Fatalf("restart %d: resources not re-registered within %s: served %s, want %s",
				i, restartBound, fmtCounts(last), fmtCounts(demoMixedCounts))
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	t.Logf("re-registration after kubelet restart, %d restarts, all %d resources: median %s, max %s, min %s",
		restarts, len(demoMixedCounts), times[len(times)/2].Round(time.Microsecond),
		times[len(times)-1].Round(time.Microsecond), times[0].Round(time.Microsecond))
}

// TestMIGChange changes MIG layouts through the simulator's control
// endpoint while the agent runs: the kubelet must see resources appear,
// disappear and change their device lists without an agent restart.
func TestMIGChange(t *testing.T) {
	n := startNode(t, demoNode, "mixed")
	before := n.waitCounts(t, demoMixedCounts)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	steps := []struct {
		name     string
		gpu      int
		profiles []string
		want     map[string]int
	}{
		{"GPU 1 to two 3g.40gb", 1, []string{"3g.40gb", "3g.40gb"}, map[string]int{
			"nvidia.com/gpu": 6, "nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-1g.10gb": 2,
		}},
		{"MIG off on GPU 0", 0, []string{}, map[string]int{
			"nvidia.com/gpu": 7, "nvidia.com/mig-3g.40gb": 2,
		}},
		{"MIG on GPU 7", 7, []string{"7g.80gb"}, map[string]int{
			"nvidia.com/gpu": 6, "nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-7g.80gb": 1,
		}},
	}
	for _, s := range steps {
		if err := n.control.SetMIG(ctx, s.gpu, s.profiles); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := n.waitCounts(t, s.want)
		t.Logf("%s: served %s", s.name, fmtCounts(counts(got)))
	}

	// The GPU device list follows the layout: GPU 0 came back whole, GPU 7
	// left; the new MIG devices are not the old ones.
	after := served(n.kubelet.Plugins(), n.kubelet.Generation())
	st := n.state(t)
	if !slices.Contains(ids(after["nvidia.com/gpu"]), st.GPUs[0].UUID) {
		t.Errorf("GPU 0 (%s) not served whole after MIG was turned off", st.GPUs[0].UUID)
	}
	if slices.Contains(ids(after["nvidia.com/gpu"]), st.GPUs[7].UUID) {
		t.Errorf("GPU 7 (%s) still served whole with MIG on", st.GPUs[7].UUID)
	}
	old := map[string]bool{}
	for _, id := range ids(before["nvidia.com/mig-3g.40gb"]) {
		old[id] = true
	}
	fresh := 0
	for _, id := range ids(after["nvidia.com/mig-3g.40gb"]) {
		if !old[id] {
			fresh++
		}
	}
	if fresh != 2 {
		t.Errorf("mig-3g.40gb: %d devices are new after re-partitioning GPU 1, want 2", fresh)
	}

	// A bad layout is refused by the control endpoint and changes nothing.
	if err := n.control.SetMIG(ctx, 3, []string{"9g.999gb"}); err == nil {
		t.Errorf("simulator accepted an unknown MIG profile")
	}
	n.waitCounts(t, steps[len(steps)-1].want)
}

package health

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

// simMonitor runs a monitor on a simulated DGX H100 (MIG on GPU 1) with a
// short poll interval and recovery period, on clk when it is not nil.
func simMonitor(t testing.TB, recovery time.Duration, clk *clocktesting.FakeClock) (*sim.Node, *Monitor) {
	t.Helper()
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(1, "3g.40gb", "3g.40gb"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMonitor(Config{PollInterval: 100 * time.Millisecond, RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery, MIGDevicesServed: true,
		DCGMMode: DCGMOff}, nvmlowner.New(node.NVML(), nvmlowner.Config{CallTimeout: 500 * time.Millisecond}, discard()), discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.eventWait = 20 * time.Millisecond
	if clk != nil {
		m.clock = clk
	}
	m.SetNode(node.Spec())
	lib := node.NVML()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("simulated nvml init: %v", ret)
	}
	sampler := attachSampler(t, m, node.Spec(), 100*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.Run(ctx) })
	wg.Go(func() { _ = sampler.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	// Wait for the first poll and the event set.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fit, _ := m.NodeFit(); fit && eventsRegistered(m) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("monitor never settled on the simulated node")
		}
		time.Sleep(time.Millisecond)
	}
	// NodeFit is true before any poll has run, so the loop above does not
	// prove one did: run one to completion here, so the polled checks have
	// their baselines (an NVLink is only watched once seen up) before a
	// test injects a fault.
	m.pollOnce()
	return node, m
}

// eventsRegistered says the watcher has its event set registered.
func eventsRegistered(m *Monitor) bool { return m.Listening() }

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSimFaults injects every simulated fault kind into a running monitor
// and clears it again.
func TestSimFaults(t *testing.T) {
	tests := []struct {
		name      string
		fault     string
		unhealthy []string // device indexes/IDs resolved below: "gpu2", "mig1-0", "all"
		reason    string
		// reset is the gpu a reset-class fault is held on: it must
		// outlast the recovery period, and a simulated GPU reset (not a
		// DELETE) ends it.
		reset string
	}{
		// XIDs whose fault ends after the recovery period (NVLink class):
		// reset-class ones are held until a reset (xid_test.go).
		{"xid 74", `{"kind":"xid","gpu":2,"xid":74}`, []string{"gpu2"}, "xid", ""},
		{"xid on a MIG device", `{"kind":"xid","gpu":1,"xid":74,"mig":"MIG0"}`, []string{"mig1-0"}, "xid", ""},
		{"ecc-dbe", `{"kind":"ecc-dbe","gpu":2}`, []string{"gpu2"}, "", ""},
		{"row-remap-pending", `{"kind":"row-remap-pending","gpu":2}`, []string{"gpu2"}, "row-remap", ""},
		{"row-remap-failure", `{"kind":"row-remap-failure","gpu":2}`, []string{"gpu2"}, "row-remap", ""},
		{"fabric-not-ready", `{"kind":"fabric-not-ready","gpu":3}`, []string{"gpu3"}, "fabric-not-ready", ""},
		{"hung gpu", `{"kind":"hang","gpu":4}`, []string{"gpu4"}, "nvml-timeout", ""},
		{"gpu missing from nvml", `{"kind":"gpu-missing","gpu":5}`, []string{"gpu5"}, "gpu-lost", ""},
		{"xid 79 on a MIG device holds the whole gpu until reset", `{"kind":"xid","gpu":1,"xid":79,"mig":"MIG0"}`, []string{"gpu1", "mig1-0", "mig1-1"}, "xid", "1"},
		{"xid 48 holds until reset", `{"kind":"xid","gpu":6,"xid":48}`, []string{"gpu6"}, "xid", "6"},
		{"gpu-lost", `{"kind":"gpu-lost","gpu":2}`, []string{"gpu2"}, "", ""},
		{"nvlink-down", `{"kind":"nvlink-down","gpu":2,"link":3}`, []string{"gpu2"}, "nvlink", ""},
		{"nvml-failure", `{"kind":"nvml-failure","gpu":0}`, []string{"all"}, "nvml", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node, m := simMonitor(t, 300*time.Millisecond, nil)
			spec := node.Spec()
			migs := spec.GPUs[1].MIG
			resolve := func(s string) []string {
				if i, err := strconv.Atoi(strings.TrimPrefix(s, "gpu")); err == nil {
					return []string{spec.GPUs[i].UUID}
				}
				switch s {
				case "mig1-0":
					return []string{migs[0].UUID}
				case "mig1-1":
					return []string{migs[1].UUID}
				}
				all := []string{NodeID}
				for _, g := range spec.GPUs {
					all = append(all, g.UUID)
					for _, mg := range g.MIG {
						all = append(all, mg.UUID)
					}
				}
				return all
			}
			var want []string
			for _, s := range tc.unhealthy {
				want = append(want, resolve(s)...)
			}
			body := strings.Replace(tc.fault, "MIG0", migs[0].UUID, 1)
			simtest.Fault(t, node, "POST", body)
			waitUntil(t, "devices unhealthy", func() bool {
				for _, id := range want {
					if m.Healthy(id) {
						return false
					}
				}
				return true
			})
			for id, st := range m.Snapshot() {
				if !st.Healthy && !slices.Contains(want, id) {
					t.Errorf("%s unhealthy too: %v", id, st.Reasons)
				}
			}
			reason := tc.reason
			if tc.reset != "" {
				// A reset-class XID makes the driver ask for a reset too
				// (its recovery action, read by the sample the XID asks
				// for at once): two causes, so the reason is multiple.
				gpu := resolve("gpu" + tc.reset)[0]
				// Both may come first: the sampler can read the request
				// before the event watcher hands over the XID.
				waitUntil(t, "the xid and the driver's reset request", func() bool {
					r := strings.Join(m.Status(gpu).Reasons, " ")
					return strings.Contains(r, "driver requests a gpu reset") && strings.Contains(r, "xid ")
				})
				reason = "multiple"
			}
			if f := m.Fitness(); f.Fit || (reason != "" && f.Reason != reason) {
				t.Errorf("fitness %+v, want unfit with reason %q", f, reason)
			}
			// A fault held until a reset (a DBE event, a lost GPU) is
			// released by reset evidence in the samples: let one sample
			// see the fault before it is cleared.
			m.pollOnce()
			if tc.reset != "" {
				// Held: still unhealthy three sampling cycles (each
				// longer than the recovery period) later.
				seq := m.sampler.Latest().Seq
				waitUntil(t, "three more samples", func() bool { return m.sampler.Latest().Seq >= seq+3 })
				m.evaluate()
				if fit, _ := m.NodeFit(); fit {
					t.Fatal("a reset-class fault recovered without a reset")
				}
				simtest.Fault(t, node, "POST", `{"kind":"gpu-reset","gpu":`+tc.reset+`}`)
			} else {
				simtest.Fault(t, node, "DELETE", body)
			}
			waitUntil(t, "recovery", func() bool { fit, _ := m.NodeFit(); return fit })
			for _, id := range want {
				if !m.Healthy(id) {
					t.Errorf("%s still unhealthy after recovery", id)
				}
			}
		})
	}
}

// TestSimFaultLatency measures fault injected in the simulator -> the
// monitor's Changes signal with the device unhealthy, for XIDs (event
// driven) and a polled fault. Numbers are logged, not asserted:
//
//	go test -race -run TestSimFaultLatency -v ./health/
func TestSimFaultLatency(t *testing.T) {
	for _, tc := range []struct {
		name, inject, clear string
	}{
		{"xid (event)", `{"kind":"xid","gpu":GPU,"xid":74}`, ""},
		{"row-remap-pending (poll 100ms)", `{"kind":"row-remap-pending","gpu":GPU}`, `{"kind":"row-remap-pending","gpu":GPU}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An XID's fault is over once its recovery period passes: a
			// fake clock keeps it from ending before it is measured.
			// Polled faults last until cleared, and need a ticking clock.
			var clk *clocktesting.FakeClock
			if tc.clear == "" {
				clk = clocktesting.NewFakeClock(time.Now())
			}
			node, m := simMonitor(t, 20*time.Millisecond, clk)
			spec := node.Spec()
			changes := m.Changes()
			var lat []time.Duration
			for i := range 24 {
				gpu := []int{0, 2, 3, 4, 5, 6, 7}[i%7]
				id := spec.GPUs[gpu].UUID
				drainSignal(changes)
				g := strconv.Itoa(gpu)
				start := time.Now()
				simtest.Fault(t, node, "POST", strings.ReplaceAll(tc.inject, "GPU", g))
				// Bounded: a fault that never registers fails the test
				// instead of hanging it until the go test timeout.
				deadline := time.After(10 * time.Second)
				for m.Healthy(id) {
					select {
					case <-changes:
					case <-deadline:
						t.Fatalf("injection %d: %s still healthy 10s after %s", i, id, strings.ReplaceAll(tc.inject, "GPU", g))
					}
				}
				lat = append(lat, time.Since(start))
				if tc.clear != "" {
					simtest.Fault(t, node, "DELETE", strings.ReplaceAll(tc.clear, "GPU", g))
				} else {
					clk.Step(20 * time.Millisecond)
					m.evaluate()
				}
				waitUntil(t, "healthy again", func() bool { fit, _ := m.NodeFit(); return fit })
			}
			p50, p99 := percentile(lat, 0.5), percentile(lat, 0.99)
			t.Logf("fault -> Changes()+Healthy=false over %d injections: median %v, p99 %v, max %v", len(lat), p50, p99, slices.Max(lat))
		})
	}
}

func drainSignal(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

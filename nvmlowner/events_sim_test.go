package nvmlowner

import (
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

// simNode is a simulated DGX H100.
func simNode(t *testing.T) (*sim.Node, []string) {
	t.Helper()
	spec, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, g := range n.Spec().GPUs {
		uuids = append(uuids, g.UUID)
	}
	return n, uuids
}

// TestEventWatcherSimRescans: 1,000 rescans with the same GPUs while XIDs
// arrive: one event set, every XID delivered to the right GPU.
func TestEventWatcherSimRescans(t *testing.T) {
	n, uuids := simNode(t)
	w := startWatcher(t, n.NVML(), uuids...)
	w.ready(t)
	const rescans, bursts, burst = 1000, 10, 50 // bursts stay below the simulator's 256-event queue
	kick := make(chan struct{}, bursts)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rescans {
			w.w.SetGPUs(uuids)
			if i%(rescans/bursts) == 0 {
				kick <- struct{}{}
			}
		}
	})
	want := map[string]int{}
	for range bursts {
		<-kick
		for i := range burst {
			g := i % len(uuids)
			simtest.Fault(t, n, http.MethodPost, `{"kind":"xid","gpu":`+strconv.Itoa(g)+`,"xid":13}`)
			want[uuids[g]]++
		}
		// Drain each burst before the next, so the queue never fills.
		for range burst {
			e := bounded(t, "xid", w.events)
			want[e.UUID]--
		}
	}
	wg.Wait()
	for u, c := range want {
		if c != 0 {
			t.Errorf("%s: %d XIDs not delivered (negative: extra)", u, c)
		}
	}
	if got := n.NVMLCalls()["EventSetCreate"]; got != 1 {
		t.Errorf("EventSetCreate called %d times over %d rescans, want 1", got, rescans)
	}
	w.noFaults(t)
}

// TestEventWatcherSimGPUSetChanges: GPUs that appear are registered on the
// kept set; a GPU that left has its events dropped.
func TestEventWatcherSimGPUSetChanges(t *testing.T) {
	n, uuids := simNode(t)
	w := startWatcher(t, n.NVML(), uuids[:4]...)
	w.ready(t)
	w.w.SetGPUs(uuids)
	w.ready(t)
	simtest.Fault(t, n, http.MethodPost, `{"kind":"xid","gpu":6,"xid":79}`)
	if e := bounded(t, "event", w.events); e.UUID != uuids[6] || e.Data != 79 {
		t.Fatalf("event %+v, want xid 79 on %s", e, uuids[6])
	}
	w.w.SetGPUs(append(uuids[:2:2], uuids[3:]...)) // GPU 2 leaves
	w.ready(t)
	simtest.Fault(t, n, http.MethodPost, `{"kind":"xid","gpu":2,"xid":79}`)
	simtest.Fault(t, n, http.MethodPost, `{"kind":"xid","gpu":3,"xid":48}`)
	if e := bounded(t, "event", w.events); e.UUID != uuids[3] || e.Data != 48 {
		t.Fatalf("event %+v, want GPU 2's dropped and GPU 3's xid 48", e)
	}
	if got := n.NVMLCalls()["EventSetCreate"]; got != 1 {
		t.Errorf("EventSetCreate called %d times, want 1", got)
	}
	w.noFaults(t)
}

// TestEventWatcherSimNoDevice: an XID the simulator raises without a
// device (the NULL handle, as NVML does) arrives with an empty UUID.
func TestEventWatcherSimNoDevice(t *testing.T) {
	n, uuids := simNode(t)
	w := startWatcher(t, n.NVML(), uuids...)
	w.ready(t)
	simtest.Fault(t, n, http.MethodPost, `{"kind":"xid","gpu":-1,"xid":79}`)
	if e := bounded(t, "event", w.events); e.UUID != "" || e.Data != 79 {
		t.Fatalf("event %+v, want xid 79 without a device", e)
	}
}

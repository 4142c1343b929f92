package rdma

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
)

type counterObs struct {
	id, cause string
	bad       bool
	reason    string
}

// counterRig is a one-port InfiniBand HCA with counters, a fake clock and
// the check over them; tests call poll themselves.
type counterRig struct {
	t    *testing.T
	root string
	clk  *clocktesting.FakeClock
	c    *PortCounters
	obs  []counterObs
}

func zeroCounters() map[string]uint64 {
	m := map[string]uint64{}
	for _, n := range fakesys.PortCounterNames {
		m[n] = 0
	}
	return m
}

func newCounterRig(t *testing.T, cfg PortCountersConfig) *counterRig {
	t.Helper()
	root := t.TempDir()
	tree := fakesys.Tree{HCAs: []fakesys.HCA{{
		Name: "mlx5_0", PCIPath: []string{"0000:00:01.0", "0000:03:00.0"},
		Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core",
		NetDevs: []fakesys.NetDev{{Name: "ib0"}},
		Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", Counters: zeroCounters()}},
	}}}
	if err := fakesys.Write(root, tree); err != nil {
		t.Fatal(err)
	}
	devs, err := Discover(context.Background(), DiscoverOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	r := &counterRig{t: t, root: root, clk: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	r.c, err = NewPortCounters(PortCountersOptions{Root: root, Devices: devs, Config: cfg, Hostname: "node-a", Clock: r.clk,
		Observe: func(id, cause string, bad bool, reason string) {
			r.obs = append(r.obs, counterObs{id, cause, bad, reason})
		}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *counterRig) add(name string, delta uint64) {
	r.t.Helper()
	if _, err := fakesys.AddPortCounter(r.root, "mlx5_0", 1, name, delta); err != nil {
		r.t.Fatal(err)
	}
}

func (r *counterRig) set(name string, v uint64) {
	r.t.Helper()
	if err := fakesys.SetPortCounter(r.root, "mlx5_0", 1, name, v); err != nil {
		r.t.Fatal(err)
	}
}

// step advances the clock by d and polls.
func (r *counterRig) step(d time.Duration) {
	r.clk.Step(d)
	r.c.poll()
}

// take returns the observations since the last take.
func (r *counterRig) take() []counterObs {
	o := r.obs
	r.obs = nil
	return o
}

// changes returns the causes reported bad (true) or cleared (false) in obs.
func changes(obs []counterObs) map[string]bool {
	m := map[string]bool{}
	for _, o := range obs {
		m[o.cause] = o.bad
	}
	return m
}

var testCounterConfig = PortCountersConfig{
	Interval:       Duration(10 * time.Second),
	RateWindow:     Duration(time.Minute),
	FlapWindow:     Duration(5 * time.Minute),
	FlapThreshold:  3,
	RecoveryPeriod: Duration(2 * time.Minute),
}

func TestPortCountersFirstPollClearsEveryCause(t *testing.T) {
	r := newCounterRig(t, testCounterConfig)
	r.c.poll()
	got := r.take()
	want := len(rateCounterNames()) + 1 // flap
	if len(got) != want {
		t.Fatalf("first poll: %d observations, want %d: %+v", len(got), want, got)
	}
	for _, o := range got {
		if o.bad || o.id != "mlx5_0" {
			t.Errorf("first poll: %+v, want mlx5_0 cleared", o)
		}
	}
	r.step(10 * time.Second)
	if got := r.take(); len(got) != 0 {
		t.Errorf("quiet poll reported %+v", got)
	}
}

func TestPortCountersFlappingPortMarkedAndRecovered(t *testing.T) {
	for _, tc := range []struct {
		name string
		// down makes one link down: link_downed, the watcher's state, or both.
		down func(r *counterRig)
		// clearAfter is how long after the poll that marked the port it
		// clears: the recovery period from the last down, which the
		// watcher reports when it happens (10s before that poll) and a
		// counter when the poll reads it.
		clearAfter time.Duration
	}{
		{"link_downed", func(r *counterRig) { r.add("link_downed", 1) }, 2 * time.Minute},
		{"watcher state", func(r *counterRig) { r.c.NoteState("mlx5_0", false); r.c.NoteState("mlx5_0", true) }, 2*time.Minute - 10*time.Second},
		{"both, counted once", func(r *counterRig) {
			r.add("link_downed", 1)
			r.c.NoteState("mlx5_0", false)
			r.c.NoteState("mlx5_0", true)
		}, 2 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newCounterRig(t, testCounterConfig)
			r.c.NoteState("mlx5_0", true) // the watcher's first report
			r.c.poll()
			r.take()
			for i := range 2 {
				tc.down(r)
				r.step(10 * time.Second)
				if got := changes(r.take()); got[CauseFlap] {
					t.Fatalf("marked flapping after %d downs, threshold 3", i+1)
				}
			}
			tc.down(r)
			r.step(10 * time.Second)
			obs := r.take()
			if len(obs) != 1 || obs[0].cause != CauseFlap || !obs[0].bad {
				t.Fatalf("third down: %+v, want flap bad", obs)
			}
			if !strings.Contains(obs[0].reason, "3 link downs") {
				t.Errorf("reason %q does not count 3 link downs", obs[0].reason)
			}
			// Quiet: bad until the recovery period has passed.
			var cleared time.Duration
			for waited := 10 * time.Second; waited <= 10*time.Minute; waited += 10 * time.Second {
				r.step(10 * time.Second)
				if got := r.take(); len(got) > 0 {
					if len(got) != 1 || got[0].cause != CauseFlap || got[0].bad {
						t.Fatalf("while quiet: %+v", got)
					}
					cleared = waited
					break
				}
			}
			if cleared != tc.clearAfter {
				t.Errorf("flap cleared %s after it was marked, want %s (the recovery period after the last down)", cleared, tc.clearAfter)
			}
			// Downs before the clear do not count again: one more is not a flap.
			tc.down(r)
			r.step(10 * time.Second)
			if got := changes(r.take()); got[CauseFlap] {
				t.Error("one down after recovery marked the port flapping again")
			}
		})
	}
}

func TestPortCountersFlapKeepsPortUnhealthyWhileItGoesOn(t *testing.T) {
	r := newCounterRig(t, testCounterConfig)
	r.c.poll()
	r.take()
	r.add("link_downed", 3)
	r.step(10 * time.Second)
	if got := changes(r.take()); !got[CauseFlap] {
		t.Fatal("three downs in one poll not marked")
	}
	// One down a minute: under the threshold, but not quiet.
	for range 5 {
		r.step(time.Minute)
		r.add("link_downed", 1)
		r.step(10 * time.Second)
		if got := r.take(); len(got) > 0 && !got[0].bad {
			t.Fatalf("cleared while the link still went down: %+v", got)
		}
	}
}

func TestPortCountersErrorRate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		counter string
		perPoll uint64 // every 10s; the rate window is 1m
		cfg     map[string]float64
		want    string // cause marked, "" for none
	}{
		{"symbol errors under threshold", "symbol_error", 1, nil, ""},                                // 6/min < 10/min
		{"symbol errors at threshold", "symbol_error", 1, map[string]float64{"symbol_error": 6}, ""}, // 6/min
		{"symbol errors over threshold", "symbol_error", 2, nil, "symbol-errors"},                    // 12/min
		{"receive errors over threshold", "port_rcv_errors", 5, nil, "receive-errors"},
		{"threshold raised", "symbol_error", 2, map[string]float64{"symbol_error": 100}, ""},
		{"check off", "symbol_error", 50, map[string]float64{"symbol_error": 0}, ""},
		{"transmit discards off by default", "port_xmit_discards", 50, nil, ""},
		{"transmit discards on", "port_xmit_discards", 50, map[string]float64{"port_xmit_discards": 10}, "transmit-discards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testCounterConfig
			cfg.ErrorRateThresholds = tc.cfg
			r := newCounterRig(t, cfg)
			r.c.poll()
			r.take()
			var marked []string
			for range 12 { // two rate windows
				r.add(tc.counter, tc.perPoll)
				r.step(10 * time.Second)
				for c, bad := range changes(r.take()) {
					if bad {
						marked = append(marked, c)
					}
				}
			}
			switch {
			case tc.want == "" && len(marked) > 0:
				t.Errorf("marked %v, want nothing", marked)
			case tc.want != "" && (len(marked) != 1 || marked[0] != tc.want):
				t.Errorf("marked %v, want [%s]", marked, tc.want)
			}
		})
	}
}

func TestPortCountersErrorRateRecovers(t *testing.T) {
	r := newCounterRig(t, testCounterConfig)
	r.c.poll()
	r.take()
	r.add("symbol_error", 100)
	r.step(10 * time.Second)
	if got := changes(r.take()); !got["symbol-errors"] {
		t.Fatal("100 symbol errors in a 1m window (threshold 10/min) not marked")
	}
	// The burst stays in the rate window for 1m, then the recovery period
	// of 2m counts from the last poll over the threshold.
	var waited time.Duration
	for waited < 10*time.Minute {
		r.step(10 * time.Second)
		waited += 10 * time.Second
		if got := r.take(); len(got) > 0 {
			if got[0].bad || got[0].cause != "symbol-errors" {
				t.Fatalf("%+v, want symbol-errors cleared", got)
			}
			break
		}
	}
	// Last over the threshold at 50s (the burst leaves the 1m window at
	// 60s), cleared 2m later.
	if want := 50*time.Second + 2*time.Minute; waited != want {
		t.Errorf("cleared %s after the burst, want %s", waited, want)
	}
}

func TestPortCountersResetIsNoSpike(t *testing.T) {
	r := newCounterRig(t, testCounterConfig)
	r.set("symbol_error", 1_000_000)
	r.set("link_downed", 200)
	r.c.poll() // baseline: what a counter held before the agent started is no rate
	r.take()
	r.step(10 * time.Second)
	// A driver reload: the counters start again from zero.
	r.set("symbol_error", 3)
	r.set("link_downed", 0)
	r.step(10 * time.Second)
	r.step(10 * time.Second)
	if got := changes(r.take()); got["symbol-errors"] || got[CauseFlap] {
		t.Errorf("counter reset marked the port: %v", got)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.c)
	want := `
# HELP gpu_node_agent_rdma_port_symbol_errors_total Minor link errors detected on one or more physical lanes of the port (counters/symbol_error).
# TYPE gpu_node_agent_rdma_port_symbol_errors_total counter
gpu_node_agent_rdma_port_symbol_errors_total{Hostname="node-a",device="mlx5_0",port="1"} 3
# HELP gpu_node_agent_rdma_port_flaps Link downs of the port within rdma.portCounters.flapWindow: link_downed increments or down transitions of the port state, whichever is more.
# TYPE gpu_node_agent_rdma_port_flaps gauge
gpu_node_agent_rdma_port_flaps{Hostname="node-a",device="mlx5_0",port="1"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpu_node_agent_rdma_port_symbol_errors_total", "gpu_node_agent_rdma_port_flaps"); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestPortCountersAbsentCountersAreNoData(t *testing.T) {
	root := t.TempDir()
	if err := fakesys.Write(root, fixtures["ib"]); err != nil { // no counters directory
		t.Fatal(err)
	}
	devs, err := Discover(context.Background(), DiscoverOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	var obs []counterObs
	c, err := NewPortCounters(PortCountersOptions{Root: root, Devices: devs, Config: testCounterConfig,
		Observe: func(id, cause string, bad bool, reason string) { obs = append(obs, counterObs{id, cause, bad, reason}) }})
	if err != nil {
		t.Fatal(err)
	}
	c.poll()
	for _, o := range obs {
		if o.bad {
			t.Errorf("port without counters reported %+v", o)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if n, err := testutil.GatherAndCount(reg, "gpu_node_agent_rdma_port_symbol_errors_total"); err != nil || n != 0 {
		t.Errorf("symbol error series without the counter file: %d (%v), want 0", n, err)
	}
}

func TestPortCountersConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"defaults", Config{}, ""},
		{"set", Config{PortCounters: PortCountersConfig{Interval: Duration(time.Second), FlapThreshold: 2,
			ErrorRateThresholds: map[string]float64{"symbol_error": 0.5, "port_xmit_discards": 100}}}, ""},
		{"negative interval", Config{PortCounters: PortCountersConfig{Interval: Duration(-time.Second)}},
			"rdma.portCounters.interval: -1s is negative"},
		{"negative threshold", Config{PortCounters: PortCountersConfig{FlapThreshold: -1}},
			"rdma.portCounters.flapThreshold: -1 is negative"},
		{"rate window under interval", Config{PortCounters: PortCountersConfig{Interval: Duration(time.Minute), RateWindow: Duration(time.Second)}},
			"rdma.portCounters.rateWindow: 1s is shorter than interval 1m0s"},
		{"flap window under interval", Config{PortCounters: PortCountersConfig{Interval: Duration(time.Hour)}},
			"rdma.portCounters.flapWindow: 10m0s is shorter than interval 1h0m0s"},
		{"unknown counter", Config{PortCounters: PortCountersConfig{ErrorRateThresholds: map[string]float64{"symbol_errors": 1}}},
			"rdma.portCounters.errorRateThresholds.symbol_errors: not a port error counter"},
		{"link_downed rate", Config{PortCounters: PortCountersConfig{ErrorRateThresholds: map[string]float64{"link_downed": 1}}},
			"rdma.portCounters.errorRateThresholds.link_downed: link downs are judged by flapThreshold"},
		{"negative rate", Config{PortCounters: PortCountersConfig{ErrorRateThresholds: map[string]float64{"symbol_error": -1}}},
			"rdma.portCounters.errorRateThresholds.symbol_error: -1 is not a rate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPortCountersConfigDefaults(t *testing.T) {
	c := PortCountersConfig{ErrorRateThresholds: map[string]float64{"symbol_error": 1}}.WithDefaults()
	if c.ErrorRateThresholds["symbol_error"] != 1 || c.ErrorRateThresholds["port_rcv_errors"] != 10 {
		t.Errorf("thresholds %v: want symbol_error as set, port_rcv_errors defaulted", c.ErrorRateThresholds)
	}
	if time.Duration(c.Interval) != DefaultCounterInterval || c.FlapThreshold != DefaultCounterFlapThreshold {
		t.Errorf("defaults not applied: %+v", c)
	}
}

// TestPortCountersFourBitDefaults: the 4-bit counters (they stop at 15)
// are judged by default at a rate they can show: three increments within
// the default 5-minute window mark the port, two do not.
func TestPortCountersFourBitDefaults(t *testing.T) {
	for _, counter := range []string{"local_link_integrity_errors", "excessive_buffer_overrun_errors"} {
		for _, n := range []uint64{2, 3} {
			cfg := testCounterConfig
			cfg.RateWindow = Duration(DefaultCounterRateWindow)
			cfg.ErrorRateThresholds = nil
			r := newCounterRig(t, cfg)
			r.c.poll()
			r.take()
			var marked bool
			for i := range uint64(6) { // one a minute, n of them
				if i < n {
					r.add(counter, 1)
				}
				r.step(time.Minute)
				for _, bad := range changes(r.take()) {
					marked = marked || bad
				}
			}
			if want := n >= 3; marked != want {
				t.Errorf("%s: %d in 5m marked %v, want %v", counter, n, marked, want)
			}
		}
	}
}

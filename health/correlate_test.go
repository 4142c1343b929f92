package health

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

var corrT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// corrMonitor is a monitor without NVML over GPU-0, GPU-1 (MIG-1-a) and
// GPU-2, on a fake clock, with rules (nil: the defaults) and recovery
// period 5m; cfg adjusts the rest.
func corrMonitor(t *testing.T, rules []CorrelationRule, cfg func(*Config)) (*Monitor, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(corrT0)
	c := Config{DCGMMode: DCGMOff, MIGDevicesServed: true, RecoveryPeriod: 5 * time.Minute, clock: clk,
		Correlation: CorrelationConfig{Rules: rules}}
	if cfg != nil {
		cfg(&c)
	}
	m, err := NewMonitor(c, nil, discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.SetNode(&topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0"},
		{Index: 1, UUID: "GPU-1", MIGEnabled: true, MIG: []topology.MIGDevice{{UUID: "MIG-1-a"}}},
		{Index: 2, UUID: "GPU-2"},
	}})
	return m, clk
}

// xidAt observes XID x on device id as the NVML event watcher reports it,
// at corrT0+at.
func xidAt(m *Monitor, clk *clocktesting.FakeClock, id string, x uint64, at time.Duration) {
	clk.SetTime(corrT0.Add(at))
	o, _ := (&xidWatcher{m: m}).observation(nvmlowner.Event{Type: nvml.EventTypeXidCriticalError, Data: x})
	o.DeviceID = id
	m.Observe(o)
}

func fired(m *Monitor, rule, device string) float64 {
	return testutil.ToFloat64(m.corr.fired.WithLabelValues(rule, device))
}

func cancelledCount(m *Monitor, rule, device string) float64 {
	return testutil.ToFloat64(m.corr.cancelled.WithLabelValues(rule, device))
}

func TestCorrelationEscalation(t *testing.T) {
	rule := CorrelationRule{Name: "XID13x3", XID: 13, Count: 3, Window: time.Hour, Action: "escalate-to fatal"}
	bursty := rule
	bursty.Burst = 3 * time.Minute
	tests := []struct {
		name  string
		rule  CorrelationRule
		at    []time.Duration
		fires bool
	}{
		{"three within the window fire", rule, []time.Duration{0, 20 * time.Minute, 40 * time.Minute}, true},
		{"three spread over more than the window do not", rule, []time.Duration{0, 40 * time.Minute, 61 * time.Minute}, false},
		{"two do not", rule, []time.Duration{0, 20 * time.Minute}, false},
		{"a burst counts once", bursty, []time.Duration{0, time.Minute, 2 * time.Minute, 4 * time.Minute}, false},
		{"separate bursts count", bursty, []time.Duration{0, 10 * time.Minute, 20 * time.Minute}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, clk := corrMonitor(t, []CorrelationRule{tc.rule}, nil)
			for i, at := range tc.at {
				xidAt(m, clk, "GPU-0", 13, at)
				if i < len(tc.at)-1 && !m.Healthy("GPU-0") {
					t.Fatalf("unhealthy after %d xid 13: %v", i+1, m.Status("GPU-0").Reasons)
				}
			}
			if got := !m.Healthy("GPU-0"); got != tc.fires {
				t.Fatalf("unhealthy = %v, want %v (%v)", got, tc.fires, m.Status("GPU-0").Reasons)
			}
			want := 0.0
			if tc.fires {
				want = 1
				st := m.Status("GPU-0")
				if !slices.Equal(st.Causes, []string{"correlation-XID13x3"}) {
					t.Errorf("causes %v, want [correlation-XID13x3]", st.Causes)
				}
				if f := m.Fitness(); f.Reason != CheckCorrelation {
					t.Errorf("fitness reason %q, want %q", f.Reason, CheckCorrelation)
				}
			}
			if got := fired(m, rule.Name, "GPU-0"); got != want {
				t.Errorf("fired_total = %v, want %v", got, want)
			}
			if !m.Healthy("GPU-2") {
				t.Error("another GPU unhealthy too")
			}
		})
	}
}

func TestCorrelationRecovery(t *testing.T) {
	for _, class := range []string{EscalateFatal, EscalateReset, EscalateReboot} {
		t.Run(class, func(t *testing.T) {
			rule := CorrelationRule{Name: "XID31x2", XID: 31, Count: 2, Window: time.Hour, Action: "escalate-to " + class}
			m, clk := corrMonitor(t, []CorrelationRule{rule}, nil)
			xidAt(m, clk, "MIG-1-a", 31, 0)
			xidAt(m, clk, "MIG-1-a", 31, time.Minute)
			if m.Healthy("MIG-1-a") {
				t.Fatal("rule did not fire")
			}
			if m.Healthy("GPU-1") == false {
				t.Error("the parent GPU is unhealthy for its MIG device's rule")
			}
			if got := fired(m, rule.Name, "MIG-1-a"); got != 1 {
				t.Errorf("fired_total = %v, want 1", got)
			}
			wantAction := map[string]string{EscalateFatal: ActionInvestigate, EscalateReset: ActionResetGPU, EscalateReboot: ActionReboot}[class]
			if got := testutil.ToFloat64(m.metrics.unhealthy.WithLabelValues("MIG-1-a", KindMIG, CheckCorrelation, "correlation-XID31x2", wantAction)); got != 1 {
				t.Errorf("device_unhealthy with action %s = %v, want 1", wantAction, got)
			}
			clk.SetTime(corrT0.Add(time.Minute + 5*time.Minute))
			m.evaluate()
			if class == EscalateFatal {
				if !m.Healthy("MIG-1-a") {
					t.Fatalf("fatal escalation did not recover after the recovery period: %v", m.Status("MIG-1-a").Reasons)
				}
				return
			}
			clk.SetTime(corrT0.Add(3 * time.Hour))
			m.evaluate()
			if m.Healthy("MIG-1-a") {
				t.Fatal("held escalation recovered without a reset")
			}
			// A reset of the parent GPU releases it and empties the
			// windows: one more XID 31 does not fire again.
			m.Observe(Observation{DeviceID: "GPU-1", Reset: true, Reason: "test reset"})
			clk.SetTime(corrT0.Add(3*time.Hour + 5*time.Minute))
			m.evaluate()
			if !m.Healthy("MIG-1-a") {
				t.Fatalf("not healthy a recovery period after the reset: %v", m.Status("MIG-1-a").Reasons)
			}
			xidAt(m, clk, "MIG-1-a", 31, 3*time.Hour+6*time.Minute)
			if !m.Healthy("MIG-1-a") {
				t.Fatal("an xid 31 after the reset fired with occurrences from before it")
			}
		})
	}
}

func TestCorrelationPairCancel(t *testing.T) {
	// A DBE (48, reset class, held) that its partner 94 explains; 94 is
	// an application XID, only counted.
	rule := CorrelationRule{Name: "DBEContained", XID: 48, CancelledBy: 94, Within: time.Minute}
	type xid struct {
		id string
		x  uint64
		at time.Duration
	}
	tests := []struct {
		name string
		xids []xid
		// healthyAt5m30: whether GPU-0 is healthy 5m30s after t0.
		healthyAt5m30 bool
		cancelled     float64
		reason        string // in GPU-0's reasons at once, "" for none
	}{
		{"partner first: the xid is informational", []xid{{"GPU-0", 94, 0}, {"GPU-0", 48, 30 * time.Second}}, true, 1, ""},
		{"partner after: the held fault is released, recovery from the partner", []xid{{"GPU-0", 48, 0}, {"GPU-0", 94, 30 * time.Second}}, true, 1, "explained by xid 94"},
		{"partner on a MIG device of the GPU", []xid{{"GPU-1", 48, 0}, {"MIG-1-a", 94, 30 * time.Second}}, true, 1, ""},
		{"partner too early", []xid{{"GPU-0", 94, 0}, {"GPU-0", 48, 2 * time.Minute}}, false, 0, "held until reset"},
		{"partner too late", []xid{{"GPU-0", 48, 0}, {"GPU-0", 94, 2 * time.Minute}}, false, 0, "held until reset"},
		{"partner on another GPU", []xid{{"GPU-0", 48, 0}, {"GPU-2", 94, 30 * time.Second}}, false, 0, "held until reset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, clk := corrMonitor(t, []CorrelationRule{rule}, nil)
			for _, x := range tc.xids {
				xidAt(m, clk, x.id, x.x, x.at)
			}
			dev := tc.xids[0].id
			if tc.xids[0].x == 94 {
				dev = tc.xids[1].id
			}
			if tc.reason != "" {
				if r := strings.Join(m.Status(dev).Reasons, "; "); !strings.Contains(r, tc.reason) {
					t.Errorf("reasons %q, want %q in them", r, tc.reason)
				}
			}
			if tc.xids[0].x == 94 && tc.healthyAt5m30 && !m.Healthy(dev) {
				t.Errorf("an explained xid 48 made the device unhealthy: %v", m.Status(dev).Reasons)
			}
			clk.SetTime(corrT0.Add(5*time.Minute + 29*time.Second))
			m.evaluate()
			if tc.xids[0].x == 48 && tc.healthyAt5m30 && m.Healthy(dev) {
				t.Error("recovered before a recovery period after the partner")
			}
			clk.SetTime(corrT0.Add(5*time.Minute + 30*time.Second))
			m.evaluate()
			if got := m.Healthy(dev); got != tc.healthyAt5m30 {
				t.Errorf("healthy at 5m30s = %v, want %v: %v", got, tc.healthyAt5m30, m.Status(dev).Reasons)
			}
			var got float64
			for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-a", "GPU-2"} {
				got += cancelledCount(m, rule.Name, id)
			}
			if got != tc.cancelled {
				t.Errorf("cancelled_total = %v, want %v", got, tc.cancelled)
			}
		})
	}
}

// TestCorrelationCancelledXIDNotCounted: an XID its partner explains does
// not count toward an escalation rule, in either order.
func TestCorrelationCancelledXIDNotCounted(t *testing.T) {
	rules := []CorrelationRule{
		{Name: "XID45x2", XID: 45, Count: 2, Window: time.Hour, Action: "escalate-to fatal"},
		{Name: "XID45AfterXID48", XID: 45, CancelledBy: 48, Within: 3 * time.Minute},
	}
	m, clk := corrMonitor(t, rules, func(c *Config) { c.FatalXIDs = []uint64{79} })
	xidAt(m, clk, "GPU-0", 48, 0)
	xidAt(m, clk, "GPU-0", 45, time.Minute)    // explained by the 48 before it
	xidAt(m, clk, "GPU-0", 45, 10*time.Minute) // counted
	xidAt(m, clk, "GPU-0", 48, 11*time.Minute) // explains the 45 before it
	if got := fired(m, "XID45x2", "GPU-0"); got != 0 {
		t.Fatalf("fired_total = %v with both earlier 45s explained, want 0", got)
	}
	xidAt(m, clk, "GPU-0", 45, 30*time.Minute)
	xidAt(m, clk, "GPU-0", 45, 40*time.Minute)
	if got := fired(m, "XID45x2", "GPU-0"); got != 1 {
		t.Fatalf("fired_total = %v after two unexplained 45s, want 1", got)
	}
}

func linkSample(at time.Duration, replays uint64) *nvmlowner.Sample {
	ok := func(v uint64) nvmlowner.Value { return nvmlowner.Value{V: v, Status: nvmlowner.OK} }
	na := nvmlowner.Value{Status: nvmlowner.NotSupported}
	return &nvmlowner.Sample{UUID: "GPU-0", Time: corrT0.Add(at), Links: []nvmlowner.Link{
		{Link: 0, Up: ok(1), Counters: [4]nvmlowner.Value{ok(replays), ok(0), ok(0), ok(0)}, Recoveries: na},
	}}
}

func TestCorrelationNVLinkRate(t *testing.T) {
	const poll = 10 * time.Second
	tests := []struct {
		name string
		// rise is the replay counter's rise at each poll.
		rise      func(i int) uint64
		polls     int
		wantFault bool
	}{
		// 15 per 10s poll is 90/min: over the 60/min limit once the
		// 5m window holds 300 errors, never a jump of 100 in one poll.
		{"sustained rate over the limit", func(int) uint64 { return 15 }, 40, true},
		{"sustained rate under the limit", func(int) uint64 { return 9 }, 60, false},
		{"one burst under the window's total", func(i int) uint64 {
			if i == 3 {
				return 250
			}
			return 0
		}, 60, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, clk := corrMonitor(t, nil, nil)
			cfg := m.cfg
			var total uint64
			prev := linkSample(0, 0)
			firstFault := -1
			for i := 1; i <= tc.polls; i++ {
				total += tc.rise(i)
				cur := linkSample(time.Duration(i)*poll, total)
				clk.SetTime(cur.Time)
				for _, o := range m.nvlinkRate(&checkInput{UUID: "GPU-0", Prev: prev, Cur: cur, Cfg: cfg}) {
					if o.Key != "link 0 error-rate" {
						t.Fatalf("observation key %q", o.Key)
					}
					if o.Fatal && firstFault < 0 {
						firstFault = i
					}
					m.Observe(o)
				}
				prev = cur
			}
			if got := firstFault >= 0; got != tc.wantFault {
				t.Fatalf("fault = %v (first at poll %d), want %v", got, firstFault, tc.wantFault)
			}
			if !tc.wantFault {
				if !m.Healthy("GPU-0") {
					t.Fatalf("unhealthy: %v", m.Status("GPU-0").Reasons)
				}
				return
			}
			// 300 errors need 20 polls of 15: not before.
			if firstFault != 20 {
				t.Errorf("first fault at poll %d, want 20 (the window's 300 errors)", firstFault)
			}
			if m.Healthy("GPU-0") || !slices.Contains(m.Status("GPU-0").Causes, "nvlink-link-0-error-rate") {
				t.Fatalf("status %+v, want the error-rate cause", m.Status("GPU-0"))
			}
			// The errors stop: the cause clears once the window no
			// longer holds 300, and the GPU recovers a period later.
			var cleared bool
			for i := tc.polls + 1; i <= tc.polls+60; i++ {
				cur := linkSample(time.Duration(i)*poll, total)
				clk.SetTime(cur.Time)
				for _, o := range m.nvlinkRate(&checkInput{UUID: "GPU-0", Prev: prev, Cur: cur, Cfg: cfg}) {
					cleared = cleared || o.Cleared
					m.Observe(o)
				}
				prev = cur
			}
			m.evaluate()
			if !cleared || !m.Healthy("GPU-0") {
				t.Fatalf("cleared %v, healthy %v after the errors stopped: %v", cleared, m.Healthy("GPU-0"), m.Status("GPU-0").Reasons)
			}
		})
	}
}

func TestCorrelationNVLinkRateOff(t *testing.T) {
	m, _ := corrMonitor(t, nil, func(c *Config) { c.Correlation.NVLinkErrorRate.Off = true })
	in := &checkInput{UUID: "GPU-0", Prev: linkSample(0, 0), Cur: linkSample(10*time.Second, 1e6), Cfg: m.cfg}
	if obs := m.nvlinkRate(in); obs != nil {
		t.Fatalf("rate check off, got %+v", obs)
	}
}

func TestCorrelationConfigValidate(t *testing.T) {
	esc := func(f func(*CorrelationRule)) CorrelationRule {
		r := CorrelationRule{Name: "r", XID: 13, Count: 3, Window: time.Hour, Action: "escalate-to reset"}
		f(&r)
		return r
	}
	pair := func(f func(*CorrelationRule)) CorrelationRule {
		r := CorrelationRule{Name: "p", XID: 45, CancelledBy: 48, Within: time.Minute}
		f(&r)
		return r
	}
	tests := []struct {
		name  string
		rules []CorrelationRule
		rate  NVLinkErrorRate
		want  []string // substrings of the error; none: valid
	}{
		{"defaults", nil, NVLinkErrorRate{}, nil},
		{"no rules", []CorrelationRule{}, NVLinkErrorRate{}, nil},
		{"valid escalation and pair", []CorrelationRule{esc(func(*CorrelationRule) {}), pair(func(*CorrelationRule) {})}, NVLinkErrorRate{}, nil},
		{"no name", []CorrelationRule{esc(func(r *CorrelationRule) { r.Name = "" })}, NVLinkErrorRate{}, []string{`rules[0] "": name: required`}},
		{"bad name", []CorrelationRule{esc(func(r *CorrelationRule) { r.Name = "a b" })}, NVLinkErrorRate{}, []string{`"a b": name: only letters`}},
		{"duplicate name", []CorrelationRule{esc(func(*CorrelationRule) {}), esc(func(*CorrelationRule) {})}, NVLinkErrorRate{}, []string{`rules[1] "r": name: used by another rule`}},
		{"no xid", []CorrelationRule{esc(func(r *CorrelationRule) { r.XID = 0 })}, NVLinkErrorRate{}, []string{`"r": xid: required`}},
		{"count 1", []CorrelationRule{esc(func(r *CorrelationRule) { r.Count = 1 })}, NVLinkErrorRate{}, []string{`"r": count: 1: must be at least 2`}},
		{"no window", []CorrelationRule{esc(func(r *CorrelationRule) { r.Window = 0 })}, NVLinkErrorRate{}, []string{`"r": window: 0s: must be positive`}},
		{"burst as long as the window", []CorrelationRule{esc(func(r *CorrelationRule) { r.Burst = time.Hour })}, NVLinkErrorRate{}, []string{`"r": burst: 1h0m0s`}},
		{"unknown class", []CorrelationRule{esc(func(r *CorrelationRule) { r.Action = "escalate-to drain" })}, NVLinkErrorRate{}, []string{`"r": action: "escalate-to drain"`}},
		{"no action", []CorrelationRule{esc(func(r *CorrelationRule) { r.Action = "" })}, NVLinkErrorRate{}, []string{`"r": action: ""`}},
		{"neither kind", []CorrelationRule{{Name: "x", XID: 13}}, NVLinkErrorRate{}, []string{`"x": action: required`}},
		{"both kinds", []CorrelationRule{esc(func(r *CorrelationRule) { r.CancelledBy = 48 })}, NVLinkErrorRate{}, []string{`"r": cancelledBy: a rule either escalates`}},
		{"partner is itself", []CorrelationRule{pair(func(r *CorrelationRule) { r.CancelledBy = 45 })}, NVLinkErrorRate{}, []string{`"p": cancelledBy: 45: must differ from xid`}},
		{"no within", []CorrelationRule{pair(func(r *CorrelationRule) { r.Within = 0 })}, NVLinkErrorRate{}, []string{`"p": within: 0s: must be positive`}},
		{"no partner", []CorrelationRule{pair(func(r *CorrelationRule) { r.CancelledBy = 0 })}, NVLinkErrorRate{}, []string{`"p": cancelledBy: required`}},
		{"rate window too short", nil, NVLinkErrorRate{Window: 30 * time.Second}, []string{"nvlinkErrorRate.window 30s: must be at least 1m"}},
		{"negative rate", nil, NVLinkErrorRate{PerMinute: -1}, []string{"nvlinkErrorRate.perMinute -1: must not be negative"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Config{Correlation: CorrelationConfig{Rules: tc.rules, NVLinkErrorRate: tc.rate}}.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), "health.correlation") || !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to contain %q", err, w)
				}
			}
		})
	}
	// The defaults are valid and each names its source.
	for _, r := range DefaultCorrelationRules() {
		if r.Source == "" {
			t.Errorf("default rule %s has no source", r.Name)
		}
	}
}

func TestCorrelationConfigJSON(t *testing.T) {
	var c Config
	in := `{"correlation":{"rules":[{"name":"r","xid":13,"count":3,"window":"1h","burst":"3m","action":"escalate-to reset"},` +
		`{"name":"p","xid":45,"cancelledBy":48,"within":"2m"}],"nvlinkErrorRate":{"window":"10m","perMinute":30}}}`
	if err := json.Unmarshal([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	want := CorrelationConfig{
		Rules: []CorrelationRule{
			{Name: "r", XID: 13, Count: 3, Window: time.Hour, Burst: 3 * time.Minute, Action: "escalate-to reset"},
			{Name: "p", XID: 45, CancelledBy: 48, Within: 2 * time.Minute},
		},
		NVLinkErrorRate: NVLinkErrorRate{Window: 10 * time.Minute, PerMinute: 30},
	}
	got, _ := json.Marshal(c.Correlation)
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) || c.Correlation.Rules[0].Window != time.Hour {
		t.Fatalf("read %s, want %s", got, wantJSON)
	}
	for _, bad := range []string{
		`{"correlation":{"rules":[{"name":"r","xid":13,"windw":"1h"}]}}`,
		`{"correlation":{"rules":[{"name":"r","xid":13,"window":"an hour"}]}}`,
		`{"correlation":{"nvlinkErrorRate":{"perMin":3}}}`,
		`{"correlation":{"rulez":[]}}`,
	} {
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	// An empty list switches the default rules off; an absent one keeps them.
	var off, def Config
	if err := json.Unmarshal([]byte(`{"correlation":{"rules":[]}}`), &off); err != nil {
		t.Fatal(err)
	}
	if n := len(off.WithDefaults().Correlation.Rules); n != 0 {
		t.Errorf("rules: [] gives %d rules, want 0", n)
	}
	if n := len(def.WithDefaults().Correlation.Rules); n != len(DefaultCorrelationRules()) {
		t.Errorf("no rules key gives %d rules, want the %d defaults", n, len(DefaultCorrelationRules()))
	}
}

// TestSimCorrelation injects XID 13 three times into a running monitor on
// the simulated node: an application XID, only counted each time, until
// the third within the window fires the rule and the GPU is unfit; it
// recovers after the recovery period.
func TestSimCorrelation(t *testing.T) {
	node, m := simMonitor(t, 300*time.Millisecond, nil)
	rule := CorrelationRule{Name: "XID13x3", XID: 13, Count: 3, Window: time.Hour, Action: "escalate-to fatal"}
	m.corr.mu.Lock()
	m.corr.escalates = []CorrelationRule{rule}
	m.corr.mu.Unlock()
	gpu := node.Spec().GPUs[2].UUID
	counted := func() int {
		m.corr.mu.Lock()
		defer m.corr.mu.Unlock()
		if w := m.corr.windows[gpu][rule.Name]; w != nil {
			return len(w.starts)
		}
		return 0
	}
	for i := 1; i <= 3; i++ {
		if !m.Healthy(gpu) {
			t.Fatalf("unhealthy after %d xid 13: %v", i-1, m.Status(gpu).Reasons)
		}
		simtest.Fault(t, node, "POST", `{"kind":"xid","gpu":2,"xid":13}`)
		waitUntil(t, "the xid counted", func() bool { return counted() == i })
	}
	waitUntil(t, "the rule to fire", func() bool { return !m.Healthy(gpu) })
	if st := m.Status(gpu); !slices.Contains(st.Causes, "correlation-XID13x3") {
		t.Fatalf("causes %v, want correlation-XID13x3", st.Causes)
	}
	if f := m.Fitness(); f.Fit || f.Reason != CheckCorrelation || !slices.Equal(f.Devices, []string{gpu}) {
		t.Fatalf("fitness %+v, want unfit by correlation on %s only", f, gpu)
	}
	waitUntil(t, "recovery", func() bool { return m.Healthy(gpu) })
}

// TestCorrelationSuppressedOnOtherGPU: an escalation rule does not fire
// when its XID was also seen on another GPU of the node within the
// window (the application's), and still fires when the other sighting is
// older than the window or on the same GPU's MIG device.
func TestCorrelationSuppressedOnOtherGPU(t *testing.T) {
	rule := CorrelationRule{Name: "XID31x2", XID: 31, Count: 2, Window: time.Hour, Action: "escalate-to fatal"}
	t.Run("seen on another GPU within the window", func(t *testing.T) {
		m, clk := corrMonitor(t, []CorrelationRule{rule}, nil)
		xidAt(m, clk, "GPU-2", 31, 0)
		xidAt(m, clk, "GPU-0", 31, 10*time.Minute)
		xidAt(m, clk, "GPU-0", 31, 20*time.Minute)
		if !m.Healthy("GPU-0") {
			t.Fatalf("GPU-0 unhealthy: %v", m.Status("GPU-0").Reasons)
		}
		if got := testutil.ToFloat64(m.corr.suppressed.WithLabelValues(rule.Name, "GPU-0")); got != 1 {
			t.Errorf("suppressed_total = %v, want 1", got)
		}
		if got := fired(m, rule.Name, "GPU-0"); got != 0 {
			t.Errorf("fired_total = %v, want 0", got)
		}
	})
	t.Run("seen on another GPU before the window", func(t *testing.T) {
		m, clk := corrMonitor(t, []CorrelationRule{rule}, nil)
		xidAt(m, clk, "GPU-2", 31, 0)
		xidAt(m, clk, "GPU-0", 31, 70*time.Minute)
		xidAt(m, clk, "GPU-0", 31, 80*time.Minute)
		if m.Healthy("GPU-0") {
			t.Fatal("GPU-0 healthy: the rule did not fire")
		}
	})
	t.Run("seen on the GPU's own MIG device", func(t *testing.T) {
		m, clk := corrMonitor(t, []CorrelationRule{rule}, nil)
		xidAt(m, clk, "MIG-1-a", 31, 0)
		xidAt(m, clk, "GPU-1", 31, 10*time.Minute)
		xidAt(m, clk, "GPU-1", 31, 20*time.Minute)
		if m.Healthy("GPU-1") {
			t.Fatal("GPU-1 healthy: its own MIG device's xid suppressed the rule")
		}
	})
}

// TestCorrelationNVLinkRateClearsWhenLinkDown: a link's error-rate cause
// clears when the link is no longer judged (down), rather than staying
// until the link comes back.
func TestCorrelationNVLinkRateClearsWhenLinkDown(t *testing.T) {
	const poll = 10 * time.Second
	m, clk := corrMonitor(t, nil, nil)
	cfg := m.cfg
	prev := linkSample(0, 0)
	var total uint64
	for i := 1; i <= 25; i++ {
		total += 15
		cur := linkSample(time.Duration(i)*poll, total)
		clk.SetTime(cur.Time)
		for _, o := range m.nvlinkRate(&checkInput{UUID: "GPU-0", Prev: prev, Cur: cur, Cfg: cfg}) {
			m.Observe(o)
		}
		prev = cur
	}
	if !slices.Contains(m.Status("GPU-0").Causes, "nvlink-link-0-error-rate") {
		t.Fatalf("no error-rate cause: %+v", m.Status("GPU-0"))
	}
	down := linkSample(26*poll, total)
	down.Links[0].Up.V = 0
	clk.SetTime(down.Time)
	var cleared bool
	for _, o := range m.nvlinkRate(&checkInput{UUID: "GPU-0", Prev: prev, Cur: down, Cfg: cfg}) {
		cleared = cleared || (o.Cleared && o.Key == "link 0 error-rate")
		m.Observe(o)
	}
	if !cleared {
		t.Fatal("the error-rate cause was not cleared when the link went down")
	}
}

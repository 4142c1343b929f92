package health

import (
	"testing"
	"time"
)

func TestDeviceStateTransitions(t *testing.T) {
	cfg := Config{RecoveryPeriod: 5 * time.Minute, FlapWindow: time.Hour, MaxRecoveryPeriod: 15 * time.Minute}.WithDefaults()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fatal := Observation{Check: "remap", Key: "pending", Fatal: true, Reason: "row remapping pending"}
	cleared := Observation{Check: "remap", Key: "pending", Cleared: true}
	xid := Observation{Check: "xid", Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79"}
	other := Observation{Check: "ecc", Key: "dbe", Fatal: true, Reason: "dbe"}
	info := Observation{Check: "xid", Key: "xid 13", Reason: "xid 13", XID: 13}
	held := Observation{Check: "xid", Key: "xid 79", Fatal: true, Event: true, HoldUntilReset: true, Reason: "xid 79"}
	heldLasting := Observation{Check: "ecc", Key: "dbe", Fatal: true, HoldUntilReset: true, Reason: "dbe rose"}
	heldCleared := Observation{Check: "ecc", Key: "dbe", Cleared: true}
	reset := Observation{Reset: true, Reason: "test reset"}

	type step struct {
		at      time.Duration // since t0
		obs     *Observation  // nil: only evaluate
		healthy bool
		flaps   int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"fatal makes unhealthy at once", []step{
			{0, &fatal, false, 0},
		}},
		{"informational observation changes nothing", []step{
			{0, &info, true, 0},
		}},
		{"clear alone of an unknown cause changes nothing", []step{
			{0, &cleared, true, 0},
		}},
		{"cleared stays unhealthy before the period", []step{
			{0, &fatal, false, 0},
			{time.Minute, &cleared, false, 0},
			{5*time.Minute + 59*time.Second, nil, false, 0},
		}},
		{"cleared is healthy after the period", []step{
			{0, &fatal, false, 0},
			{time.Minute, &cleared, false, 0},
			{6 * time.Minute, nil, true, 0},
		}},
		{"active cause never recovers", []step{
			{0, &fatal, false, 0},
			{10 * time.Hour, nil, false, 0},
		}},
		{"event recovers a period after it", []step{
			{0, &xid, false, 0},
			{4 * time.Minute, nil, false, 0},
			{5 * time.Minute, nil, true, 0},
		}},
		{"repeated event restarts recovery", []step{
			{0, &xid, false, 0},
			{4 * time.Minute, &xid, false, 0},
			{8 * time.Minute, nil, false, 0},
			{9 * time.Minute, nil, true, 0},
		}},
		{"every cause must clear", []step{
			{0, &fatal, false, 0},
			{0, &other, false, 0},
			{time.Minute, &cleared, false, 0},
			{time.Hour, nil, false, 0},
		}},
		{"flap doubles the recovery period", []step{
			{0, &xid, false, 0},
			{5 * time.Minute, nil, true, 0},
			{10 * time.Minute, &xid, false, 1},
			{19 * time.Minute, nil, false, 1},
			{20 * time.Minute, nil, true, 1},
		}},
		{"damped period is capped", []step{
			{0, &xid, false, 0},
			{5 * time.Minute, nil, true, 0},
			{6 * time.Minute, &xid, false, 1}, // 10m
			{16 * time.Minute, nil, true, 1},
			{17 * time.Minute, &xid, false, 2}, // 20m, capped at 15m
			{32 * time.Minute, nil, true, 2},
		}},
		{"fault after the flap window is not a flap", []step{
			{0, &xid, false, 0},
			{5 * time.Minute, nil, true, 0},
			{2 * time.Hour, &xid, false, 0},
			{2*time.Hour + 5*time.Minute, nil, true, 0},
		}},
		{"held event stays unhealthy past the period", []step{
			{0, &held, false, 0},
			{10 * time.Hour, nil, false, 0},
		}},
		{"reset starts recovery of a held event", []step{
			{0, &held, false, 0},
			{time.Hour, &reset, false, 0},
			{time.Hour + 4*time.Minute, nil, false, 0},
			{time.Hour + 5*time.Minute, nil, true, 0},
		}},
		{"held lasting cause ignores its clear", []step{
			{0, &heldLasting, false, 0},
			{time.Minute, &heldCleared, false, 0},
			{time.Hour, nil, false, 0},
			{time.Hour, &reset, false, 0},
			{time.Hour + 5*time.Minute, nil, true, 0},
		}},
		{"reset of a lasting held cause still reported waits for its clear", []step{
			{0, &heldLasting, false, 0},
			{time.Minute, &reset, false, 0},
			{time.Hour, nil, false, 0},
			{time.Hour, &heldCleared, false, 0},
			{time.Hour + 5*time.Minute, nil, true, 0},
		}},
		{"flap damping applies after a reset", []step{
			{0, &xid, false, 0},
			{5 * time.Minute, nil, true, 0},
			{10 * time.Minute, &held, false, 1},
			{time.Hour, &reset, false, 1},
			{time.Hour + 5*time.Minute, nil, false, 1}, // 10m damped
			{time.Hour + 10*time.Minute, nil, true, 1},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newDeviceState(KindGPU, t0)
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				switch {
				case st.obs == nil:
				case st.obs.Reset:
					s.release(now)
				default:
					s.apply(*st.obs, now, cfg)
				}
				s.evaluate(now, cfg)
				if s.healthy != st.healthy || s.flaps != st.flaps {
					t.Fatalf("step %d at %s: healthy=%v flaps=%d, want healthy=%v flaps=%d (reasons %v)",
						i, st.at, s.healthy, s.flaps, st.healthy, st.flaps, s.reasons())
				}
			}
		})
	}
}

func TestDeviceStateNextDue(t *testing.T) {
	cfg := Config{RecoveryPeriod: time.Minute}.WithDefaults()
	t0 := time.Unix(0, 0)
	s := newDeviceState(KindGPU, t0)
	s.apply(Observation{Check: "xid", Fatal: true, Event: true, Reason: "xid 79"}, t0, cfg)
	if _, next := s.evaluate(t0, cfg); !next.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next due = %v, want %v", next, t0.Add(time.Minute))
	}
	if got, want := s.reasons(), []string{"xid 79 (cleared, recovering)"}; len(got) != 1 || got[0] != want[0] {
		t.Fatalf("reasons = %q, want %q", got, want)
	}
}

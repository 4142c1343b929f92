package health

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"defaults", Config{}, ""},
		{"custom xids", Config{FatalXIDs: []uint64{79, 999}}, ""},
		{"poll too fast", Config{PollInterval: time.Millisecond}, "health.pollInterval"},
		{"negative recovery", Config{RecoveryPeriod: -time.Second}, "health.recoveryPeriod"},
		{"cap below period", Config{RecoveryPeriod: time.Hour, MaxRecoveryPeriod: time.Minute}, "health.maxRecoveryPeriod"},
		{"xid zero", Config{FatalXIDs: []uint64{0}}, "health.fatalXIDs"},
		{"unknown check", Config{DisabledChecks: []string{"ecc", "vibes"}}, `unknown check "vibes"`},
		{"nvml cannot be disabled", Config{DisabledChecks: []string{"nvml"}}, `health.disabledChecks: "nvml" cannot be disabled`},
		{"other checks can be disabled", Config{DisabledChecks: []string{CheckXID, CheckECC, CheckRetired, CheckRemap, CheckLost, CheckNVLink, CheckDCGM}}, ""},
		{"bad dcgm mode", Config{DCGMMode: "sometimes"}, "health.dcgmMode"},
		{"standalone without address", Config{DCGMMode: DCGMStandalone}, "health.dcgmAddress"},
		{"standalone with address", Config{DCGMMode: DCGMStandalone, DCGMAddress: "localhost:5555"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.PollInterval != 10*time.Second || c.RecoveryPeriod != 5*time.Minute || c.DCGMMode != DCGMAuto || !slices.Equal(c.FatalXIDs, DefaultFatalXIDs()) {
		t.Fatalf("defaults %+v", c)
	}
}

// TestDefaultFatalXIDsIsACopy guards against the defaults being shared
// state: changing one caller's list must not change the next one's.
func TestDefaultFatalXIDsIsACopy(t *testing.T) {
	a := DefaultFatalXIDs()
	if !slices.Contains(a, 79) {
		t.Fatalf("DefaultFatalXIDs() = %v, want it to contain 79 (fallen off the bus)", a)
	}
	a[0] = 0
	c := Config{}.WithDefaults()
	c.FatalXIDs[1] = 0
	if b := DefaultFatalXIDs(); b[0] == 0 || b[1] == 0 {
		t.Fatalf("DefaultFatalXIDs() = %v after callers changed their copies", b)
	}
}

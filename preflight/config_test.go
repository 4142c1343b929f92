package preflight

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown item", Config{DisabledItems: []string{"pcie"}}, `preflight.disabledItems: unknown item "pcie" (items: gpu-count,`},
		{"negative count", Config{GPUCount: GPUCountConfig{Expected: -1}}, "preflight.gpuCount.expected: -1 is negative"},
		{"bad label", Config{GPUCount: GPUCountConfig{Label: "gpu count"}}, `preflight.gpuCount.label: "gpu count" is not a label key`},
		{"bad version", Config{Driver: DriverConfig{MinVersion: "r550"}}, `preflight.driver.minVersion: "r550" is not a driver version such as 550.54.15`},
		{"too many links", Config{NVLink: NVLinkConfig{Expected: 37}}, "preflight.nvlink.expected: 37 is not a number of NVLinks (0 to NVML's NVLINK_MAX_LINKS, 36)"},
		{"unknown reason", Config{Throttle: ThrottleConfig{Reasons: []string{"hot"}}}, `preflight.throttle.reasons: unknown clocks event reason "hot"`},
		{"negative rate", Config{RDMA: RDMAConfig{MinRateGbps: -400}}, "preflight.rdma.minRateGbps: -400 is negative"},
		{"dcgm level", Config{DCGM: DCGMConfig{Level: 5}}, "preflight.dcgm.level: 5 is not a DCGM diagnostic level"},
		{"negative timeout", Config{Command: CommandConfig{Args: []string{"true"}, Timeout: Duration(-time.Second)}}, "preflight.command.timeout: -1s is negative"},
		{"empty program", Config{Command: CommandConfig{Args: []string{" ", "-x"}}}, "preflight.command.args: the program (the first element) is empty"},
		{"negative recheck", Config{RecheckInterval: Duration(-time.Minute)}, "preflight.recheckInterval: -1m0s is negative"},
		{"negative retry", Config{RetryInterval: Duration(-time.Minute)}, "preflight.retryInterval: -1m0s is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaultsAndJSON(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(`{"recheckInterval":"1h","command":{"args":["nvbandwidth"],"timeout":"90s"},"dcgm":{"level":2}}`), &c); err != nil {
		t.Fatal(err)
	}
	c = c.WithDefaults()
	if time.Duration(c.RecheckInterval) != time.Hour || time.Duration(c.Command.Timeout) != 90*time.Second || c.DCGM.Level != 2 {
		t.Errorf("read %+v", c)
	}
	if time.Duration(c.DCGM.Timeout) != DefaultDCGMTimeout || c.Command.OutputBytes != DefaultCommandOutputBytes ||
		strings.Join(c.Throttle.Reasons, ",") != strings.Join(DefaultThrottleReasons, ",") {
		t.Errorf("defaults %+v", c)
	}
	if err := json.Unmarshal([]byte(`{"recheckInterval":"soon"}`), &c); err == nil || !strings.Contains(err.Error(), `duration "soon"`) {
		t.Errorf("bad duration: %v", err)
	}
}

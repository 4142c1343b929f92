package kubeapi

import (
	"strings"
	"testing"
	"time"
)

func TestTaintConfigDefaults(t *testing.T) {
	tc := TaintConfig{}.WithDefaults()
	if tc.Mode != TaintOn || tc.Key != "gpu-node-agent.io/unhealthy" || tc.Effect != "NoSchedule" || tc.MaxFraction != 0.2 ||
		tc.ConditionType != "GPUHealthy" || tc.Resync != 5*time.Minute {
		t.Fatalf("taint defaults %+v", tc)
	}
}

func TestTaintConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  TaintConfig
		want string
	}{
		{"defaults", TaintConfig{}, ""},
		{"dry-run", TaintConfig{Mode: TaintDryRun}, ""},
		{"bad mode", TaintConfig{Mode: "maybe"}, "taint.mode"},
		{"bad key", TaintConfig{Key: "not a key"}, "taint.key"},
		{"bad effect", TaintConfig{Effect: "NoWay"}, "taint.effect"},
		{"fraction over 1", TaintConfig{MaxFraction: 1.5}, "taint.maxFraction"},
		{"bad selector", TaintConfig{NodeSelector: "a in (b"}, "taint.nodeSelector"},
		{"bad namespace", TaintConfig{EventNamespace: "Not_OK"}, "taint.eventNamespace"},
		{"bad lease namespace", TaintConfig{LeaseNamespace: "Not_OK"}, "taint.leaseNamespace"},
		{"resync too short", TaintConfig{Resync: time.Millisecond}, "taint.resync"},
		{"two errors both named", TaintConfig{Mode: "x", Effect: "y"}, "taint.effect"},
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

func TestClientConfig(t *testing.T) {
	if c := (ClientConfig{}).WithDefaults(); c.QPS != 5 || c.Burst != 10 {
		t.Fatalf("defaults %+v, want QPS 5 burst 10", c)
	}
	tests := []struct {
		name string
		cfg  ClientConfig
		want string
	}{
		{"defaults", ClientConfig{}, ""},
		{"custom", ClientConfig{QPS: 0.5, Burst: 1}, ""},
		{"negative qps", ClientConfig{QPS: -1}, "kube-api-qps"},
		{"negative burst", ClientConfig{Burst: -1}, "kube-api-burst"},
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

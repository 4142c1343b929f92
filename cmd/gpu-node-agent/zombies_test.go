package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// TestZombiesConfig: health.zombies is read from the file (durations as
// strings, unknown keys refused) and reaches the agent's configuration;
// bad values are refused naming the key.
func TestZombiesConfig(t *testing.T) {
	c, err := loadConfig([]string{"--config", "testdata/zombies.yaml"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := usage.ZombiesConfig{Grace: 3 * time.Minute, Action: usage.ActionKill, KillGrace: 45 * time.Second, LeakedThresholdMiB: 2048}
	if c.Health.Zombies != want {
		t.Errorf("health.zombies = %+v, want %+v", c.Health.Zombies, want)
	}
	if c.Health.RecoveryPeriod != 5*time.Minute {
		t.Errorf("health.recoveryPeriod = %s: the rest of the section was lost", c.Health.RecoveryPeriod)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.agentConfig("/").Zombies; got != want {
		t.Errorf("agent config zombies = %+v, want %+v", got, want)
	}
	d, err := loadConfig(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Health.Zombies.WithDefaults().Action != usage.ActionReport {
		t.Errorf("default action = %q, want report", d.Health.Zombies.WithDefaults().Action)
	}

	for _, tt := range []struct{ name, yaml, wantErr string }{
		{"unknown key", "health:\n  zombies:\n    action: kill\n    graceperiod: 1m\n", `health.zombies: json: unknown field "graceperiod"`},
		{"duration as a number", "health:\n  zombies:\n    grace: 120\n", `health.zombies.grace: duration 120 must be a string such as "30s"`},
		{"bad duration", "health:\n  zombies:\n    killGrace: soon\n", `health.zombies.killGrace: time: invalid duration "soon"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := loadConfig([]string{"--config", path}, noEnv, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("load error = %v, want %q", err, tt.wantErr)
			}
		})
	}
	for _, tt := range []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"bad action", func(c *Config) { c.Health.Zombies.Action = "terminate" }, `health.zombies.action "terminate": must be report or kill`},
		{"negative grace", func(c *Config) { c.Health.Zombies.Grace = -time.Minute }, "health.zombies.grace -1m0s: must not be negative"},
		{"negative kill grace", func(c *Config) { c.Health.Zombies.KillGrace = -time.Second }, "health.zombies.killGrace -1s: must not be negative"},
		{"kill with the check disabled", func(c *Config) {
			c.Health.Zombies.Action = usage.ActionKill
			c.Health.DisabledChecks = []string{health.CheckGPUProcesses}
		}, `health.zombies.action "kill": needs the gpu-processes check`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := defaults()
			tt.mutate(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func noEnv(string) string { return "" }

package usage

import (
	"strings"
	"testing"
	"time"
)

func TestZombiesConfig(t *testing.T) {
	d := ZombiesConfig{}.WithDefaults()
	if d.Grace != 2*time.Minute || d.Action != ActionReport || d.KillGrace != 30*time.Second || d.LeakedThresholdMiB != 1024 {
		t.Errorf("defaults = %+v", d)
	}
	for _, tt := range []struct {
		name string
		cfg  ZombiesConfig
		want []string
	}{
		{"defaults", ZombiesConfig{}, nil},
		{"kill", ZombiesConfig{Action: ActionKill, Grace: time.Second, KillGrace: time.Second}, nil},
		{"bad action", ZombiesConfig{Action: "Kill"}, []string{`health.zombies.action "Kill": must be report or kill`}},
		{"negative durations", ZombiesConfig{Grace: -time.Second, KillGrace: -time.Minute},
			[]string{"health.zombies.grace -1s: must not be negative", "health.zombies.killGrace -1m0s: must not be negative"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want %q", err, w)
				}
			}
		})
	}
}

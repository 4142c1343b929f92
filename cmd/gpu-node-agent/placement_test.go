//go:build simulator

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlacementConfig: placement.moveAdvice is on by default and can be
// switched off from the file, the environment or the flag, each over the
// one before; it reaches the agent's configuration.
func TestPlacementConfig(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{name: "default on", want: true},
		{name: "file off", args: []string{"--config", "testdata/placement-off.yaml"}, want: false},
		{name: "env over file", args: []string{"--config", "testdata/placement-off.yaml"}, env: map[string]string{"GNA_MOVE_ADVICE": "true"}, want: true},
		{name: "flag over env", args: []string{"--move-advice=false"}, env: map[string]string{"GNA_MOVE_ADVICE": "true"}, want: false},
		{name: "empty section keeps the default", args: []string{"--config", writeConfig(t, "placement: {}\n")}, want: true},
		{name: "null section keeps the default", args: []string{"--config", writeConfig(t, "placement:\n")}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if c.Placement.MoveAdvice != tc.want || c.agentConfig("/").MoveAdvice != tc.want {
				t.Errorf("moveAdvice %v, agent's %v; want %v", c.Placement.MoveAdvice, c.agentConfig("/").MoveAdvice, tc.want)
			}
		})
	}
}

// TestPlacementConfigRefused: a misspelt key or a value that is not a
// boolean is an error naming placement's key, before anything starts.
func TestPlacementConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
		env              map[string]string
	}{
		{name: "unknown key", file: "testdata/placement-unknown-key.yaml", want: "placement.moveAdvise: unknown key (known: moveAdvice)"},
		{name: "not a boolean", file: "testdata/placement-bad-type.yaml", want: "placement.moveAdvice: want bool, got string"},
		{name: "env not a boolean", env: map[string]string{"GNA_MOVE_ADVICE": "sometimes"}, want: `move-advice: env GNA_MOVE_ADVICE="sometimes"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.file != "" {
				args = []string{"--config", tc.file}
			}
			_, err := loadConfig(args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// writeConfig writes a config file holding body and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
)

// TestREADMEListsEveryOption keeps the README's flag table in step with the
// options: every flag and its environment variable must appear in it.
func TestREADMEListsEveryOption(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, o := range options {
		row := "| `--" + o.name + "` | `" + o.envName() + "` |"
		if !strings.Contains(readme, row) {
			t.Errorf("README has no table row starting %q", row)
		}
	}
	for _, s := range []string{"make demo", "make test", "go test -race ./..."} {
		if !strings.Contains(readme, s) {
			t.Errorf("README does not mention %q", s)
		}
	}
}

// TestREADMEPreflightExample: the README's preflight section example is a
// configuration the agent reads, and it shows the defaults.
func TestREADMEPreflightExample(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\npreflight:\n")
	if !ok {
		t.Fatal("README has no yaml block starting with preflight:")
	}
	block, _, _ := strings.Cut(rest, "```")
	path := filepath.Join(t.TempDir(), "preflight.yaml")
	if err := os.WriteFile(path, []byte("preflight:\n"+block), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := defaults()
	if _, err := readConfigFile(path, &cfg); err != nil {
		t.Fatalf("README example: %v", err)
	}
	if err := cfg.Preflight.Validate(); err != nil {
		t.Fatalf("README example: %v", err)
	}
	if diff := cmp.Diff(preflight.Config{}.WithDefaults(), cfg.Preflight.Config, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("the README example is not the defaults (-defaults +README):\n%s", diff)
	}
}

// TestREADMERemediationExample: the README's remediation block is read by
// the config loader and is the defaults, every step off.
func TestREADMERemediationExample(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\nremediation:")
	if !ok {
		t.Fatal("README has no yaml block starting with remediation:")
	}
	block, _, _ := strings.Cut(rest, "```")
	path := filepath.Join(t.TempDir(), "remediation.yaml")
	if err := os.WriteFile(path, []byte("remediation:"+block), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := defaults()
	if _, err := readConfigFile(path, &cfg); err != nil {
		t.Fatalf("README example: %v", err)
	}
	got := cfg.Remediation.WithDefaults()
	if err := got.Validate(); err != nil {
		t.Fatalf("README example: %v", err)
	}
	if diff := cmp.Diff(remediate.Config{}.WithDefaults(), got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("the README example is not the defaults (-defaults +README):\n%s", diff)
	}
}

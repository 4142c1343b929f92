package main

import (
	"os"
	"strings"
	"testing"
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

package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"version"}, &out, io.Discard, nil); code != 0 || out.String() != "gpu-node-agent dev\n" {
		t.Errorf("exit %d, output %q", code, out.String())
	}
}

// TestPreflightGateNeedsNode: gating the node without a Node to taint
// is refused before touching the node; re-checks alone need none.
func TestPreflightGateNeedsNode(t *testing.T) {
	var stderr strings.Builder
	want := "preflight.enabled: gating the node on the preflight needs node-name"
	if code := run([]string{"--config=testdata/preflight-enabled.yaml"}, io.Discard, &stderr, func(string) string { return "" }); code != 2 || !strings.Contains(stderr.String(), want) {
		t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), want)
	}
}

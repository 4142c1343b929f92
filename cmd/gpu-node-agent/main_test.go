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

// TestPreflightGateRefused: the agent refuses what it does not do with
// the preflight yet (gating, re-checks) before touching the node.
func TestPreflightGateRefused(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--config=testdata/preflight-enabled.yaml", "preflight.enabled: the agent does not gate the node on the preflight yet"},
		{"--config=testdata/preflight-recheck.yaml", "preflight.recheckInterval: the agent does not re-check idle GPUs yet"},
	} {
		var stderr strings.Builder
		if code := run([]string{tc.arg}, io.Discard, &stderr, func(string) string { return "" }); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tc.arg, code, stderr.String(), tc.want)
		}
	}
}

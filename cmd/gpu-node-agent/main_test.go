package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
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

// TestMainStackInitFirst: internal/mainstack grows the main goroutine's
// stack only if it initialises before the packages whose init runs deep.
// GODEBUG=inittrace=1 has this test binary, which links what main links,
// print each package's init in the order run: every one before mainstack's
// must be the standard library's.
func TestMainStackInitFirst(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	const mainstack = "github.com/gpu-node-agent/gpu-node-agent/internal/mainstack"
	var before []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "init" {
			continue
		}
		if f[1] == mainstack {
			for _, pkg := range before {
				// The standard library's import paths have no dot in
				// their first element.
				if first, _, _ := strings.Cut(pkg, "/"); strings.Contains(first, ".") {
					t.Errorf("%s initialises before %s", pkg, mainstack)
				}
			}
			t.Logf("%s initialises after %d packages of the standard library: %v", mainstack, len(before), before)
			return
		}
		before = append(before, f[1])
	}
	t.Fatalf("no init of %s in the init trace:\n%s", mainstack, out)
}

package mainstack

import (
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// limitEnv makes the test binary a child that calls grow on a fresh
// goroutine (a 2 KiB stack) with the stack limited to that many bytes.
const limitEnv = "MAINSTACK_TEST_LIMIT"

func TestMain(m *testing.M) {
	if v := os.Getenv(limitEnv); v != "" {
		limit, err := strconv.Atoi(v)
		if err != nil {
			panic(err)
		}
		debug.SetMaxStack(limit)
		done := make(chan struct{})
		go func() { grow(false); close(done) }()
		<-done
		os.Stdout.WriteString("grown\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The frame must survive compilation, or the package does nothing: grow
// called with false still takes the stack to 64 KiB, over a 32 KiB limit
// (the runtime kills the program), within one of 64 KiB.
func TestGrowTakesTheStackTo64KiB(t *testing.T) {
	for _, tc := range []struct {
		limit int
		fits  bool
	}{
		{limit: 32 << 10, fits: false},
		{limit: 64 << 10, fits: true},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), limitEnv+"="+strconv.Itoa(tc.limit))
		out, err := cmd.CombinedOutput()
		grown := err == nil && strings.Contains(string(out), "grown")
		if grown != tc.fits {
			t.Errorf("stack limit %d: grown %v, want %v; err %v, output:\n%s", tc.limit, grown, tc.fits, err, out)
		}
		if !tc.fits && !strings.Contains(string(out), "stack exceeds "+strconv.Itoa(tc.limit)+"-byte limit") {
			t.Errorf("stack limit %d: the child did not die of its stack limit:\n%s", tc.limit, out)
		}
	}
}

package runcmd

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestTailBuffer(t *testing.T) {
	b := &Tail{Max: 8}
	for _, s := range []string{"héllo\n", "wörld\n"} {
		if _, err := b.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// 14 bytes in, the last 8 kept: "llo\nwörld\n" cut to "\nwörld\n" is 8 bytes
	// with ö's two; the result starts on a whole character.
	if got := b.String(); got != "...wörld" {
		t.Errorf("tail %q", got)
	}
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		timeout  time.Duration
		exit     int
		timedOut bool
		err      string
	}{
		{"success", []string{"/bin/sh", "-c", "echo ok"}, time.Minute, 0, false, ""},
		{"failure", []string{"/bin/sh", "-c", "echo 'GPU in use' >&2; exit 3"}, time.Minute, 3, false, "x exited with status 3, want 0; output ends: GPU in use"},
		{"hang", []string{"/bin/sh", "-c", "sleep 3600 & sleep 3600"}, 200 * time.Millisecond, -1, true, "x timed out after 200ms, killed (no output)"},
		{"missing", []string{"/nonexistent/nvidia-smi"}, time.Minute, -1, false, "x did not run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Run(context.Background(), "x", tc.args, nil, tc.timeout, 64)
			if r.ExitCode != tc.exit || r.TimedOut != tc.timedOut {
				t.Errorf("exit %d timedOut %v, want %d %v", r.ExitCode, r.TimedOut, tc.exit, tc.timedOut)
			}
			if tc.err == "" {
				if r.Err != nil {
					t.Errorf("err %v", r.Err)
				}
			} else if r.Err == nil || !strings.HasPrefix(r.Err.Error(), tc.err) {
				t.Errorf("err %v, want prefix %q", r.Err, tc.err)
			}
		})
	}
}

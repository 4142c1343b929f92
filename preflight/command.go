package preflight

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// GPUsEnv is the variable that gives the command the GPUs' UUIDs,
// comma-separated.
const GPUsEnv = "GNA_PREFLIGHT_GPUS"

// checkCommand runs command.args (no shell) with GNA_PREFLIGHT_GPUS set,
// in its own process group, and passes when it exits 0 within
// command.timeout. On the timeout (or ctx ending) the whole group is
// killed. A failure's message keeps the end of its output.
//
// wrap, when set, rewrites the program and arguments that are run (a
// simulated node's command faults); the result names the configured
// command.
func checkCommand(ctx context.Context, cfg Config, uuids []string, wrap func([]string) []string) Result {
	r := Result{Item: ItemCommand, Target: "node"}
	args := cfg.Command.Args
	if len(args) == 0 {
		r.Status, r.Detail = Skipped, "no command configured (preflight.command.args)"
		return r
	}
	timeout := time.Duration(cfg.Command.Timeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	run := args
	if wrap != nil {
		run = wrap(args)
	}
	cmd := exec.CommandContext(ctx, run[0], run[1:]...)
	cmd.Env = append(os.Environ(), GPUsEnv+"="+strings.Join(uuids, ","))
	out := &tailBuffer{max: cfg.Command.OutputBytes}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, killed whole: a test that forks workers must
	// not leave them running past the timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A grandchild that keeps the output pipe open must not hold Wait.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	name := strings.Join(args, " ")
	tail := out.String()
	withOutput := func(s string) string {
		if tail == "" {
			return s + " (no output)"
		}
		return s + "; output ends: " + tail
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		r.Status, r.Detail = Pass, fmt.Sprintf("%s exited 0", name)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.Status, r.Detail = Fail, withOutput(fmt.Sprintf("%s timed out after %s, killed", name, timeout))
	case ctx.Err() != nil:
		r.Status, r.Detail = Fail, withOutput(fmt.Sprintf("%s stopped: %v", name, ctx.Err()))
	case errors.As(err, &exit):
		r.Status, r.Detail = Fail, withOutput(fmt.Sprintf("%s exited with status %d, want 0", name, exit.ExitCode()))
	default:
		r.Status, r.Detail = Fail, fmt.Sprintf("%s did not run: %v", name, err)
	}
	return r
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	dropped bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.dropped = true
	}
	return len(p), nil
}

// String is the kept output on one line: trimmed, newlines as " | ",
// starting at a whole character, "..." in front when output was dropped.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	for len(b) > 0 && !utf8.RuneStart(b[0]) {
		b = b[1:]
	}
	s := strings.TrimSpace(string(bytes.ToValidUTF8(b, []byte("?"))))
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
	if t.dropped && s != "" {
		s = "..." + s
	}
	return s
}

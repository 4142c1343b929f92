// Package runcmd runs an external command the way the agent runs every
// command it is configured with (the preflight's, nvidia-smi's GPU reset):
// no shell, its own process group killed whole on the timeout, and the end
// of its output kept for the message that reports it.
package runcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// Result is how one run ended.
type Result struct {
	// Err is nil when the command exited 0 within the timeout.
	Err error
	// TimedOut says the timeout killed it.
	TimedOut bool
	// ExitCode is its exit status (-1 when it did not exit on its own).
	ExitCode int
	// Output is the end of its stdout and stderr together, on one line
	// (see Tail).
	Output string
}

// Run runs args[0] with args[1:] and env (nil: the agent's own) in its own
// process group, for at most timeout (or until ctx ends), keeping the last
// outputBytes of its output. On the timeout the whole group is killed:
// a command that forks workers must not leave them running. Result.Err
// names the command (name, when set, else args joined) and says how it
// ended, with the end of its output.
func Run(ctx context.Context, name string, args, env []string, timeout time.Duration, outputBytes int) Result {
	if name == "" {
		name = strings.Join(args, " ")
	}
	if len(args) == 0 {
		return Result{Err: errors.New("no command to run"), ExitCode: -1}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = env
	out := &Tail{Max: outputBytes}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A grandchild that keeps the output pipe open must not hold Wait.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	r := Result{ExitCode: -1, Output: out.String()}
	withOutput := func(s string) error {
		if r.Output == "" {
			return errors.New(s + " (no output)")
		}
		return errors.New(s + "; output ends: " + r.Output)
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		r.ExitCode = 0
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.TimedOut = true
		r.Err = withOutput(fmt.Sprintf("%s timed out after %s, killed", name, timeout))
	case ctx.Err() != nil:
		r.Err = withOutput(fmt.Sprintf("%s stopped: %v", name, ctx.Err()))
	case errors.As(err, &exit):
		r.ExitCode = exit.ExitCode()
		r.Err = withOutput(fmt.Sprintf("%s exited with status %d, want 0", name, exit.ExitCode()))
	default:
		r.Err = fmt.Errorf("%s did not run: %w", name, err)
	}
	return r
}

// Tail keeps the last Max bytes written to it.
type Tail struct {
	Max     int
	mu      sync.Mutex
	buf     []byte
	dropped bool
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.Max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.dropped = true
	}
	return len(p), nil
}

// String is the kept output on one line: trimmed, newlines as " | ",
// starting at a whole character, "..." in front when output was dropped.
func (t *Tail) String() string {
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

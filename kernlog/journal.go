package kernlog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// journalctlPaths are where distributions install journalctl, relative to
// the host root.
var journalctlPaths = []string{"usr/bin/journalctl", "bin/journalctl"}

// journalArgs are journalctl's arguments (journalctl(1)): kernel messages
// of the current boot (-k implies -b), one JSON object per line, following
// new ones; --no-tail so that -f does not cut the start to the last ten
// lines; after the cursor when there is one for this boot.
func journalArgs(after string) []string {
	args := []string{"-k", "-o", "json", "--no-pager", "--no-tail", "-f"}
	if after != "" {
		args = append(args, "--after-cursor="+after)
	}
	return args
}

// journalCommand is the command that runs the host's journalctl. The
// runtime image has neither journalctl nor chroot, so by default the
// host's own journalctl runs with its root changed to the host root
// (SysProcAttr.Chroot, chroot(2) in the child before exec: what `chroot
// <host-root> journalctl` does, without a chroot binary). It needs
// CAP_SYS_CHROOT and the host's / (at least /usr, /etc, /var/log/journal
// and /run/log/journal) under the host root.
func (r *Reader) journalCommand(ctx context.Context, args []string) (*exec.Cmd, error) {
	if len(r.cfg.Journalctl) > 0 {
		argv := append(append([]string{}, r.cfg.Journalctl[1:]...), args...)
		return exec.CommandContext(ctx, r.cfg.Journalctl[0], argv...), nil
	}
	root := r.cfg.HostRoot
	for _, p := range journalctlPaths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			continue
		}
		if root == "/" {
			return exec.CommandContext(ctx, "/"+p, args...), nil
		}
		// An absolute path is not looked up: the child execs it after
		// the chroot, inside the host's tree.
		cmd := exec.CommandContext(ctx, "/"+p, args...)
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		return cmd, nil
	}
	return nil, fmt.Errorf("no journalctl under %s (%v): %w", root, journalctlPaths, errUnavailable)
}

// journalEntry is the part of a journalctl -o json entry the reader uses
// (systemd.journal-fields(7)). MESSAGE is a string, or an array of bytes
// when it is not valid UTF-8 (journalctl(1), "json").
type journalEntry struct {
	Cursor    string          `json:"__CURSOR"`
	Message   json.RawMessage `json:"MESSAGE"`
	Priority  string          `json:"PRIORITY"`
	Monotonic string          `json:"__MONOTONIC_TIMESTAMP"`
}

func (e journalEntry) message() string {
	var s string
	if json.Unmarshal(e.Message, &s) == nil {
		return s
	}
	var b []byte
	var ints []int
	if json.Unmarshal(e.Message, &ints) == nil {
		for _, v := range ints {
			b = append(b, byte(v))
		}
	}
	return string(b)
}

// readJournal runs journalctl and handles each entry it prints until ctx
// ends or journalctl exits (an error: the caller runs it again after
// Retry, after the cursor).
func (r *Reader) readJournal(ctx context.Context, handle func(Event)) error {
	// jctx ends journalctl when its output can no longer be read (a line
	// over the scanner's limit, a read error): journalctl -f never exits
	// on its own, so Wait would not return.
	jctx, stop := context.WithCancel(ctx)
	defer stop()
	cmd, err := r.journalCommand(jctx, journalArgs(r.cur.JournalCursor))
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	// Once journalctl has exited or been stopped, its output pipes are
	// closed after this even if a child of it still holds them, so Wait
	// returns.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	r.log.Info("kernel log: reading", "source", SourceJournal, "command", cmd.Args, "afterCursor", r.cur.JournalCursor)
	r.metrics.setUp(SourceJournal, true)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var e journalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Cursor == "" {
			r.log.Debug("kernel log: journal line not parsed", "error", err)
			continue
		}
		rec := Record{Message: e.message(), Cursor: e.Cursor}
		rec.Priority, _ = strconv.Atoi(e.Priority)
		rec.Usec, _ = strconv.ParseUint(e.Monotonic, 10, 64)
		r.handleRecord(SourceJournal, rec, handle)
	}
	scanErr := sc.Err()
	if scanErr != nil {
		stop()
	}
	waitErr := cmd.Wait()
	if ctx.Err() != nil {
		return nil
	}
	if scanErr != nil {
		return fmt.Errorf("read journalctl output: %w", scanErr)
	}
	if waitErr == nil {
		waitErr = errors.New("exited")
	}
	return fmt.Errorf("journalctl: %w: %s", waitErr, stderr.String())
}

// limitedBuffer keeps the first 4 KiB written to it (journalctl's error
// output, for the log).
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }

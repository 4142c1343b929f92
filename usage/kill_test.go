package usage

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// startChild starts a process that waits to be killed and returns it with
// its start time read from this host's /proc; the test stops it.
func startChild(t *testing.T) (*exec.Cmd, ProcessRef) {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	st, err := readStat("/proc", uint32(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return cmd, ProcessRef{PID: uint32(cmd.Process.Pid), StartTime: st.StartTime}
}

// TestPidfdSignaller signals a real process through a pidfd, and refuses
// one whose start time is not the observed one (a reused PID).
func TestPidfdSignaller(t *testing.T) {
	s := NewPidfdSignaller("/")
	cmd, ref := startChild(t)
	reused := ref
	reused.StartTime++
	if err := s.Signal(reused, syscall.SIGTERM); !errors.Is(err, ErrProcessGone) || !strings.Contains(err.Error(), "reused") {
		t.Fatalf("Signal(wrong start time) = %v, want ErrProcessGone (reused)", err)
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the process was signalled after all: %v", err)
	}
	if err := s.Signal(ref, syscall.SIGTERM); err != nil {
		t.Fatalf("Signal(SIGTERM): %v", err)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("child ended with %v, want killed by SIGTERM", err)
	}
	if err := s.Signal(ref, syscall.SIGKILL); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal(reaped process) = %v, want ErrProcessGone", err)
	}
}

// TestStartTimeChecked: a simulated node's signal function is called only
// for the process observed.
func TestStartTimeChecked(t *testing.T) {
	h := newHostTree(t)
	h.proc(3000001, 5000, "python3", "D", hostCgroup)
	var sent []string
	s := StartTimeChecked(h.root, func(pid uint32, sig syscall.Signal) error {
		sent = append(sent, strconv.Itoa(int(pid))+":"+signalName(sig))
		if pid == 3000002 {
			return syscall.ESRCH
		}
		return nil
	})
	if err := s.Signal(ProcessRef{PID: 3000001, StartTime: 4999}, syscall.SIGTERM); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal(reused PID) = %v, want ErrProcessGone", err)
	}
	if err := s.Signal(ProcessRef{PID: 3000001, StartTime: 5000}, syscall.SIGKILL); err != nil {
		t.Errorf("Signal(observed process) = %v", err)
	}
	h.proc(3000002, 6000, "python3", "S", hostCgroup)
	if err := s.Signal(ProcessRef{PID: 3000002, StartTime: 6000}, syscall.SIGTERM); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal(ESRCH) = %v, want ErrProcessGone", err)
	}
	if err := s.Signal(ProcessRef{PID: 3000003, StartTime: 1}, syscall.SIGTERM); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal(no /proc entry) = %v, want ErrProcessGone", err)
	}
	if want := []string{"3000001:SIGKILL", "3000002:SIGTERM"}; strings.Join(sent, ",") != strings.Join(want, ",") {
		t.Errorf("sent %v, want %v", sent, want)
	}
}

package usage

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
)

// ErrProcessGone is a signal that found no process to deliver to: the PID
// is free, or now names another process than the one observed (its start
// time differs), which is never signalled.
var ErrProcessGone = errors.New("process gone")

// ProcessRef names one process for good: its PID and its start time
// (/proc/<pid>/stat field 22), which a reused PID does not share.
type ProcessRef struct {
	PID       uint32
	StartTime uint64
}

// Signaller delivers a signal to exactly the process observed.
type Signaller interface {
	// Signal sends sig to p; ErrProcessGone (wrapped) when p no longer
	// exists.
	Signal(p ProcessRef, sig syscall.Signal) error
}

// SignalFunc sends a signal to a PID (a simulated node's SignalProcess).
type SignalFunc func(pid uint32, sig syscall.Signal) error

// StartTimeChecked is a Signaller over send for processes under
// <hostRoot>/proc: the PID's start time is checked just before send, so a
// PID reused since it was observed is never signalled. It is for
// simulated processes, which nothing else can reuse a PID of in between;
// real ones go through NewPidfdSignaller, which closes that window.
func StartTimeChecked(hostRoot string, send SignalFunc) Signaller {
	return startTimeChecked{procRoot: filepath.Join(hostRoot, "proc"), send: send}
}

type startTimeChecked struct {
	procRoot string
	send     SignalFunc
}

func (s startTimeChecked) Signal(p ProcessRef, sig syscall.Signal) error {
	if err := checkStartTime(s.procRoot, p); err != nil {
		return err
	}
	if err := s.send(p.PID, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal process %d: %w: %w", p.PID, ErrProcessGone, err)
		}
		return fmt.Errorf("signal process %d: %w", p.PID, err)
	}
	return nil
}

// checkStartTime fails with ErrProcessGone unless PID p.PID is the process
// started at p.StartTime.
func checkStartTime(procRoot string, p ProcessRef) error {
	st, err := readStat(procRoot, p.PID)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProcessGone, err)
	}
	if st.StartTime != p.StartTime {
		return fmt.Errorf("%w: PID %d now started at %d, not %d (reused)", ErrProcessGone, p.PID, st.StartTime, p.StartTime)
	}
	return nil
}

// signalName is the signal's name as kill(1) spells it.
func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return sig.String()
}

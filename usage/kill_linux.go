package usage

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// NewPidfdSignaller is the real Signaller: it opens a pidfd on the PID
// (pidfd_open(2)), checks that the PID still names the process started at
// the observed time, then signals through the pidfd
// (pidfd_send_signal(2)). The pidfd refers to the process that held the
// PID when it was opened, so once the start time read after opening
// matches, the signal cannot reach a process that reused the PID: one
// that took the PID before the open has another start time, and one that
// takes it after the open is not what the pidfd refers to. PIDs are this
// process's, so it must share the PID namespace of <hostRoot>/proc (see
// HostPIDView), and signalling another user's process needs CAP_KILL.
func NewPidfdSignaller(hostRoot string) Signaller {
	return pidfdSignaller{procRoot: filepath.Join(hostRoot, "proc")}
}

type pidfdSignaller struct{ procRoot string }

func (s pidfdSignaller) Signal(p ProcessRef, sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(int(p.PID), 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pidfd_open %d: %w: %w", p.PID, ErrProcessGone, err)
		}
		return fmt.Errorf("pidfd_open %d: %w", p.PID, err)
	}
	defer unix.Close(fd)
	if err := checkStartTime(s.procRoot, p); err != nil {
		return err
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pidfd_send_signal %d: %w: %w", p.PID, ErrProcessGone, err)
		}
		return fmt.Errorf("pidfd_send_signal %d %s: %w", p.PID, sig, err)
	}
	return nil
}

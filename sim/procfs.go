package sim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The simulated processes' /proc entries under the host root: cgroup,
// stat and comm in the kernel's formats (proc(5)). An entry appears and
// disappears whole: it is written in a hidden directory renamed to
// proc/<pid>, and renamed away before it is removed, so a reader sees the
// process with all its files or not at all, as with a real process.

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture the agent runs on: sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// procDir is the /proc directory under the host root.
func (n *Node) procDir() string { return filepath.Join(n.hostRoot, "proc") }

// writeProcEntry writes proc/<pid>/{cgroup,stat,comm} for p.
func (n *Node) writeProcEntry(p Process, cgroup string) error {
	proc := n.procDir()
	if err := os.MkdirAll(proc, 0o755); err != nil {
		return err
	}
	pid := strconv.FormatUint(uint64(p.PID), 10)
	tmp := filepath.Join(proc, ".sim-proc-new-"+pid)
	_ = os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"cgroup": cgroup,
		"stat":   statLine(p),
		"comm":   p.Comm + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o444); err != nil {
			_ = os.RemoveAll(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, filepath.Join(proc, pid)); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return nil
}

// removeProcEntry removes proc/<pid>.
func (n *Node) removeProcEntry(pid uint32) error {
	name := strconv.FormatUint(uint64(pid), 10)
	gone := filepath.Join(n.procDir(), ".sim-proc-gone-"+name)
	if err := os.Rename(filepath.Join(n.procDir(), name), gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(gone)
}

// removeStaleProcEntries removes the entries a previous simulator left in
// the same host root (an agent restarted there): their processes lived in
// that simulator's memory and are gone with it. Only simulated PIDs
// (FirstPID and above) and the simulator's own hidden directories are
// touched.
func (n *Node) removeStaleProcEntries() error {
	entries, err := os.ReadDir(n.procDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		pid, perr := strconv.ParseUint(name, 10, 32)
		stale := strings.HasPrefix(name, ".sim-proc-") || (perr == nil && pid >= FirstPID)
		if !stale {
			continue
		}
		if err := os.RemoveAll(filepath.Join(n.procDir(), name)); err != nil {
			return err
		}
	}
	return nil
}

// statLine is /proc/<pid>/stat (proc(5), 52 fields): the process sleeps
// ("S"), or is in uninterruptible sleep ("D"); its parent is init (the
// shim or the session that started it is not simulated); field 22,
// starttime, is in clock ticks since boot; sigignore (field 33) has
// SIGTERM's bit for a process that ignores it.
func statLine(p Process) string {
	var sigignore uint64
	if p.IgnoreTerm {
		sigignore = 1 << (15 - 1) // SIGTERM
	}
	pid := p.PID
	fields := []string{
		fmt.Sprint(pid), "(" + p.Comm + ")", p.State, // 1-3
		"1", fmt.Sprint(pid), fmt.Sprint(pid), "0", "-1", // 4-8: ppid pgrp session tty_nr tpgid
		"4194560", "0", "0", "0", "0", // 9-13: flags minflt cminflt majflt cmajflt
		"0", "0", "0", "0", // 14-17: utime stime cutime cstime
		"20", "0", "1", "0", // 18-21: priority nice num_threads itrealvalue
		fmt.Sprint(p.StartTime),                         // 22: starttime
		"0", "0", "18446744073709551615", "0", "0", "0", // 23-28: vsize rss rsslim startcode endcode startstack
		"0", "0", "0", "0", fmt.Sprint(sigignore), "0", // 29-34: kstkesp kstkeip signal blocked sigignore sigcatch
		"0", "0", "0", "17", "0", "0", "0", // 35-41: wchan nswap cnswap exit_signal processor rt_priority policy
		"0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", // 42-52
	}
	return strings.Join(fields, " ") + "\n"
}

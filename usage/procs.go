package usage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// initPIDNamespace is the inode of the initial PID namespace, which
// /proc/self/ns/pid links to from a process in it (the kernel's
// PROC_PID_INIT_INO, include/linux/proc_ns.h: 0xEFFFFFFC).
const initPIDNamespace = "pid:[4026531836]"

// Process is what /proc under the host root says about one PID NVML
// listed.
type Process struct {
	PID uint32
	// StartTime is field 22 of /proc/<pid>/stat, the time the process
	// started after boot in clock ticks: with the PID, it names one
	// process for good (a PID can be reused, the pair cannot).
	StartTime uint64
	// Comm is the command name (field 2 of stat, without parentheses).
	Comm string
	// State is field 3 of stat: R, S, D (uninterruptible sleep: deaf to
	// every signal until it returns), Z, ...
	State string
	// Cgroup is the process's pod and container.
	Cgroup CgroupInfo
}

// procReader reads processes under <hostRoot>/proc, caching each one's
// cgroup by (PID, start time): stat is read every cycle (it tells a
// reused PID), the cgroup file only for a process not seen before.
type procReader struct {
	root  string
	cache map[uint32]Process
	seen  map[uint32]bool
}

func newProcReader(hostRoot string) *procReader {
	return &procReader{root: filepath.Join(hostRoot, "proc"), cache: map[uint32]Process{}, seen: map[uint32]bool{}}
}

// read returns process pid; the error says why it cannot be read (gone,
// or not visible under the host root).
func (r *procReader) read(pid uint32) (Process, error) {
	r.seen[pid] = true
	st, err := readStat(r.root, pid)
	if err != nil {
		delete(r.cache, pid)
		return Process{}, err
	}
	if c, ok := r.cache[pid]; ok && c.StartTime == st.StartTime {
		c.State, c.Comm = st.State, st.Comm
		r.cache[pid] = c
		return c, nil
	}
	b, err := os.ReadFile(filepath.Join(r.root, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return Process{}, fmt.Errorf("process %d: %w", pid, err)
	}
	cg, err := ParseCgroup(string(b))
	if err != nil {
		return Process{}, fmt.Errorf("process %d: cgroup: %w", pid, err)
	}
	st.Cgroup = cg
	r.cache[pid] = st
	return st, nil
}

// endCycle forgets the processes not read since the last endCycle.
func (r *procReader) endCycle() {
	for pid := range r.cache {
		if !r.seen[pid] {
			delete(r.cache, pid)
		}
	}
	clear(r.seen)
}

// readStat reads /proc/<pid>/stat under procRoot (proc(5)): "pid (comm)
// state ppid ..." with starttime the 22nd field. comm may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func readStat(procRoot string, pid uint32) (Process, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "stat"))
	if err != nil {
		return Process{}, fmt.Errorf("process %d: %w", pid, err)
	}
	p, err := parseStat(string(b))
	if err != nil {
		return Process{}, fmt.Errorf("process %d: stat: %w", pid, err)
	}
	if p.PID != pid {
		return Process{}, fmt.Errorf("process %d: stat names PID %d", pid, p.PID)
	}
	return p, nil
}

func parseStat(s string) (Process, error) {
	open := strings.IndexByte(s, '(')
	closing := strings.LastIndexByte(s, ')')
	if open < 1 || closing < open {
		return Process{}, errors.New("no (comm)")
	}
	pid, err := strconv.ParseUint(strings.TrimSpace(s[:open]), 10, 32)
	if err != nil {
		return Process{}, fmt.Errorf("pid: %w", err)
	}
	// Fields 3 onwards.
	f := strings.Fields(s[closing+1:])
	if len(f) < 20 {
		return Process{}, fmt.Errorf("%d fields after comm, want at least 20", len(f))
	}
	start, err := strconv.ParseUint(f[22-3], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("starttime: %w", err)
	}
	return Process{PID: uint32(pid), Comm: s[open+1 : closing], State: f[0], StartTime: start}, nil
}

// HostPIDView says whether this process can name the GPU processes NVML
// lists: whether it shares the PID namespace of the host's /proc mounted
// at <hostRoot>/proc. NVML's PIDs are the driver's view (open-gpu-kernel-
// modules, gpuGetProcWithObject: each client's PID is translated into the
// caller's PID namespace by _gpuConvertPid/osFindNsPid, and a client not
// visible there is left out), so an agent in its own PID namespace is
// shown only its own namespace's processes, or on older drivers host PIDs
// it cannot look up: it can judge nothing. <hostRoot>/proc/self resolves
// to the reader's PID in that procfs's namespace, which is os.Getpid()
// only in the same namespace. With hostRoot "/" the agent's own /proc may
// be a private one, so the namespace must also be the initial one.
func HostPIDView(hostRoot string) (bool, string) {
	procSelf := filepath.Join(hostRoot, "proc", "self")
	link, err := os.Readlink(procSelf)
	if err != nil {
		return false, fmt.Sprintf("cannot read %s: the host's /proc is not mounted under the host root (the agent needs it and hostPID): %v", procSelf, err)
	}
	if link != strconv.Itoa(os.Getpid()) {
		return false, fmt.Sprintf("%s is PID %s, not this process's %d: the agent is not in the host's PID namespace (hostPID)", procSelf, link, os.Getpid())
	}
	if filepath.Clean(hostRoot) == "/" {
		ns, err := os.Readlink("/proc/self/ns/pid")
		if err != nil {
			return false, fmt.Sprintf("cannot read /proc/self/ns/pid: %v", err)
		}
		if ns != initPIDNamespace {
			return false, fmt.Sprintf("the agent's PID namespace is %s, not the host's %s (hostPID)", ns, initPIDNamespace)
		}
	}
	return true, ""
}

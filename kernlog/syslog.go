package kernlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The syslog(2) source reads the kernel's ring buffer with the syslog
// system call (klogctl(3)), action SYSLOG_ACTION_READ_ALL (3): a copy of
// every record still in the buffer, one text line each,
//
//	<prio>[sssss.uuuuuu] message\n
//
// (kernel/printk/printk.c, info_print_prefix: print_syslog "<%u>",
// print_time "[%5lu.%06lu]" while printk time stamps are on, and a
// "[T123]" caller id on kernels built with CONFIG_PRINTK_CALLER; a record
// with embedded newlines gives one line per part, each with the prefix).
// READ_ALL is non-destructive: it moves neither the /proc/kmsg reader's
// position (syslog_seq, what SYSLOG_ACTION_READ consumes) nor the journal's
// (journald reads /dev/kmsg with its own file position).
//
// It is a system call, not a device node, so a container's device cgroup
// does not apply: it needs CAP_SYSLOG when kernel.dmesg_restrict is 1
// (kernel/printk/printk.c, check_syslog_permissions and
// syslog_action_restricted; CAP_SYS_ADMIN is accepted too, with a
// "deprecated" warning) and nothing when it is 0. The container runtimes'
// default seccomp profiles (RuntimeDefault) allow syslog(2) to a process
// holding CAP_SYSLOG (containerd contrib/seccomp/seccomp_default.go,
// DefaultProfile: case "CAP_SYSLOG").
//
// The lines carry no sequence number, so the reader polls (every
// Config.SyslogPoll) and keeps as its cursor the time stamp of the last
// line handled (microseconds since boot) and how many lines with that time
// stamp it has handled, which tells apart lines logged in the same
// microsecond and the parts of one multi-line record.

// klogctlFunc is the syslog(2) call: unix.Klogctl, or a stand-in in tests.
type klogctlFunc func(typ int, buf []byte) (int, error)

// syslogFullSlack: a read whose text (prefixes included) is at least
// 3/4 of SYSLOG_ACTION_SIZE_BUFFER counts as a full ring buffer. The ring
// keeps a header with each record that the read does not show, and the
// read adds a prefix the ring does not keep; the two are of the same size
// (tens of bytes a record), so a full ring reads back at about its size.
// A ring emptied by SYSLOG_ACTION_CLEAR (dmesg -C) reads back far smaller.
const syslogFullNum, syslogFullDen = 3, 4

// errPrintkTimeOff is the syslog(2) source's failure on a kernel printing
// no time stamps (printk.time=0 on the kernel command line, or
// /sys/module/printk/parameters/time N, or CONFIG_PRINTK_TIME off): there
// is then nothing to keep a cursor with, and ModeAuto moves on to the
// journal.
var errPrintkTimeOff = errors.New("syslog(2) lines carry no time stamps (printk time stamps off: printk.time=0 or /sys/module/printk/parameters/time N); no cursor can be kept")

// readSyslog reads the ring buffer through syslog(2) every SyslogPoll
// until ctx ends or a call fails. EPERM, EACCES and ENOSYS (no CAP_SYSLOG
// under dmesg_restrict, a seccomp profile refusing the call), and a kernel
// printing no time stamps, wrap errUnavailable.
func (r *Reader) readSyslog(ctx context.Context, handle func(Event)) error {
	klogctl := r.klogctl
	if klogctl == nil {
		klogctl = unix.Klogctl
	}
	size, err := klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil {
		return syslogErr("SYSLOG_ACTION_SIZE_BUFFER", err)
	}
	if size <= 0 {
		return fmt.Errorf("syslog(2) SYSLOG_ACTION_SIZE_BUFFER: %d bytes (%w)", size, errUnavailable)
	}
	// The read adds a prefix to every line the ring keeps without one; the
	// kernel returns only the newest records that fit (syslog_print_all),
	// so room for twice the ring keeps the oldest ones in the copy.
	buf := make([]byte, 2*size)
	first := true
	for ctx.Err() == nil {
		n, err := klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return syslogErr("SYSLOG_ACTION_READ_ALL", err)
		}
		data := buf[:n]
		if first {
			if n > 0 && !hasSyslogTime(data) {
				return fmt.Errorf("%w: %s (%w)", errPrintkTimeOff, printkTimeParam(r.cfg.HostRoot), errUnavailable)
			}
			r.log.Info("kernel log: reading", "source", SourceSyslog, "bufferBytes", size, "poll", r.cfg.SyslogPoll,
				"resumeAfterUsec", r.cur.SyslogUsec, "resumeCount", r.cur.SyslogCount)
			r.metrics.setUp(SourceSyslog, true)
			first = false
		}
		r.syslogLines(data, size, handle)
		r.saveCursor()
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.SyslogPoll):
		}
	}
	return nil
}

// syslogErr wraps a failed syslog(2) call, with errUnavailable when the
// call is refused rather than broken.
func syslogErr(action string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("syslog(2) %s: %w (%w)", action, err, errUnavailable)
	}
	return fmt.Errorf("syslog(2) %s: %w", action, err)
}

// printkTimeParam says what /sys/module/printk/parameters/time holds under
// the host root, for the error of a kernel printing no time stamps.
func printkTimeParam(hostRoot string) string {
	b, err := os.ReadFile(filepath.Join(hostRoot, "sys/module/printk/parameters/time"))
	if err != nil {
		return "printk.time unknown"
	}
	return "/sys/module/printk/parameters/time is " + strings.TrimSpace(string(b))
}

// hasSyslogTime says whether the first line of a READ_ALL copy has a time
// stamp: printk_time is applied when the buffer is read, so all lines of
// one read have one, or none has.
func hasSyslogTime(data []byte) bool {
	line, _, _ := bytes.Cut(data, []byte{'\n'})
	_, _, _, ok := splitSyslogLine(line)
	return ok
}

// syslogLines handles the lines of one READ_ALL copy that follow the
// cursor. size is SYSLOG_ACTION_SIZE_BUFFER.
func (r *Reader) syslogLines(data []byte, size int, handle func(Event)) {
	start := r.syslogResume(data, size)
	// Lines handled so far per time stamp, for the cursor's count; the
	// cursor's own count carries over. A line out of time order (printk
	// time stamps come from each CPU's clock) whose time stamp also
	// appears before the cursor is undercounted, which makes a restart
	// read a few lines again rather than skip any.
	r.syslogCounts = map[uint64]int{}
	if r.cur.SyslogCount > 0 {
		r.syslogCounts[r.cur.SyslogUsec] = r.cur.SyslogCount
	}
	for rest := data[start:]; len(rest) > 0; {
		line, tail, _ := bytes.Cut(rest, []byte{'\n'})
		rest = tail
		rec, err := ParseSyslogLine(line)
		if err != nil {
			r.log.Debug("kernel log: syslog(2) line not parsed", "error", err)
			continue
		}
		r.handleRecord(SourceSyslog, rec, handle)
	}
}

// syslogResume finds where the lines not yet handled start in data: after
// the SyslogCount-th line time-stamped SyslogUsec (found with a byte
// search for its "[sssss.uuuuuu]", not by parsing every line). Without a
// cursor that is the start. When no line carries the cursor's time stamp
// and the oldest line is newer, the cursor's lines are gone from the ring:
// overwritten if the ring is full (counted as one lost record, the least
// that was lost: how many cannot be told), else the buffer was cleared.
func (r *Reader) syslogResume(data []byte, size int) int {
	if r.cur.SyslogCount == 0 || len(data) == 0 {
		return 0
	}
	tag := fmt.Appendf(nil, "[%5d.%06d]", r.cur.SyslogUsec/1e6, r.cur.SyslogUsec%1e6)
	after, found := -1, 0
	for off := 0; found < r.cur.SyslogCount; {
		i := bytes.Index(data[off:], tag)
		if i < 0 {
			break
		}
		i += off
		end := bytes.IndexByte(data[i:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += i + 1
		}
		off = end
		if !atLinePrefix(data, i) {
			continue // the text inside a message
		}
		after, found = end, found+1
	}
	if after >= 0 {
		return after
	}
	oldest, err := ParseSyslogLine(firstLine(data))
	if err == nil && oldest.Usec > r.cur.SyslogUsec {
		if len(data)*syslogFullDen >= size*syslogFullNum {
			r.metrics.lost.Inc()
			r.log.Warn("kernel log records lost: the ring buffer wrapped past the cursor between two reads (at least one record)",
				"cursorUsec", r.cur.SyslogUsec, "oldestUsec", oldest.Usec)
		} else {
			r.log.Info("kernel log: the ring buffer was cleared since the cursor; reading what it holds",
				"cursorUsec", r.cur.SyslogUsec, "oldestUsec", oldest.Usec)
		}
		return 0
	}
	// The cursor's time stamp is not there but older lines are (a line
	// the ring no longer holds in the middle cannot be; a cursor from
	// elsewhere can): the first line newer than the cursor.
	for off := 0; off < len(data); {
		line, _, _ := bytes.Cut(data[off:], []byte{'\n'})
		if rec, err := ParseSyslogLine(line); err == nil && rec.Usec > r.cur.SyslogUsec {
			return off
		}
		off += len(line) + 1
	}
	return len(data)
}

// atLinePrefix says whether the time stamp at data[i] follows a line's
// "<prio>" (and not some text inside a message).
func atLinePrefix(data []byte, i int) bool {
	ls := bytes.LastIndexByte(data[:i], '\n') + 1
	p := data[ls:i]
	if len(p) < 3 || p[0] != '<' || p[len(p)-1] != '>' {
		return false
	}
	for _, c := range p[1 : len(p)-1] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func firstLine(data []byte) []byte {
	line, _, _ := bytes.Cut(data, []byte{'\n'})
	return line
}

// ParseSyslogLine parses one line of a syslog(2) SYSLOG_ACTION_READ_ALL
// copy, "<prio>[sssss.uuuuuu] message" (a "[T123]" or "[C1]" caller id
// after the time stamp is dropped). A line without a time stamp is an
// error: the syslog(2) source needs them for its cursor.
func ParseSyslogLine(line []byte) (Record, error) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	prio, usec, msg, ok := splitSyslogLine(line)
	if !ok {
		return Record{}, fmt.Errorf("syslog(2) line %.60q: want <prio>[seconds.micros] message", line)
	}
	return Record{Priority: prio, Usec: usec, Message: msg}, nil
}

// splitSyslogLine splits "<prio>[sssss.uuuuuu] message".
func splitSyslogLine(line []byte) (prio int, usec uint64, msg string, ok bool) {
	if len(line) < 3 || line[0] != '<' {
		return 0, 0, "", false
	}
	gt := bytes.IndexByte(line, '>')
	if gt < 2 {
		return 0, 0, "", false
	}
	p, err := strconv.Atoi(string(line[1:gt]))
	if err != nil || p < 0 {
		return 0, 0, "", false
	}
	rest := line[gt+1:]
	if len(rest) == 0 || rest[0] != '[' {
		return 0, 0, "", false
	}
	rb := bytes.IndexByte(rest, ']')
	if rb < 0 {
		return 0, 0, "", false
	}
	secs, micros, found := bytes.Cut(bytes.TrimLeft(rest[1:rb], " "), []byte{'.'})
	if !found || len(micros) != 6 || len(secs) == 0 {
		return 0, 0, "", false
	}
	s, err1 := strconv.ParseUint(string(secs), 10, 64)
	u, err2 := strconv.ParseUint(string(micros), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	rest = rest[rb+1:]
	// CONFIG_PRINTK_CALLER: "[T123]" (task) or "[C1]" (CPU), right-aligned
	// in six columns, straight after the time stamp.
	if len(rest) > 2 && rest[0] == '[' {
		if e := bytes.IndexByte(rest, ']'); e > 0 {
			id := bytes.TrimLeft(rest[1:e], " ")
			if len(id) > 1 && (id[0] == 'T' || id[0] == 'C') && isDigits(id[1:]) {
				rest = rest[e+1:]
			}
		}
	}
	rest = bytes.TrimPrefix(rest, []byte{' '})
	return p, s*1e6 + u, string(rest), true
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// FormatSyslog is one record as syslog(2) READ_ALL gives it: a line per
// part of msg (split at its newlines), each with the prefix, newline
// terminated (tests and fixtures).
func FormatSyslog(prio int, usec uint64, msg string) string {
	var b strings.Builder
	for _, part := range strings.Split(msg, "\n") {
		fmt.Fprintf(&b, "<%d>[%5d.%06d] %s\n", prio, usec/1e6, usec%1e6, part)
	}
	return b.String()
}

package kernlog

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Record is one kernel log record.
type Record struct {
	// Seq is the kmsg sequence number (0 for syslog(2) and journal
	// records).
	Seq uint64
	// Priority is the syslog priority and facility (prio field).
	Priority int
	// Usec is the record's time in microseconds since boot.
	Usec uint64
	// Message is the record's text, \xNN escapes undone (it may hold
	// newlines: the kernel keeps a printk's embedded newlines in one
	// record; syslog(2) gives each part as a line of its own).
	Message string
	// Cursor is the journal's __CURSOR of a journal record ("" for kmsg).
	Cursor string
}

// ParseKmsg parses one /dev/kmsg record as the kernel's
// Documentation/ABI/testing/dev-kmsg describes it:
//
//	prio,seq,ts_usec,flags[,...];message\n
//	 KEY=value\n (continuation lines, ignored)
//
// Fields after flags are ignored ("Future extensions might add more comma
// separated values before the terminating ';'"); non-printable bytes of
// the message come escaped as \xNN and are unescaped here.
func ParseKmsg(b []byte) (Record, error) {
	s := string(b)
	head, rest, ok := strings.Cut(s, ";")
	if !ok {
		return Record{}, errors.New("kmsg record without ';'")
	}
	fields := strings.Split(head, ",")
	if len(fields) < 4 {
		return Record{}, fmt.Errorf("kmsg record header %q: want prio,seq,ts_usec,flags", head)
	}
	var r Record
	var err error
	if r.Priority, err = strconv.Atoi(fields[0]); err != nil {
		return Record{}, fmt.Errorf("kmsg record prio %q: %w", fields[0], err)
	}
	if r.Seq, err = strconv.ParseUint(fields[1], 10, 64); err != nil {
		return Record{}, fmt.Errorf("kmsg record seq %q: %w", fields[1], err)
	}
	if r.Usec, err = strconv.ParseUint(fields[2], 10, 64); err != nil {
		return Record{}, fmt.Errorf("kmsg record ts_usec %q: %w", fields[2], err)
	}
	msg, _, _ := strings.Cut(rest, "\n")
	r.Message = unescape(msg)
	return r, nil
}

// unescape undoes the kernel's \xNN escaping of non-printable bytes (and
// of '\' itself, which the kernel writes as \x5c).
func unescape(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// EscapeKmsg escapes msg as the kernel does for /dev/kmsg: bytes below
// ' ' or above '~', and '\', as \xNN. Writers of kmsg-format files (the
// simulator) use it so readers see what a real /dev/kmsg gives.
func EscapeKmsg(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < ' ' || c > '~' || c == '\\' {
			fmt.Fprintf(&b, `\x%02x`, c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// FormatKmsg is one record in /dev/kmsg format, newline-terminated, flags
// "-" (the record is not a continuation fragment).
func FormatKmsg(prio int, seq, usec uint64, msg string) string {
	return fmt.Sprintf("%d,%d,%d,-;%s\n", prio, seq, usec, EscapeKmsg(msg))
}

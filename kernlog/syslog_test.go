package kernlog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// TestParseSyslogFixture: testdata/nvidia.syslog holds the lines of
// testdata/nvidia.kmsg as syslog(2) READ_ALL prints them (the multi-line
// fallen-off-the-bus record as three lines with one prefix each); every
// line parses, and the parser finds the same events in the same order.
func TestParseSyslogFixture(t *testing.T) {
	var want []Event
	var kp Parser
	var wantText strings.Builder
	for _, rec := range fixtureRecords(t) {
		if e, ok := kp.Parse(rec.Message); ok {
			want = append(want, e)
		}
		wantText.WriteString(FormatSyslog(rec.Priority, rec.Usec, rec.Message))
	}
	b, err := os.ReadFile("testdata/nvidia.syslog")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != wantText.String() {
		t.Fatalf("testdata/nvidia.syslog is not testdata/nvidia.kmsg in syslog(2) form:\n%s", wantText.String())
	}
	var got []Event
	var sp Parser
	lines := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lines++
		rec, err := ParseSyslogLine(sc.Bytes())
		if err != nil {
			t.Fatalf("line %d: %v", lines, err)
		}
		if e, ok := sp.Parse(rec.Message); ok {
			got = append(got, e)
		}
	}
	if lines != 19 || len(want) != 12 || len(got) != len(want) {
		t.Fatalf("%d lines, %d events, want 19 lines and the kmsg fixture's %d events", lines, len(got), len(want))
	}
	for i := range want {
		if want[i].Kind == KindFallenOffBus {
			want[i].Text, got[i].Text = "", "" // the record's text, or its last line
		}
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

// TestParseSyslogLine: the prefix's fields, a caller id, and lines that
// are not the syslog(2) format with time stamps.
func TestParseSyslogLine(t *testing.T) {
	for line, want := range map[string]Record{
		"<4>[ 1843.308145] NVRM: Xid (PCI:0000:cb:00): 13, x\n":       {Priority: 4, Usec: 1843308145, Message: "NVRM: Xid (PCI:0000:cb:00): 13, x"},
		"<6>[    0.000000] Linux version 6.8.0":                       {Priority: 6, Usec: 0, Message: "Linux version 6.8.0"},
		"<12>[123456.000001] [drm] something":                         {Priority: 12, Usec: 123456000001, Message: "[drm] something"},
		"<4>[ 1843.308145][  T812] NVRM: Xid (PCI:0000:cb:00): 13, x": {Priority: 4, Usec: 1843308145, Message: "NVRM: Xid (PCI:0000:cb:00): 13, x"},
		"<4>[   12.000100][    C3] nvidia-nvswitch0: SXid":            {Priority: 4, Usec: 12000100, Message: "nvidia-nvswitch0: SXid"},
		"<4>[ 1843.308145] ":                                          {Priority: 4, Usec: 1843308145},
	} {
		got, err := ParseSyslogLine([]byte(line))
		if err != nil || got != want {
			t.Errorf("ParseSyslogLine(%q) = %+v, %v; want %+v", line, got, err, want)
		}
	}
	for _, bad := range []string{
		"<6>Linux version 6.8.0",     // printk.time off
		"<6>[drm] Initialized",       // printk.time off, a message in brackets
		"[ 1843.308145] no priority", // no <prio>
		"<x>[ 1.000000] m",
		"<4>[ 1843.3081] short micros",
		"<4>[ 1843.308145 unterminated",
		"",
	} {
		if _, err := ParseSyslogLine([]byte(bad)); err == nil {
			t.Errorf("ParseSyslogLine(%q): no error", bad)
		}
	}
	if got := FormatSyslog(3, 5_000_001, "a\nb"); got != "<3>[    5.000001] a\n<3>[    5.000001] b\n" {
		t.Errorf("FormatSyslog multi-line = %q", got)
	}
}

// fakeKlogctl is syslog(2) over a ring buffer held in memory: SIZE_BUFFER
// answers size, READ_ALL copies the text (the newest lines that fit, as
// the kernel's syslog_print_all does).
type fakeKlogctl struct {
	mu    sync.Mutex
	size  int
	text  string
	err   error // every call fails with it
	reads int
}

func (f *fakeKlogctl) call(typ int, buf []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	switch typ {
	case unix.SYSLOG_ACTION_SIZE_BUFFER:
		return f.size, nil
	case unix.SYSLOG_ACTION_READ_ALL:
		f.reads++
		text := f.text
		for len(text) > len(buf) {
			_, text, _ = strings.Cut(text, "\n")
		}
		return copy(buf, text), nil
	}
	return 0, unix.EINVAL
}

func (f *fakeKlogctl) set(text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.text = text
}

func (f *fakeKlogctl) add(text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.text += text
}

func (f *fakeKlogctl) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// xidLine is a syslog(2) line of XID code on bus 0000:3b:00 at usec.
func xidLine(usec, code uint64) string {
	return FormatSyslog(4, usec, "NVRM: Xid (PCI:0000:3b:00): "+strconv.FormatUint(code, 10)+", pid=1, name=x, test")
}

// waitReads waits until the reader has copied the buffer n more times.
func waitReads(t *testing.T, k *fakeKlogctl, n int) {
	t.Helper()
	target := k.readCount() + n
	waitFor(t, "syslog(2) reads", func() bool { return k.readCount() >= target })
}

// TestSyslogCursor: the syslog(2) source reads the whole buffer, then
// only new lines at each poll; lines with one time stamp are told apart by
// their count; a restart on the same boot neither repeats nor loses a line
// (one logged in the cursor's own microsecond while down included); a new
// boot reads the whole buffer.
func TestSyslogCursor(t *testing.T) {
	root := t.TempDir()
	setBoot(t, root, "boot-a")
	state := t.TempDir()
	k := &fakeKlogctl{size: 1 << 20, text: FormatSyslog(6, 0, "Linux version 6.8.0") +
		xidLine(1_000_000, 13) + xidLine(2_000_000, 31) + xidLine(2_000_000, 43)}
	cfg := Config{Mode: ModeSyslog, HostRoot: root, StateDir: state}
	r := startWith(t, cfg, k.call)
	for _, want := range []uint64{13, 31, 43} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("first read: xid %d, want %d", e.Code, want)
		}
	}
	// Two more in the same microsecond as the last, then a later one.
	k.add(xidLine(2_000_000, 48) + xidLine(2_000_000, 63) + xidLine(3_000_000, 79))
	for _, want := range []uint64{48, 63, 79} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("next poll: xid %d, want %d", e.Code, want)
		}
	}
	waitReads(t, k, 2) // polls that find nothing new
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("events %v read again", got)
	}
	c, err := LoadCursor(state)
	if err != nil || c.BootID != "boot-a" || c.SyslogUsec != 3_000_000 || c.SyslogCount != 1 || c.HasSeq {
		t.Fatalf("cursor %+v, %v; want boot-a, syslogUsec 3000000, count 1", c, err)
	}
	if got := testutil.ToFloat64(r.reader.metrics.records.WithLabelValues(SourceSyslog)); got != 7 {
		t.Errorf("records{source=syslog} = %v, want 7", got)
	}

	// Down while two lines arrive, one in the cursor's microsecond.
	k.add(xidLine(3_000_000, 94) + xidLine(4_000_000, 95))
	r = startWith(t, cfg, k.call)
	for _, want := range []uint64{94, 95} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("after restart: xid %d, want %d", e.Code, want)
		}
	}
	waitReads(t, k, 2)
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("after restart: events %v repeated", got)
	}
	if got := testutil.ToFloat64(r.reader.metrics.lost); got != 0 {
		t.Errorf("lost = %v, want 0", got)
	}

	// A restart whose cursor is the third of four lines in one
	// microsecond: the fourth and what follows are new.
	if err := SaveCursor(state, Cursor{BootID: "boot-a", SyslogUsec: 2_000_000, SyslogCount: 3}); err != nil {
		t.Fatal(err)
	}
	r = startWith(t, cfg, k.call)
	for _, want := range []uint64{63, 79, 94, 95} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("cursor in a run of equal time stamps: xid %d, want %d", e.Code, want)
		}
	}
	r.stop()

	// A new boot: the whole buffer.
	setBoot(t, root, "boot-b")
	k.set(xidLine(500_000, 13))
	r = startWith(t, cfg, k.call)
	if e := r.next(t); e.Code != 13 {
		t.Fatalf("new boot: xid %d, want 13", e.Code)
	}
	r.stop()
	if c, _ := LoadCursor(state); c.BootID != "boot-b" || c.SyslogUsec != 500_000 || c.SyslogCount != 1 {
		t.Errorf("cursor after the new boot: %+v", c)
	}
}

// TestSyslogResume: where the lines after a cursor start, the cursor's
// time stamp inside a message not taken for a line's.
func TestSyslogResume(t *testing.T) {
	data := []byte(xidLine(1_000_000, 13) +
		FormatSyslog(6, 1_500_000, "echo '<6>[    2.000000] x' > /dev/kmsg said [    2.000000]") +
		xidLine(2_000_000, 31) + xidLine(2_000_000, 43) + xidLine(3_000_000, 48))
	lineStart := func(n int) int { // offset of line n (0-based)
		off := 0
		for range n {
			off += bytes.IndexByte(data[off:], '\n') + 1
		}
		return off
	}
	r, err := NewReader(Config{}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		cur  Cursor
		want int
	}{
		{Cursor{}, 0},
		{Cursor{SyslogUsec: 1_000_000, SyslogCount: 1}, lineStart(1)},
		{Cursor{SyslogUsec: 2_000_000, SyslogCount: 1}, lineStart(3)},
		{Cursor{SyslogUsec: 2_000_000, SyslogCount: 2}, lineStart(4)},
		{Cursor{SyslogUsec: 2_000_000, SyslogCount: 5}, lineStart(4)}, // fewer there: after the last
		{Cursor{SyslogUsec: 3_000_000, SyslogCount: 1}, len(data)},
		{Cursor{SyslogUsec: 1_200_000, SyslogCount: 1}, lineStart(1)}, // not there, older lines are
		{Cursor{SyslogUsec: 9_000_000, SyslogCount: 1}, len(data)},
	} {
		r.cur = tt.cur
		if got := r.syslogResume(data, 1<<20); got != tt.want {
			t.Errorf("cursor %+v: resume at %d, want %d", tt.cur, got, tt.want)
		}
	}
	if got := testutil.ToFloat64(r.metrics.lost); got != 0 {
		t.Errorf("lost = %v, want 0", got)
	}
}

// TestSyslogLost: a cursor older than the oldest line of a full ring
// buffer means lines were overwritten between reads (counted, and what is
// there read); a small buffer whose lines are all newer was cleared (not
// counted).
func TestSyslogLost(t *testing.T) {
	var full strings.Builder
	usec := uint64(10_000_000)
	for full.Len() < 3000 {
		full.WriteString(FormatSyslog(6, usec, "usb 1-1: new high-speed USB device number 2 using xhci_hcd"))
		usec += 10
	}
	full.WriteString(xidLine(usec, 79))
	for _, tt := range []struct {
		name string
		size int
		lost float64
	}{
		{"wrapped", full.Len(), 1},
		{"cleared", 4 * full.Len(), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, state := t.TempDir(), t.TempDir()
			setBoot(t, root, "boot-a")
			if err := SaveCursor(state, Cursor{BootID: "boot-a", SyslogUsec: 5_000_000, SyslogCount: 1}); err != nil {
				t.Fatal(err)
			}
			k := &fakeKlogctl{size: tt.size, text: full.String()}
			r := startWith(t, Config{Mode: ModeSyslog, HostRoot: root, StateDir: state}, k.call)
			if e := r.next(t); e.Code != 79 {
				t.Fatalf("xid %d, want 79", e.Code)
			}
			waitReads(t, k, 2)
			r.stop()
			if got := testutil.ToFloat64(r.reader.metrics.lost); got != tt.lost {
				t.Errorf("lost = %v, want %v", got, tt.lost)
			}
		})
	}
}

// TestSyslogPrintkTimeOff: lines without time stamps fail the syslog(2)
// source as unavailable, so auto mode reads the journal; in syslog mode
// it is a source failure, retried.
func TestSyslogPrintkTimeOff(t *testing.T) {
	k := &fakeKlogctl{size: 1 << 16, text: "<6>Linux version 6.8.0\n<4>NVRM: Xid (PCI:0000:3b:00): 79, x\n"}
	r, err := NewReader(Config{Mode: ModeSyslog, HostRoot: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.klogctl = k.call
	err = r.readSyslog(t.Context(), func(e Event) { t.Errorf("event %+v", e) })
	if !errors.Is(err, errPrintkTimeOff) || !errors.Is(err, errUnavailable) {
		t.Fatalf("readSyslog error %v, want printk time stamps off, unavailable", err)
	}

	root, bin := t.TempDir(), t.TempDir()
	setBoot(t, root, "boot-a")
	jctl := fakeJournalctl(t, bin, journalEntryJSON("s=1", "NVRM: Xid (PCI:0000:3b:00): 48, x"))
	run := startWith(t, Config{Mode: ModeAuto, HostRoot: root, Journalctl: []string{jctl}}, k.call)
	if e := run.next(t); e.Code != 48 {
		t.Fatalf("auto: xid %d, want 48 from the journal", e.Code)
	}
	if got := testutil.ToFloat64(run.reader.metrics.up.WithLabelValues(SourceJournal)); got != 1 {
		t.Errorf("kernel_log_up{source=journal} = %v, want 1", got)
	}

	run = startWith(t, Config{Mode: ModeSyslog, HostRoot: root}, k.call)
	waitFor(t, "two syslog source failures", func() bool {
		return testutil.ToFloat64(run.reader.metrics.errors.WithLabelValues(SourceSyslog)) >= 2
	})
	if got := run.codes(); len(got) != 0 {
		t.Errorf("events %v from lines without time stamps", got)
	}
}

// TestAutoSyslogBeforeJournal: where /dev/kmsg cannot be opened, auto mode
// reads syslog(2) and does not run journalctl; where syslog(2) is refused
// (EPERM), it reads the journal.
func TestAutoSyslogBeforeJournal(t *testing.T) {
	root, bin := t.TempDir(), t.TempDir() // no dev/kmsg: ENOENT
	setBoot(t, root, "boot-a")
	jctl := fakeJournalctl(t, bin, journalEntryJSON("s=1", "NVRM: Xid (PCI:0000:3b:00): 48, x"))
	k := &fakeKlogctl{size: 1 << 16, text: xidLine(1_000_000, 79)}
	r := startWith(t, Config{Mode: ModeAuto, HostRoot: root, Journalctl: []string{jctl}}, k.call)
	if e := r.next(t); e.Code != 79 {
		t.Fatalf("xid %d, want 79 from syslog(2)", e.Code)
	}
	waitReads(t, k, 2)
	if got := testutil.ToFloat64(r.reader.metrics.up.WithLabelValues(SourceSyslog)); got != 1 {
		t.Errorf("kernel_log_up{source=syslog} = %v, want 1", got)
	}
	if got := r.codes(); len(got) != 0 {
		t.Errorf("extra events %v", got)
	}
	if _, err := os.Stat(filepath.Join(bin, "args")); err == nil {
		t.Error("journalctl ran although syslog(2) could be read")
	}

	refused := &fakeKlogctl{err: unix.EPERM}
	r = startWith(t, Config{Mode: ModeAuto, HostRoot: root, Journalctl: []string{jctl}}, refused.call)
	if e := r.next(t); e.Code != 48 {
		t.Fatalf("xid %d, want 48 from the journal", e.Code)
	}
	r.stop()
	if n := testutil.CollectAndCount(r.reader.metrics.errors); n != 0 {
		t.Errorf("%d source error series, want none (refused is unavailable, not failed)", n)
	}
}

// TestKlogctlReal calls the real syslog(2): refused (no CAP_SYSLOG under
// dmesg_restrict, a seccomp profile) it must read as unavailable; allowed,
// every line of the buffer must parse (the contents are the machine's).
func TestKlogctlReal(t *testing.T) {
	size, err := unix.Klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil {
		if !errors.Is(syslogErr("SYSLOG_ACTION_SIZE_BUFFER", err), errUnavailable) {
			t.Fatalf("syslog(2) refused with %v: not taken as unavailable", err)
		}
		t.Logf("syslog(2) refused here (%v): taken as unavailable", err)
		return
	}
	buf := make([]byte, 2*size)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		if !errors.Is(syslogErr("SYSLOG_ACTION_READ_ALL", err), errUnavailable) {
			t.Fatalf("READ_ALL refused with %v: not taken as unavailable", err)
		}
		t.Logf("READ_ALL refused here (%v)", err)
		return
	}
	if n > len(buf) {
		t.Fatalf("READ_ALL returned %d bytes into %d", n, len(buf))
	}
	data := buf[:n]
	if n > 0 && !hasSyslogTime(data) {
		t.Logf("printk time stamps are off here: the source reports unavailable")
		return
	}
	lines := 0
	for line := range bytes.Lines(data) {
		lines++
		if _, err := ParseSyslogLine(line); err != nil {
			t.Errorf("line %d: %v", lines, err)
		}
	}
	t.Logf("%d bytes, %d lines, SYSLOG_ACTION_SIZE_BUFFER %d", n, lines, size)
}

// syntheticRing is about 1 MiB of syslog(2) text: lines of kernel chatter
// with an XID line every 100, time stamps 10µs apart.
func syntheticRing() (data []byte, lastUsec uint64) {
	var b bytes.Buffer
	usec := uint64(1_000_000)
	for i := 0; b.Len() < 1<<20; i++ {
		if i%100 == 99 {
			b.WriteString(xidLine(usec, 13))
		} else {
			fmt.Fprintf(&b, "<6>[%5d.%06d] eth0: renamed from veth%08x, link becomes ready on port %d\n", usec/1e6, usec%1e6, i, i%48)
		}
		lastUsec = usec
		usec += 10
	}
	return b.Bytes(), lastUsec
}

// BenchmarkSyslogPoll is one poll's work after the copy: a 1 MiB buffer
// whose last line is new (the byte search for the cursor, then one line
// parsed).
func BenchmarkSyslogPoll(b *testing.B) {
	data, last := syntheticRing()
	r, err := NewReader(Config{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	cur := Cursor{SyslogUsec: last - 10, SyslogCount: 1}
	events := 0
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r.cur = cur
		r.syslogLines(data, len(data), func(Event) { events++ })
	}
	if r.cur.SyslogUsec != last {
		b.Fatalf("cursor at %d, want %d", r.cur.SyslogUsec, last)
	}
}

// BenchmarkSyslogFirstRead parses every line of a 1 MiB buffer (a first
// start, or a new boot).
func BenchmarkSyslogFirstRead(b *testing.B) {
	data, _ := syntheticRing()
	r, err := NewReader(Config{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r.cur = Cursor{}
		r.syslogLines(data, len(data), func(Event) {})
	}
}

// BenchmarkKlogctlReadAll is the copy itself: the real syslog(2)
// READ_ALL of this machine's ring buffer (skipped where it is refused).
func BenchmarkKlogctlReadAll(b *testing.B) {
	size, err := unix.Klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil {
		b.Skipf("syslog(2) refused: %v", err)
	}
	buf := make([]byte, 2*size)
	var n int
	for b.Loop() {
		if n, err = unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(size), "ring-bytes")
}

package kernlog

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// hostTree is a host root with proc/sys/kernel/random/boot_id = boot and
// an empty dev/kmsg regular file.
func hostTree(t *testing.T, boot string) string {
	t.Helper()
	root := t.TempDir()
	setBoot(t, root, boot)
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev/kmsg"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func setBoot(t *testing.T, root, boot string) {
	t.Helper()
	dir := filepath.Join(root, "proc/sys/kernel/random")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte(boot+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// appendXID appends a kmsg record of XID code on bus 0000:3b:00.
func appendXID(t *testing.T, root string, seq, code uint64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(root, "dev/kmsg"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	msg := "NVRM: Xid (PCI:0000:3b:00): " + strconv.FormatUint(code, 10) + ", pid=1, name=x, test"
	if _, err := f.WriteString(FormatKmsg(4, seq, seq*1000, msg) + " SUBSYSTEM=pci\n"); err != nil {
		t.Fatal(err)
	}
}

// running is a Reader running in the background, its events on a channel.
type running struct {
	reader *Reader
	reg    *prometheus.Registry
	events chan Event
	stop   func()
}

// start runs a reader whose syslog(2) calls are refused (EPERM, as
// without CAP_SYSLOG under dmesg_restrict), so auto mode does not depend
// on the test machine's kernel log.
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	return startWith(t, cfg, refusedKlogctl)
}

func refusedKlogctl(int, []byte) (int, error) { return 0, unix.EPERM }

// startWith is start with a syslog(2) stand-in.
func startWith(t *testing.T, cfg Config, klogctl klogctlFunc) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Poll = 10 * time.Millisecond
	if cfg.SyslogPoll == 0 {
		cfg.SyslogPoll = 10 * time.Millisecond
	}
	if cfg.Retry == 0 {
		cfg.Retry = 20 * time.Millisecond
	}
	r, err := NewReader(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	r.klogctl = klogctl
	ctx, cancel := context.WithCancel(context.Background())
	ev := make(chan Event, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx, func(e Event) { ev <- e })
	}()
	run := &running{reader: r, reg: reg, events: ev}
	run.stop = func() { cancel(); <-done }
	t.Cleanup(run.stop)
	return run
}

// next waits for the next event (go test -timeout bounds a hang).
func (r *running) next(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no kernel log event")
		return Event{}
	}
}

// codes stops the reader and returns the codes of every event it saw.
func (r *running) codes() []uint64 {
	r.stop()
	var out []uint64
	for {
		select {
		case e := <-r.events:
			out = append(out, e.Code)
		default:
			return out
		}
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCursorRestart: a restart on the same boot neither repeats nor loses
// records (those written while the agent was down included); a new boot
// reads the whole buffer.
func TestCursorRestart(t *testing.T) {
	root := hostTree(t, "boot-a")
	state := t.TempDir()
	cfg := Config{Mode: ModeKmsg, HostRoot: root, StateDir: state}
	appendXID(t, root, 1, 13)
	appendXID(t, root, 2, 31)

	r := start(t, cfg)
	r.next(t)
	r.next(t)
	appendXID(t, root, 3, 43) // followed as the file grows
	if e := r.next(t); e.Code != 43 {
		t.Fatalf("followed record: xid %d, want 43", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("extra events %v", got)
	}
	c, err := LoadCursor(state)
	if err != nil || c.BootID != "boot-a" || !c.HasSeq || c.Seq != 3 {
		t.Fatalf("cursor after the first run: %+v, %v", c, err)
	}

	// Down while a record arrives: it is read on restart, the old ones not.
	appendXID(t, root, 4, 48)
	r = start(t, cfg)
	if e := r.next(t); e.Code != 48 {
		t.Fatalf("after restart: xid %d, want 48 (the record written while down)", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("after restart: events %v repeated", got)
	}

	// A new boot: the whole buffer.
	setBoot(t, root, "boot-b")
	r = start(t, cfg)
	for _, want := range []uint64{13, 31, 43, 48} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("new boot: xid %d, want %d", e.Code, want)
		}
	}
	r.stop()
	if c, _ := LoadCursor(state); c.BootID != "boot-b" || c.Seq != 4 {
		t.Errorf("cursor after the new boot: %+v", c)
	}
}

// TestCorruptCursor: an unusable cursor file is reported (metric) and the
// whole buffer is read.
func TestCorruptCursor(t *testing.T) {
	root := hostTree(t, "boot-a")
	state := t.TempDir()
	appendXID(t, root, 1, 13)
	appendXID(t, root, 2, 31)
	if err := os.WriteFile(filepath.Join(state, CursorFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, Config{Mode: ModeKmsg, HostRoot: root, StateDir: state})
	r.next(t)
	r.next(t)
	r.stop()
	if got := testutil.ToFloat64(r.reader.metrics.cursorErrors); got != 1 {
		t.Errorf("cursor errors = %v, want 1", got)
	}
	if c, err := LoadCursor(state); err != nil || c.Seq != 2 {
		t.Errorf("cursor rewritten: %+v, %v", c, err)
	}
}

// TestLostRecordsCounted: a sequence gap after the cursor (records the
// ring buffer overwrote while nobody read) is counted.
func TestLostRecordsCounted(t *testing.T) {
	root := hostTree(t, "boot-a")
	state := t.TempDir()
	if err := SaveCursor(state, Cursor{BootID: "boot-a", Seq: 2, HasSeq: true}); err != nil {
		t.Fatal(err)
	}
	appendXID(t, root, 1, 13) // already handled
	appendXID(t, root, 7, 79) // 3..6 were overwritten
	r := start(t, Config{Mode: ModeKmsg, HostRoot: root, StateDir: state})
	if e := r.next(t); e.Code != 79 {
		t.Fatalf("xid %d, want 79", e.Code)
	}
	r.stop()
	if got := testutil.ToFloat64(r.reader.metrics.lost); got != 4 {
		t.Errorf("lost = %v, want 4", got)
	}
}

// fakeDevice is /dev/kmsg as read(2) answers: records and errnos in
// order, then EAGAIN.
type fakeDevice struct {
	reads  []any // string (a record) or error
	cancel func()
}

func (d *fakeDevice) Read(buf []byte) (int, error) {
	if len(d.reads) == 0 {
		d.cancel()
		return 0, unix.EAGAIN
	}
	next := d.reads[0]
	d.reads = d.reads[1:]
	if err, ok := next.(error); ok {
		return 0, err
	}
	return copy(buf, next.(string)), nil
}

func (d *fakeDevice) Wait(time.Duration) error { return nil }

// TestDeviceEPIPE: EPIPE (the next record was overwritten) is passed over
// and what it skipped is counted; EAGAIN and EINTR are not failures.
func TestDeviceEPIPE(t *testing.T) {
	r, err := NewReader(Config{Mode: ModeKmsg, HostRoot: t.TempDir()}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	xid := func(seq, code uint64) string {
		return FormatKmsg(4, seq, 1, "NVRM: Xid (PCI:0000:3b:00): "+strconv.FormatUint(code, 10)+", x")
	}
	dev := &fakeDevice{cancel: cancel, reads: []any{
		xid(1, 13), unix.EINTR, xid(2, 31), unix.EPIPE, xid(9, 79), unix.EAGAIN, xid(10, 48),
	}}
	var got []uint64
	if err := r.readRecords(ctx, dev, func(e Event) { got = append(got, e.Code) }); err != nil {
		t.Fatal(err)
	}
	if !equal(got, []uint64{13, 31, 79, 48}) {
		t.Errorf("events %v, want [13 31 79 48]", got)
	}
	if lost := testutil.ToFloat64(r.metrics.lost); lost != 6 {
		t.Errorf("lost = %v, want 6 (seq 3..8)", lost)
	}
}

// fakeJournalctl writes a journalctl stand-in that logs its arguments to
// <dir>/args and prints entries (one JSON object per line), then waits as
// journalctl -f does.
func fakeJournalctl(t *testing.T, dir string, entries ...string) string {
	t.Helper()
	path := filepath.Join(dir, "journalctl")
	script := "#!/bin/sh\necho \"$*\" >> " + filepath.Join(dir, "args") + "\ncat <<'EOF'\n" + strings.Join(entries, "\n") + "\nEOF\nexec sleep 600\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// journalEntryJSON is one entry as journalctl -o json prints it (fields
// from systemd.journal-fields(7); a kernel entry's MESSAGE is the record).
func journalEntryJSON(cursor, msg string) string {
	return `{"__CURSOR":"` + cursor + `","__REALTIME_TIMESTAMP":"1732838400000000","__MONOTONIC_TIMESTAMP":"1843308145","_BOOT_ID":"7f1e","PRIORITY":"4","_TRANSPORT":"kernel","SYSLOG_IDENTIFIER":"kernel","MESSAGE":"` + msg + `"}`
}

// TestJournalFallback: without /dev/kmsg, auto mode reads the journal
// through journalctl, persists its __CURSOR and resumes after it.
func TestJournalFallback(t *testing.T) {
	root := t.TempDir() // no dev/kmsg: ENOENT
	setBoot(t, root, "boot-a")
	state, bin := t.TempDir(), t.TempDir()
	jctl := fakeJournalctl(t, bin,
		journalEntryJSON("s=1;i=a1", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."),
		`{"__CURSOR":"s=1;i=a2","MESSAGE":[110,118,105,100,105,97,45,110,118,115,119,105,116,99,104,48,58,32,83,88,105,100,32,40,80,67,73,58,48,48,48,48,58,99,51,58,48,48,46,48,41,58,32,50,52,48,48,55,44,32,70,97,116,97,108,44,32,76,105,110,107,32,50,56,32,255]}`,
		journalEntryJSON("s=1;i=a3", "usb 1-1: new high-speed USB device"))
	cfg := Config{Mode: ModeAuto, HostRoot: root, StateDir: state, Journalctl: []string{jctl}}
	r := start(t, cfg)
	if e := r.next(t); e.Kind != KindXID || e.Code != 79 {
		t.Fatalf("first journal event %+v, want xid 79", e)
	}
	// MESSAGE as an array of bytes (not UTF-8).
	if e := r.next(t); e.Kind != KindSXID || e.Code != 24007 || !e.Fatal {
		t.Fatalf("second journal event %+v, want fatal sxid 24007", e)
	}
	waitFor(t, "the journal cursor saved", func() bool {
		c, _ := LoadCursor(state)
		return c.JournalCursor == "s=1;i=a2"
	})
	if got := testutil.ToFloat64(r.reader.metrics.up.WithLabelValues(SourceJournal)); got != 1 {
		t.Errorf("kernel_log_up{source=journal} = %v, want 1", got)
	}
	r.stop()
	if c, _ := LoadCursor(state); c.JournalCursor != "s=1;i=a3" {
		t.Errorf("cursor at stop %+v, want the last entry's", c)
	}

	// Restart: journalctl is asked for what follows the cursor.
	fakeJournalctl(t, bin)
	r = start(t, cfg)
	waitFor(t, "journalctl run again", func() bool {
		b, _ := os.ReadFile(filepath.Join(bin, "args"))
		return strings.Count(string(b), "\n") == 2
	})
	r.stop()
	b, _ := os.ReadFile(filepath.Join(bin, "args"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if !strings.Contains(lines[0], "-k -o json") || strings.Contains(lines[0], "--after-cursor") {
		t.Errorf("first run arguments %q: want -k -o json, no cursor", lines[0])
	}
	if !strings.HasSuffix(lines[1], "--after-cursor=s=1;i=a3") {
		t.Errorf("restart arguments %q: want --after-cursor=s=1;i=a3", lines[1])
	}
}

// TestJournalExitRetried: a journalctl that exits is a source failure
// (metric, kernel_log_up 0) and is run again.
func TestJournalExitRetried(t *testing.T) {
	bin := t.TempDir()
	path := filepath.Join(bin, "journalctl")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho run >> "+filepath.Join(bin, "args")+"\necho 'Failed to open journal' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := start(t, Config{Mode: ModeJournal, HostRoot: t.TempDir(), Journalctl: []string{path}})
	waitFor(t, "journalctl run three times", func() bool {
		b, _ := os.ReadFile(filepath.Join(bin, "args"))
		return strings.Count(string(b), "run") >= 3
	})
	// Between runs (Retry) the source is down.
	waitFor(t, "kernel_log_up{source=journal} 0", func() bool {
		return testutil.ToFloat64(r.reader.metrics.up.WithLabelValues(SourceJournal)) == 0
	})
	r.stop()
	if got := testutil.ToFloat64(r.reader.metrics.errors.WithLabelValues(SourceJournal)); got < 2 {
		t.Errorf("journal source errors = %v, want at least 2", got)
	}
}

// TestModeKmsgUnavailable: kmsg mode does not fall back to the journal.
func TestModeKmsgUnavailable(t *testing.T) {
	bin := t.TempDir()
	jctl := fakeJournalctl(t, bin, journalEntryJSON("s=1", "NVRM: Xid (PCI:0000:3b:00): 79, x"))
	r := start(t, Config{Mode: ModeKmsg, HostRoot: t.TempDir(), Journalctl: []string{jctl}})
	waitFor(t, "a kmsg failure", func() bool {
		return testutil.ToFloat64(r.reader.metrics.errors.WithLabelValues(SourceKmsg)) >= 1
	})
	if got := r.codes(); len(got) != 0 {
		t.Errorf("events %v from the journal in kmsg mode", got)
	}
	if _, err := os.Stat(filepath.Join(bin, "args")); err == nil {
		t.Error("journalctl ran in kmsg mode")
	}
}

func TestNewReaderRejectsMode(t *testing.T) {
	if _, err := NewReader(Config{Mode: "dmesg"}, nil, nil); err == nil || !strings.Contains(err.Error(), `"dmesg"`) {
		t.Errorf("NewReader(mode dmesg) error %v, want one naming the mode", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAutoFindsNoSource: auto mode with neither /dev/kmsg nor a journalctl
// under the host root is no data (kernel_log_up{source="none"} 0, no
// source error), and it looks again later.
func TestAutoFindsNoSource(t *testing.T) {
	root := t.TempDir()
	r := start(t, Config{Mode: ModeAuto, HostRoot: root, UnavailableRetry: 10 * time.Millisecond})
	waitFor(t, "kernel_log_up{source=none}", func() bool {
		return testutil.CollectAndCount(r.reader.metrics.up, "gpu_node_agent_kernel_log_up") == 1 &&
			testutil.ToFloat64(r.reader.metrics.up.WithLabelValues(SourceNone)) == 0
	})
	// It looks again: a /dev/kmsg that appears is read.
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev/kmsg"), []byte(FormatKmsg(4, 1, 1, "NVRM: Xid (PCI:0000:3b:00): 79, x")), 0o644); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Code != 79 {
		t.Fatalf("xid %d, want 79", e.Code)
	}
	r.stop()
	if n := testutil.CollectAndCount(r.reader.metrics.errors); n != 0 {
		t.Errorf("%d source error series, want none", n)
	}
	if got := testutil.ToFloat64(r.reader.metrics.up.WithLabelValues(SourceKmsg)); got != 1 {
		t.Errorf("kernel_log_up{source=kmsg} = %v, want 1", got)
	}
}

// TestFirstStartHorizon: with no cursor file, a fault logged longer than
// FirstStartHorizon before the start is history (counted, not handed on),
// one within it is handed on; once the cursor exists, a restart hands on
// whatever is past it, however old; a new boot reads the whole buffer; a
// corrupt cursor file counts as none.
func TestFirstStartHorizon(t *testing.T) {
	root := hostTree(t, "boot-a")
	state := t.TempDir()
	// appendXID stamps record seq at seq ms since boot; "now" is 10 s
	// after boot, the horizon 5 s: seq 1..4999 are history.
	uptime := func() time.Duration { return 10 * time.Second }
	cfg := Config{Mode: ModeKmsg, HostRoot: root, StateDir: state, FirstStartHorizon: 5 * time.Second, Uptime: uptime}
	appendXID(t, root, 1000, 79)
	appendXID(t, root, 6000, 48)

	r := start(t, cfg)
	if e := r.next(t); e.Code != 48 {
		t.Fatalf("first start: xid %d handed on, want 48 (79 is history)", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("first start: extra events %v", got)
	}
	if got := testutil.ToFloat64(r.reader.metrics.history.WithLabelValues(KindXID)); got != 1 {
		t.Errorf("history events = %v, want 1", got)
	}

	// The cursor exists now: an old record past it is not history.
	appendXID(t, root, 6001, 13)
	later := func() time.Duration { return time.Hour }
	cfg.Uptime = later
	r = start(t, cfg)
	if e := r.next(t); e.Code != 13 {
		t.Fatalf("restart: xid %d, want 13", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("restart: extra events %v", got)
	}

	// A new boot with the cursor of the last one: the whole buffer.
	setBoot(t, root, "boot-b")
	r = start(t, cfg)
	for _, want := range []uint64{79, 48, 13} {
		if e := r.next(t); e.Code != want {
			t.Fatalf("new boot: xid %d, want %d", e.Code, want)
		}
	}
	r.stop()

	// A corrupt cursor file counts as none.
	if err := os.WriteFile(filepath.Join(state, CursorFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Uptime = uptime
	r = start(t, cfg)
	if e := r.next(t); e.Code != 48 {
		t.Fatalf("corrupt cursor: xid %d handed on first, want 48 (79 is history)", e.Code)
	}
	if e := r.next(t); e.Code != 13 {
		t.Fatalf("corrupt cursor: xid %d, want 13", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("corrupt cursor: extra events %v", got)
	}

	// No persistence at all: every start is a first start.
	r = start(t, Config{Mode: ModeKmsg, HostRoot: root, FirstStartHorizon: 5 * time.Second, Uptime: uptime})
	if e := r.next(t); e.Code != 48 {
		t.Fatalf("no state dir: xid %d handed on first, want 48", e.Code)
	}
	if e := r.next(t); e.Code != 13 {
		t.Fatalf("no state dir: xid %d, want 13", e.Code)
	}
	if got := r.codes(); len(got) != 0 {
		t.Fatalf("no state dir: extra events %v", got)
	}
}

// TestJournalUnreadableLineRestarts: a journal line over the reader's
// limit ends that journalctl (which follows, -f, and would never exit on
// its own) and counts a source error; it is run again after Retry.
func TestJournalUnreadableLineRestarts(t *testing.T) {
	bin := t.TempDir()
	path := fakeJournalctl(t, bin, journalEntryJSON("s=1", strings.Repeat("x", 1100*1024)))
	r := start(t, Config{Mode: ModeJournal, HostRoot: t.TempDir(), Journalctl: []string{path}})
	waitFor(t, "journalctl run twice", func() bool {
		b, _ := os.ReadFile(filepath.Join(bin, "args"))
		return strings.Count(string(b), "\n") >= 2
	})
	r.stop()
	if got := testutil.ToFloat64(r.reader.metrics.errors.WithLabelValues(SourceJournal)); got < 1 {
		t.Errorf("journal source errors = %v, want at least 1", got)
	}
}

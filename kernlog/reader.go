package kernlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Modes say where the kernel log is read from (agent config
// health.kernelLog).
const (
	// ModeAuto reads /dev/kmsg; where it cannot be opened (EPERM,
	// EACCES, ENOENT: a device cgroup without it, dmesg_restrict without
	// CAP_SYSLOG, a sandbox), the ring buffer through syslog(2); where
	// that is refused too (or the kernel prints no time stamps), the
	// journal.
	ModeAuto = "auto"
	// ModeKmsg reads /dev/kmsg only.
	ModeKmsg = "kmsg"
	// ModeSyslog reads the ring buffer through syslog(2) only.
	ModeSyslog = "syslog"
	// ModeJournal reads the host's systemd journal only.
	ModeJournal = "journal"
	// ModeOff reads nothing.
	ModeOff = "off"
)

// Modes lists the modes.
func Modes() []string { return []string{ModeAuto, ModeKmsg, ModeSyslog, ModeJournal, ModeOff} }

// ValidMode says whether m is a mode ("" counts as ModeAuto).
func ValidMode(m string) bool { return m == "" || slices.Contains(Modes(), m) }

// Config configures a Reader.
type Config struct {
	// Mode is one of the Mode* constants; "" is ModeAuto.
	Mode string
	// HostRoot is where the host's / is mounted: dev/kmsg and
	// proc/sys/kernel/random/boot_id are read under it, and the journal
	// is read by the journalctl under it. "" is /.
	HostRoot string
	// StateDir holds CursorFile; "" keeps no cursor (every start reads
	// the whole buffer).
	StateDir string
	// Journalctl is the command that runs the host's journalctl (its
	// arguments are appended); empty runs <HostRoot>/usr/bin/journalctl
	// (or bin/journalctl) chrooted into HostRoot.
	Journalctl []string
	// Retry is the wait before a failed source is opened again; default
	// 10s.
	Retry time.Duration
	// UnavailableRetry is the wait before ModeAuto looks again for a
	// source after finding none; default 1m.
	UnavailableRetry time.Duration
	// Poll is how often a regular file standing for /dev/kmsg is checked
	// for new records, and how long a poll(2) on /dev/kmsg waits before
	// the context is checked; default 250ms.
	Poll time.Duration
	// SyslogPoll is how often the syslog(2) source copies the ring
	// buffer; default DefaultSyslogPoll.
	SyslogPoll time.Duration
	// FirstStartHorizon: with no cursor file at all (the agent's first
	// start on the node, an agent upgraded from a version that kept
	// none, or no StateDir), a fault logged longer than this before the
	// start is history: counted and logged, not handed on, so that
	// rolling the agent out over a fleet does not hold GPUs for XIDs a
	// reset answered long ago, while a fault of the boot the agent was
	// started in is still seen. 0 hands on every record. A corrupt
	// cursor file counts as none; a cursor from another boot reads the
	// whole buffer (every record came after the last run).
	FirstStartHorizon time.Duration
	// Uptime is the time since boot in the clock of the records' time
	// stamps (printk's local_clock, the journal's monotonic time stamp);
	// nil reads CLOCK_MONOTONIC. Tests set it.
	Uptime func() time.Duration
}

// DefaultSyslogPoll is the syslog(2) source's default poll interval: a
// fault line is seen within a second, as NVML's XID events are, and each
// poll costs one copy of the ring buffer (BenchmarkKlogctlReadAll: about
// 0.9µs a line in the kernel) and a byte search for the cursor
// (BenchmarkSyslogPoll: 0.16ms for 1 MiB), about 1% of a core for a full
// 1 MiB ring and less for the usual emptier one (docs/health.md). Lines
// are lost only if the kernel logs more than the whole ring buffer within
// one interval.
const DefaultSyslogPoll = time.Second

func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.HostRoot == "" {
		c.HostRoot = "/"
	}
	if c.Retry == 0 {
		c.Retry = 10 * time.Second
	}
	if c.UnavailableRetry == 0 {
		c.UnavailableRetry = time.Minute
	}
	if c.Poll == 0 {
		c.Poll = 250 * time.Millisecond
	}
	if c.SyslogPoll == 0 {
		c.SyslogPoll = DefaultSyslogPoll
	}
	if c.Uptime == nil {
		c.Uptime = monotonicUptime
	}
	return c
}

// monotonicUptime is CLOCK_MONOTONIC: time since boot, without suspend,
// as printk's time stamps (local_clock) and the journal's
// __MONOTONIC_TIMESTAMP count it.
func monotonicUptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// errUnavailable marks a source that cannot be opened at all (as opposed
// to one that failed while being read): ModeAuto then tries the next one.
var errUnavailable = errors.New("unavailable")

// Sources, as the metrics' source label names them. SourceNone is
// ModeAuto finding no source available.
const (
	SourceKmsg    = "kmsg"
	SourceSyslog  = "syslog"
	SourceJournal = "journal"
	SourceNone    = "none"
)

// Reader reads the kernel log and hands every GPU fault it finds to a
// handler.
type Reader struct {
	cfg     Config
	log     *slog.Logger
	metrics *readerMetrics

	parser Parser
	cur    Cursor
	dirty  bool
	// saidNone is set once the absence of every source was logged.
	saidNone bool
	// klogctl is the syslog(2) call; nil is unix.Klogctl (tests set it).
	klogctl klogctlFunc
	// syslogCounts counts the syslog(2) lines handled per time stamp in
	// the current read (the cursor's count).
	syslogCounts map[uint64]int
	// firstStart is set when there was no cursor file (Config.
	// FirstStartHorizon).
	firstStart bool
}

// NewReader builds a reader; reg may be nil (no metrics).
func NewReader(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Reader, error) {
	if !ValidMode(cfg.Mode) {
		return nil, fmt.Errorf("kernel log mode %q: must be one of %v", cfg.Mode, Modes())
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	met, err := newReaderMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Reader{cfg: cfg.withDefaults(), log: log, metrics: met}, nil
}

// Run reads until ctx ends, calling handle (on Run's goroutine) for every
// event, in log order. A source that fails is opened again after Retry;
// in ModeAuto an unavailable /dev/kmsg is replaced by syslog(2), and that
// by the journal (/dev/kmsg is tried again first after each failure). It
// returns nil when ctx ends.
func (r *Reader) Run(ctx context.Context, handle func(Event)) error {
	if r.cfg.Mode == ModeOff {
		return nil
	}
	r.loadCursor()
	for ctx.Err() == nil {
		var err error
		var source string
		switch r.cfg.Mode {
		case ModeKmsg:
			source, err = SourceKmsg, r.readKmsg(ctx, handle)
		case ModeSyslog:
			source, err = SourceSyslog, r.readSyslog(ctx, handle)
		case ModeJournal:
			source, err = SourceJournal, r.readJournal(ctx, handle)
		default:
			source, err = r.readAuto(ctx, handle)
		}
		r.saveCursor()
		if ctx.Err() != nil {
			break
		}
		r.metrics.setUp(source, false)
		if source == SourceNone {
			level := slog.LevelDebug
			if !r.saidNone {
				level, r.saidNone = slog.LevelInfo, true
			}
			r.log.Log(ctx, level, "kernel log unavailable: neither /dev/kmsg, syslog(2) nor the host's journalctl can be used; faults are seen through NVML only (health.kernelLog: off says so on purpose)",
				"reason", err, "retry", r.cfg.UnavailableRetry)
			select {
			case <-ctx.Done():
			case <-time.After(r.cfg.UnavailableRetry):
			}
			continue
		}
		r.metrics.errors.WithLabelValues(source).Inc()
		r.log.Warn("kernel log source failed; retrying", "source", source, "error", err, "retry", r.cfg.Retry)
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Retry):
		}
	}
	return nil
}

// readAuto reads the first source that is available, in order of what
// they give: /dev/kmsg (sequence numbers, reads that wake on a new
// record), syslog(2) (a copy of the buffer per poll, no sequence
// numbers), the journal (the host's journalctl under the host root). It
// returns the source read and its error, or SourceNone and every
// source's reason when none is available: no data, not a failure, said
// once and tried again quietly.
func (r *Reader) readAuto(ctx context.Context, handle func(Event)) (string, error) {
	var reasons []error
	for _, s := range []struct {
		name string
		read func(context.Context, func(Event)) error
	}{
		{SourceKmsg, r.readKmsg},
		{SourceSyslog, r.readSyslog},
		{SourceJournal, r.readJournal},
	} {
		err := s.read(ctx, handle)
		if !errors.Is(err, errUnavailable) {
			return s.name, err
		}
		r.log.Debug("kernel log: source unavailable; trying the next", "source", s.name, "reason", err)
		reasons = append(reasons, err)
	}
	return SourceNone, errors.Join(reasons...)
}

// loadCursor reads the persisted cursor and keeps what applies to this
// boot.
func (r *Reader) loadCursor() {
	r.firstStart = !CursorExists(r.cfg.StateDir)
	cur, err := LoadCursor(r.cfg.StateDir)
	if err != nil {
		// As good as none: the buffer is read, faults older than the
		// first-start horizon as history.
		r.firstStart = true
		r.metrics.cursorErrors.Inc()
		r.log.Warn("kernel log cursor unusable; reading the kernel log buffer as on a first start", "error", err, "horizon", r.cfg.FirstStartHorizon)
	}
	boot := ReadBootID(r.cfg.HostRoot)
	if cur.BootID != boot {
		if cur.HasSeq || cur.JournalCursor != "" || cur.SyslogCount > 0 {
			r.log.Info("kernel log: new boot; reading the whole buffer", "bootID", boot, "cursorBootID", cur.BootID)
		}
		cur = Cursor{}
	}
	cur.BootID = boot
	r.cur = cur
}

// saveCursor persists the cursor if it moved.
func (r *Reader) saveCursor() {
	if !r.dirty {
		return
	}
	if err := SaveCursor(r.cfg.StateDir, r.cur); err != nil {
		r.metrics.cursorErrors.Inc()
		r.log.Warn("kernel log cursor not saved", "error", err)
		return
	}
	r.dirty = false
}

// handleRecord parses one record, hands its event to handle and moves the
// cursor past it. A record with an event saves the cursor at once, so a
// restart does not count it again.
func (r *Reader) handleRecord(source string, rec Record, handle func(Event)) {
	r.metrics.records.WithLabelValues(source).Inc()
	ev, ok := r.parser.Parse(rec.Message)
	switch {
	case ok && r.history(rec):
		r.metrics.history.WithLabelValues(ev.Kind).Inc()
		r.log.Warn("kernel log: a fault logged before the agent's first start on this boot; not acted on",
			"kind", ev.Kind, "pci", ev.BusID, "code", ev.Code, "loggedAgo", r.cfg.Uptime()-time.Duration(rec.Usec)*time.Microsecond,
			"horizon", r.cfg.FirstStartHorizon)
		ok = false
	case ok:
		r.metrics.events.WithLabelValues(ev.Kind).Inc()
		handle(ev)
	}
	switch source {
	case SourceKmsg:
		r.cur.Seq, r.cur.HasSeq = rec.Seq, true
	case SourceSyslog:
		if r.syslogCounts == nil {
			r.syslogCounts = map[uint64]int{}
		}
		r.syslogCounts[rec.Usec]++
		r.cur.SyslogUsec, r.cur.SyslogCount = rec.Usec, r.syslogCounts[rec.Usec]
	default:
		r.cur.JournalCursor = rec.Cursor
	}
	r.dirty = true
	if ok {
		r.saveCursor()
	}
}

// history says whether rec is older than Config.FirstStartHorizon on a
// first start (no cursor file).
func (r *Reader) history(rec Record) bool {
	if !r.firstStart || r.cfg.FirstStartHorizon <= 0 {
		return false
	}
	logged := time.Duration(rec.Usec) * time.Microsecond
	return r.cfg.Uptime()-logged > r.cfg.FirstStartHorizon
}

// readerMetrics are the reader's series.
type readerMetrics struct {
	up           *prometheus.GaugeVec
	records      *prometheus.CounterVec
	lost         prometheus.Counter
	errors       *prometheus.CounterVec
	cursorErrors prometheus.Counter
	events       *prometheus.CounterVec
	history      *prometheus.CounterVec
}

func newReaderMetrics(reg prometheus.Registerer) (*readerMetrics, error) {
	m := &readerMetrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_kernel_log_up",
			Help: "Whether the kernel log is being read (1) or its source failed (0), by source: kmsg, syslog, journal, or none when health.kernelLog auto finds none available (0).",
		}, []string{"source"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_records_total",
			Help: "Kernel log records read, by source.",
		}, []string{"source"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_records_lost_total",
			Help: "Kernel log records overwritten in the kernel's ring buffer before they were read (/dev/kmsg EPIPE and sequence gaps; syslog(2): 1 each time the ring wrapped past the cursor, a lower bound).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_source_errors_total",
			Help: "Failures of a kernel log source (it is opened again after a delay), by source.",
		}, []string{"source"}),
		cursorErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_cursor_errors_total",
			Help: "Kernel log cursor files found unusable (the whole buffer is read) or not written.",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_events_total",
			Help: "GPU faults found in the kernel log, by kind (xid, sxid, fallen-off-the-bus).",
		}, []string{"kind"}),
		history: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_history_events_total",
			Help: "GPU faults in the kernel log that were logged longer than the first-start horizon before the agent's first start on the node (no cursor yet): logged, not acted on; by kind.",
		}, []string{"kind"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.up, m.records, m.lost, m.errors, m.cursorErrors, m.events, m.history} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("kernel log metrics: %w", err)
		}
	}
	return m, nil
}

// setUp marks source as read (or failed), and drops the other source's
// series so only the one in use shows.
func (m *readerMetrics) setUp(source string, up bool) {
	for _, s := range []string{SourceKmsg, SourceSyslog, SourceJournal, SourceNone} {
		if s != source {
			m.up.DeleteLabelValues(s)
		}
	}
	v := 0.0
	if up {
		v = 1
	}
	m.up.WithLabelValues(source).Set(v)
}

package kernlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Modes say where the kernel log is read from (agent config
// health.kernelLog).
const (
	// ModeAuto reads /dev/kmsg, or the journal where /dev/kmsg cannot be
	// opened (EPERM, EACCES, ENOENT: dmesg_restrict without CAP_SYSLOG, a
	// device cgroup without it, a sandbox).
	ModeAuto = "auto"
	// ModeKmsg reads /dev/kmsg only.
	ModeKmsg = "kmsg"
	// ModeJournal reads the host's systemd journal only.
	ModeJournal = "journal"
	// ModeOff reads nothing.
	ModeOff = "off"
)

// Modes lists the modes.
func Modes() []string { return []string{ModeAuto, ModeKmsg, ModeJournal, ModeOff} }

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
}

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
	return c
}

// errUnavailable marks a source that cannot be opened at all (as opposed
// to one that failed while being read): ModeAuto then tries the journal.
var errUnavailable = errors.New("unavailable")

// Sources, as the metrics' source label names them. SourceNone is
// ModeAuto finding neither source available.
const (
	SourceKmsg    = "kmsg"
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
	// saidNone is set once the absence of both sources was logged.
	saidNone bool
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
// in ModeAuto an unavailable /dev/kmsg is replaced by the journal (and
// tried again first after each failure). It returns nil when ctx ends.
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
		case ModeJournal:
			source, err = SourceJournal, r.readJournal(ctx, handle)
		default:
			source, err = SourceKmsg, r.readKmsg(ctx, handle)
			if errors.Is(err, errUnavailable) {
				r.log.Debug("kernel log: /dev/kmsg unavailable; reading the journal", "reason", err)
				kmsgErr := err
				source, err = SourceJournal, r.readJournal(ctx, handle)
				if errors.Is(err, errUnavailable) {
					// Neither source is there (no access to /dev/kmsg, no
					// journalctl under the host root): no data, not a
					// failure. Said once, then tried again quietly.
					source, err = SourceNone, errors.Join(kmsgErr, err)
				}
			}
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
			r.log.Log(ctx, level, "kernel log unavailable: neither /dev/kmsg nor the host's journalctl can be used; faults are seen through NVML only (health.kernelLog: off says so on purpose)",
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

// loadCursor reads the persisted cursor and keeps what applies to this
// boot.
func (r *Reader) loadCursor() {
	cur, err := LoadCursor(r.cfg.StateDir)
	if err != nil {
		r.metrics.cursorErrors.Inc()
		r.log.Warn("kernel log cursor unusable; reading the whole kernel log buffer (held faults are not doubled: the health state keeps them)", "error", err)
	}
	boot := ReadBootID(r.cfg.HostRoot)
	if cur.BootID != boot {
		if cur.HasSeq || cur.JournalCursor != "" {
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
	if ok {
		r.metrics.events.WithLabelValues(ev.Kind).Inc()
		handle(ev)
	}
	if source == SourceKmsg {
		r.cur.Seq, r.cur.HasSeq = rec.Seq, true
	} else {
		r.cur.JournalCursor = rec.Cursor
	}
	r.dirty = true
	if ok {
		r.saveCursor()
	}
}

// readerMetrics are the reader's series.
type readerMetrics struct {
	up           *prometheus.GaugeVec
	records      *prometheus.CounterVec
	lost         prometheus.Counter
	errors       *prometheus.CounterVec
	cursorErrors prometheus.Counter
	events       *prometheus.CounterVec
}

func newReaderMetrics(reg prometheus.Registerer) (*readerMetrics, error) {
	m := &readerMetrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_kernel_log_up",
			Help: "Whether the kernel log is being read (1) or its source failed (0), by source: kmsg, journal, or none when health.kernelLog auto finds neither available (0).",
		}, []string{"source"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_records_total",
			Help: "Kernel log records read, by source.",
		}, []string{"source"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_records_lost_total",
			Help: "Kernel log records overwritten in the kernel's ring buffer before they were read (/dev/kmsg EPIPE and sequence gaps).",
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
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.up, m.records, m.lost, m.errors, m.cursorErrors, m.events} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("kernel log metrics: %w", err)
		}
	}
	return m, nil
}

// setUp marks source as read (or failed), and drops the other source's
// series so only the one in use shows.
func (m *readerMetrics) setUp(source string, up bool) {
	for _, s := range []string{SourceKmsg, SourceJournal, SourceNone} {
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

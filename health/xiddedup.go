package health

import (
	"slices"
	"time"
)

// xidDedupWindow is how far apart the NVML event and the kernel log line
// of one XID may be seen and still count as one. The driver raises both
// at once; the log is read within a poll interval (kernlog's 250ms) or a
// journald flush, NVML's event within an EventSet.Wait: seconds at most.
const xidDedupWindow = 30 * time.Second

// xidDedup counts an XID seen through several sources (NVML, the kernel
// log) once: per (device, XID) it keeps each source's occurrences within
// the window, and an occurrence from source S is a duplicate while S has
// seen fewer in the window than another source already counted, so the
// count is the maximum over sources. NVML then log counts 1; log then
// NVML counts 1; two real repeats seen by both count 2. Used under
// Monitor.mu.
type xidDedup struct {
	window time.Duration
	seen   map[xidKey]map[string][]time.Time
}

type xidKey struct {
	device string
	xid    uint64
}

func newXIDDedup(window time.Duration) *xidDedup {
	return &xidDedup{window: window, seen: map[xidKey]map[string][]time.Time{}}
}

// duplicate records an occurrence of xid on device from source at now and
// says whether another source has already counted it.
func (d *xidDedup) duplicate(device string, xid uint64, source string, now time.Time) bool {
	k := xidKey{device, xid}
	bySource := d.seen[k]
	if bySource == nil {
		bySource = map[string][]time.Time{}
		d.seen[k] = bySource
	}
	cutoff := now.Add(-d.window)
	others := 0
	for s, ts := range bySource {
		ts = slices.DeleteFunc(ts, func(t time.Time) bool { return !t.After(cutoff) })
		if len(ts) == 0 {
			delete(bySource, s)
			continue
		}
		bySource[s] = ts
		if s != source {
			others = max(others, len(ts))
		}
	}
	mine := len(bySource[source])
	bySource[source] = append(bySource[source], now)
	return mine < others
}

// forget drops what is kept for devices not in keep (SetNode).
func (d *xidDedup) forget(keep func(device string) bool) {
	for k := range d.seen {
		if !keep(k.device) {
			delete(d.seen, k)
		}
	}
}

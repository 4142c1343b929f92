package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/internal/atomicfile"
	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// CheckState is the check of the node-wide cause that keeps every GPU
// unhealthy after the state file could not be read, until the poll loop
// has verified every GPU (Monitor.Verified).
const CheckState = "state"

// stateUnreadable is the reason of that cause.
const stateUnreadable = "health state unreadable; re-verifying"

// StateFileName is the file under Config.StateDir that holds the state.
const StateFileName = "health-state.json"

// stateVersion is the version of the state file format. A file with
// another version is set aside like a corrupt one: guessing at a format
// this build does not know could turn a held fault into a healthy GPU.
const stateVersion = 1

// stateFile is the persisted state: every device's state machine, the
// sample checks' counter baselines per GPU, and the boot ID it was
// written under.
type stateFile struct {
	Version int `json:"version"`
	// BootID is /proc/sys/kernel/random/boot_id when the file was written.
	BootID    string                       `json:"bootID,omitempty"`
	Devices   map[string]deviceStateJSON   `json:"devices"`
	Baselines map[string]map[string]uint64 `json:"baselines,omitempty"`
}

type deviceStateJSON struct {
	Kind          string               `json:"kind"`
	Healthy       bool                 `json:"healthy"`
	Since         time.Time            `json:"since"`
	Causes        map[string]causeJSON `json:"causes,omitempty"`
	Flaps         int                  `json:"flaps,omitempty"`
	RecentFlaps   []time.Time          `json:"recentFlaps,omitempty"`
	LastRecovered time.Time            `json:"lastRecovered,omitzero"`
}

type causeJSON struct {
	Reason    string    `json:"reason"`
	Active    bool      `json:"active,omitempty"`
	Held      bool      `json:"held,omitempty"`
	ClearedAt time.Time `json:"clearedAt,omitzero"`
	// Action is the cause's action (action.go); a file without it (an
	// older agent's) gets the one its check and key imply.
	Action string `json:"action,omitempty"`
}

func (s *deviceState) toJSON() deviceStateJSON {
	out := deviceStateJSON{Kind: s.kind, Healthy: s.healthy, Since: s.since, Flaps: s.flaps,
		RecentFlaps: slices.Clone(s.recentFlaps), LastRecovered: s.lastRecovered}
	if len(s.causes) > 0 {
		out.Causes = map[string]causeJSON{}
		for k, c := range s.causes {
			out.Causes[k] = causeJSON{Reason: c.reason, Active: c.active, Held: c.held, ClearedAt: c.clearedAt, Action: c.action}
		}
	}
	return out
}

func (j deviceStateJSON) state() *deviceState {
	s := &deviceState{kind: j.Kind, healthy: j.Healthy, since: j.Since, causes: map[string]*cause{},
		flaps: j.Flaps, recentFlaps: j.RecentFlaps, lastRecovered: j.LastRecovered}
	for k, c := range j.Causes {
		action := c.Action
		if action == "" {
			check, key, _ := strings.Cut(k, "/")
			action = defaultAction(check, key, c.Held)
		}
		s.causes[k] = &cause{reason: c.Reason, active: c.Active, held: c.Held, clearedAt: c.ClearedAt, action: action}
	}
	return s
}

// errStateCorrupt marks a state file that exists but cannot be used.
var errStateCorrupt = errors.New("health state file unusable")

// readStateFile reads dir's state file; fs.ErrNotExist if there is none,
// errStateCorrupt (wrapped) if it cannot be trusted.
func readStateFile(dir string) (*stateFile, error) {
	path := filepath.Join(dir, StateFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: read %s: %w", errStateCorrupt, path, err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: decode %s: %w", errStateCorrupt, path, err)
	}
	if f.Version != stateVersion {
		return nil, fmt.Errorf("%w: %s has version %d, this agent reads version %d", errStateCorrupt, path, f.Version, stateVersion)
	}
	for id, d := range f.Devices {
		if id == "" || d.Kind == "" {
			return nil, fmt.Errorf("%w: %s: device %q without a kind", errStateCorrupt, path, id)
		}
	}
	return &f, nil
}

// writeStateFile replaces dir's state file atomically (atomicfile.Write).
func writeStateFile(dir string, data []byte) error {
	if err := atomicfile.Write(filepath.Join(dir, StateFileName), data); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// setStateAside renames an unusable state file so an operator can read it
// and the next write starts afresh.
func setStateAside(dir string, now time.Time) (string, error) {
	to := filepath.Join(dir, StateFileName+".corrupt-"+strconv.FormatInt(now.Unix(), 10))
	if err := os.Rename(filepath.Join(dir, StateFileName), to); err != nil {
		return "", fmt.Errorf("set aside unusable state file: %w", err)
	}
	return to, nil
}

// persistence is the monitor's state-file bookkeeping.
type persistence struct {
	dir    string
	bootID string
	// dirty is set (under Monitor.mu) by every change to persist.
	dirty bool
	// writeErrors counts failed writes.
	writeErrors prometheus.Counter
}

func newPersistence(dir, hostRoot string, reg prometheus.Registerer) (*persistence, error) {
	p := &persistence{dir: dir, bootID: kernlog.ReadBootID(hostRoot),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_state_write_errors_total",
			Help: "Failed writes of the persisted health state (--state-dir).",
		})}
	if reg != nil {
		if err := reg.Register(p.writeErrors); err != nil {
			return nil, fmt.Errorf("state metrics: %w", err)
		}
	}
	return p, nil
}

// restoreLocked loads the state file into m at construction; m.mu held.
// It never fails: a missing file is a fresh start, an unusable one is set
// aside and every GPU fails closed until Verified.
func (m *Monitor) restoreLocked(now time.Time) {
	p := m.persist
	if p.dir == "" {
		return
	}
	f, err := readStateFile(p.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		m.log.Info("no persisted health state; starting fresh", "dir", p.dir)
		p.dirty = true // record the boot ID
		return
	case err != nil:
		aside, rerr := setStateAside(p.dir, now)
		m.log.Error("persisted health state unusable; every GPU is unhealthy until verified", "err", err,
			"setAside", aside, "setAsideErr", rerr)
		s := newDeviceState(KindNode, now)
		s.apply(Observation{DeviceID: NodeID, Check: CheckState, Fatal: true, Reason: stateUnreadable}, now, m.cfg)
		m.states[NodeID] = s
		p.dirty = true
		return
	}
	for id, d := range f.Devices {
		m.states[id] = d.state()
	}
	for uuid, counters := range f.Baselines {
		m.baselines[uuid] = maps.Clone(counters)
	}
	unhealthy := 0
	for _, s := range m.states {
		if !s.healthy {
			unhealthy++
		}
	}
	m.log.Info("restored persisted health state", "dir", p.dir, "devices", len(m.states), "unhealthy", unhealthy)
	if f.BootID != "" && p.bootID != "" && f.BootID != p.bootID {
		// A reboot resets every GPU: release what waited for one.
		for _, id := range slices.Sorted(maps.Keys(m.states)) {
			if released := m.states[id].release(now); len(released) > 0 {
				m.log.Info("node rebooted (boot ID changed); releasing held faults", "device", id, "released", released)
			}
		}
	}
	p.dirty = f.BootID != p.bootID
}

// snapshotLocked encodes the state to persist; m.mu held.
func (m *Monitor) snapshotLocked() ([]byte, error) {
	f := stateFile{Version: stateVersion, BootID: m.persist.bootID, Devices: map[string]deviceStateJSON{}}
	for id, s := range m.states {
		f.Devices[id] = s.toJSON()
	}
	if len(m.baselines) > 0 {
		f.Baselines = map[string]map[string]uint64{}
		for uuid, c := range m.baselines {
			f.Baselines[uuid] = maps.Clone(c)
		}
	}
	return json.MarshalIndent(f, "", "  ")
}

// markDirtyLocked notes a change to persist; m.mu held. Call save after
// unlocking.
func (m *Monitor) markDirtyLocked() { m.persist.dirty = true }

// save writes the state if it changed. Concurrent callers coalesce: one
// writes while the others wait for it and find nothing left to write, so
// a caller waits for at most its own write and the one before it. Never
// call it with m.mu held.
func (m *Monitor) save() {
	p := m.persist
	if p.dir == "" {
		return
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	if !p.dirty {
		m.mu.Unlock()
		return
	}
	data, err := m.snapshotLocked()
	p.dirty = false
	m.mu.Unlock()
	if err == nil {
		err = writeStateFile(p.dir, data)
	}
	if err != nil {
		p.writeErrors.Inc()
		m.log.Error("writing persisted health state failed", "dir", p.dir, "err", err)
		// Try again with the next change.
		m.mu.Lock()
		p.dirty = true
		m.mu.Unlock()
	}
}

// Baseline returns the sample checks' baseline of counter on GPU uuid
// (e.g. the volatile DBE count it last accepted), persisted across
// restarts so a fault before one is not taken for the new normal.
func (m *Monitor) Baseline(uuid, counter string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.baselines[uuid][counter]
	return v, ok
}

// SetBaseline records the baseline of counter on GPU uuid and persists it
// if it changed. Baselines of GPUs that leave the node are dropped by
// SetNode.
func (m *Monitor) SetBaseline(uuid, counter string, v uint64) {
	m.mu.Lock()
	c := m.baselines[uuid]
	if c == nil {
		c = map[string]uint64{}
		m.baselines[uuid] = c
	}
	if old, ok := c[counter]; ok && old == v {
		m.mu.Unlock()
		return
	}
	c[counter] = v
	m.markDirtyLocked()
	m.mu.Unlock()
	m.save()
}

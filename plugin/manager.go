package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Options configure a Manager.
type Options struct {
	// Dir is the device-plugin directory holding kubelet.sock and our
	// sockets; default pluginapi.DevicePluginPath.
	Dir string
	// KubeletSocket is the kubelet's registration socket, a file name in
	// Dir or an absolute path inside Dir; default "kubelet.sock".
	KubeletSocket string
	// Logger receives one line per event; default slog.Default().
	Logger *slog.Logger
	// Registerer gets the plugin metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// Instance, when set, is part of every socket name
	// ("gpu-node-agent-<resource>-<instance>.sock"): up to 16 lower-case
	// letters and digits that tell this agent's sockets from another's in
	// the same directory. During a DaemonSet rollout with surge the old
	// and the new pod of a node both serve, and neither may take over or
	// remove the other's socket. InstanceFromPodUID makes one.
	Instance string
}

// Manager runs one device-plugin server per Resource and keeps them
// registered with the kubelet. Sync says which resources exist; Run watches
// for kubelet restarts and owns the servers' lifetime.
type Manager struct {
	dir           string
	kubeletSocket string
	instance      string
	log           *slog.Logger
	metrics       *metrics

	mu         sync.Mutex
	servers    map[string]*server
	startFails map[string]string // resource -> last start error, to log a streak once
	last       []Resource        // the last Sync's resources, for retryFailed
	running    bool
	closed     bool
	// watching is closed once Run watches the directory; registration
	// waits for it so that no kubelet restart can slip by unseen.
	watching chan struct{}
	// kubeletGen counts kubelet.sock creations and removals.
	kubeletGen atomic.Uint64
	// absence reports a missing kubelet once for every server.
	absence *kubeletAbsence
	// stopping counts servers Sync removed and is still stopping without
	// the lock; shutdown waits for them.
	stopping sync.WaitGroup
	// grace bounds how long a stopping server waits for calls in flight.
	grace time.Duration
}

// NewManager checks opts and registers the metrics. It starts nothing.
func NewManager(opts Options) (*Manager, error) {
	dir := opts.Dir
	if dir == "" {
		dir = pluginapi.DevicePluginPath
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("device-plugin dir %q: %w", opts.Dir, err)
	}
	ks := opts.KubeletSocket
	if ks == "" {
		ks = filepath.Base(pluginapi.KubeletSocket)
	}
	if !filepath.IsAbs(ks) {
		ks = filepath.Join(dir, ks)
	}
	ks = filepath.Clean(ks)
	// The kubelet resolves our RegisterRequest.Endpoint relative to its own
	// socket's directory, so both must be the same directory.
	if filepath.Dir(ks) != dir {
		return nil, fmt.Errorf("kubelet socket %s is not in device-plugin dir %s", ks, dir)
	}
	if err := checkInstance(opts.Instance); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register plugin metrics: %w", err)
	}
	return &Manager{
		dir:           dir,
		kubeletSocket: ks,
		instance:      opts.Instance,
		log:           log,
		metrics:       m,
		servers:       map[string]*server{},
		startFails:    map[string]string{},
		watching:      make(chan struct{}),
		absence:       newKubeletAbsence(log, ks),
		grace:         gracePeriod,
	}, nil
}

// Run watches the device-plugin directory: when kubelet.sock is created (a
// kubelet restart) every server re-creates its socket if the kubelet removed
// it and registers again at once. When ctx is done Run stops every server,
// removes their sockets and returns nil. Servers started by Sync register
// only once Run is watching. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running || m.closed {
		m.mu.Unlock()
		return errors.New("plugin manager already run")
	}
	m.running = true
	m.mu.Unlock()
	defer m.shutdown()

	// The kubelet creates the directory too; an agent that starts first
	// must still be able to watch it.
	if err := os.MkdirAll(m.dir, 0o750); err != nil {
		return fmt.Errorf("create device-plugin dir %s: %w", m.dir, err)
	}
	// With instance-tagged names a killed agent's sockets are not reused
	// by its successor; the kubelet removes them only when it restarts.
	removed, err := removeStaleSockets(m.dir)
	if err != nil {
		m.log.Warn("removing stale device-plugin sockets", "err", err)
	}
	if len(removed) > 0 {
		m.log.Info("removed stale device-plugin sockets nothing listens on", "sockets", removed)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch device-plugin dir %s: %w", m.dir, err)
	}
	defer w.Close()
	if err := w.Add(m.dir); err != nil {
		return fmt.Errorf("watch device-plugin dir %s: %w", m.dir, err)
	}
	close(m.watching)
	m.retryFailed()
	m.log.Info("watching for kubelet restarts", "kubeletSocket", m.kubeletSocket)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("device-plugin dir watch closed")
			}
			if filepath.Clean(ev.Name) != m.kubeletSocket {
				continue
			}
			switch {
			case ev.Has(fsnotify.Create):
				m.kubeletStarted()
			case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
				m.kubeletStopped()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("device-plugin dir watch closed")
			}
			// An overflow may have hidden a kubelet restart: re-register to
			// be safe; registering twice is harmless.
			m.log.Warn("device-plugin dir watch error, re-registering", "err", err)
			m.kubeletStarted()
		}
	}
}

// kubeletStarted re-creates removed sockets and re-registers every server.
func (m *Manager) kubeletStarted() {
	m.kubeletGen.Add(1)
	m.retryFailed()
	m.log.Info("kubelet socket created, re-registering", "resources", m.count())
	m.forEach(func(s *server) {
		recreated, err := s.ensureServing()
		if err != nil {
			m.log.Error("re-create device-plugin socket failed", "resource", s.name, "err", err)
			return
		}
		if recreated {
			m.log.Debug("device-plugin socket re-created", "resource", s.name)
		}
		s.requestRegistration()
	})
}

// kubeletStopped records that nothing is registered any more: the kubelet
// that knew us is gone.
func (m *Manager) kubeletStopped() {
	m.kubeletGen.Add(1)
	m.log.Info("kubelet socket removed")
	m.forEach(func(s *server) { s.setRegistered(false) })
}

// Sync makes the served resources those in resources, by Name(): new ones
// get a server and register; gone ones are stopped (their streams end and
// their sockets go); the rest get the new Resource value and, if their
// device list changed, push it to every ListAndWatch stream. It is safe to
// call concurrently and often. Sync after Run returned does nothing.
//
// Removed servers wait up to a grace period for calls in flight; Sync does
// that after releasing the manager's lock, so Registered, other Syncs and
// kubelet-restart handling are not held up meanwhile.
func (m *Manager) Sync(resources []Resource) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.last = slices.Clone(resources)
	removed := m.syncLocked(resources)
	m.mu.Unlock()
	m.finishStops(removed)
}

// retryFailed tries again to start servers whose start failed (a missing
// directory, a full disk), at moments when that may have changed.
func (m *Manager) retryFailed() {
	m.mu.Lock()
	var removed []*server
	if len(m.startFails) > 0 && !m.closed {
		removed = m.syncLocked(m.last)
	}
	m.mu.Unlock()
	m.finishStops(removed)
}

// finishStops waits, without the lock, for servers syncLocked removed.
func (m *Manager) finishStops(removed []*server) {
	var wg sync.WaitGroup
	for _, s := range removed {
		wg.Go(s.finishStop)
	}
	wg.Wait()
	m.stopping.Add(-len(removed))
}

// syncLocked starts and updates servers and begins stopping the removed
// ones, which it returns: the caller must pass them to finishStops once it
// has released m.mu.
func (m *Manager) syncLocked(resources []Resource) (removed []*server) {
	want := make(map[string]Resource, len(resources))
	for _, r := range resources {
		if r == nil || r.Name() == "" {
			m.log.Error("sync: resource without a name ignored")
			continue
		}
		if _, dup := want[r.Name()]; dup {
			m.log.Error("sync: resource listed twice, first kept", "resource", r.Name())
			continue
		}
		want[r.Name()] = r
	}
	for name, s := range m.servers {
		if _, ok := want[name]; ok {
			continue
		}
		delete(m.servers, name)
		// The socket goes now, under the lock, so a server for the same
		// name started by a later Sync never has its socket removed by
		// this one; only the wait for calls in flight is left for later.
		if err := s.beginStop(); err != nil {
			m.log.Error("stop device-plugin server failed", "resource", name, "err", err)
		}
		m.metrics.forget(name)
		m.stopping.Add(1)
		removed = append(removed, s)
		m.log.Info("resource removed", "resource", name)
	}
	for name, r := range want {
		if s, ok := m.servers[name]; ok {
			if s.update(r) {
				m.log.Info("resource options changed, re-registering", "resource", name)
				s.requestRegistration()
			}
			continue
		}
		s := newServer(name, filepath.Join(m.dir, socketName(name, m.instance)), r, m.log, m.metrics, &m.kubeletGen, m.grace)
		s.absence = m.absence
		if err := s.start(m.kubeletSocket, m.watching); err != nil {
			// Logged once per streak; the next Sync tries again.
			if m.startFails[name] != err.Error() {
				m.log.Error("start device-plugin server failed", "resource", name, "err", err)
				m.startFails[name] = err.Error()
			}
			continue
		}
		delete(m.startFails, name)
		m.servers[name] = s
		m.metrics.setRegistered(name, false)
		m.metrics.setStreams(name, 0)
		m.log.Info("resource added", "resource", name, "socket", s.socket, "devices", len(s.devs.devs))
	}
	for name := range m.startFails {
		if _, ok := want[name]; !ok {
			delete(m.startFails, name)
		}
	}
	return removed
}

// Registered reports, per served resource, whether its last registration
// with the kubelet succeeded and the kubelet has not gone since.
func (m *Manager) Registered() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.servers))
	for name, s := range m.servers {
		out[name] = s.registered.Load()
	}
	return out
}

// shutdown stops every server and refuses later Syncs.
func (m *Manager) shutdown() {
	m.mu.Lock()
	m.closed = true
	servers := m.servers
	m.servers = map[string]*server{}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for name, s := range servers {
		wg.Go(func() {
			if err := s.stop(); err != nil {
				m.log.Error("stop device-plugin server failed", "resource", name, "err", err)
			}
			m.metrics.forget(name)
		})
	}
	wg.Wait()
	// Servers a concurrent Sync removed are still its to finish stopping;
	// Run returns only once they are stopped too.
	m.stopping.Wait()
	m.log.Info("device-plugin servers stopped", "resources", len(servers))
}

// forEach calls f for each served server. f runs without the lock (it may
// re-create a socket), on a snapshot: a server a concurrent Sync removes
// may still be passed, and is stopped by then or soon, which its methods
// allow for.
func (m *Manager) forEach(f func(*server)) {
	m.mu.Lock()
	servers := slices.Collect(maps.Values(m.servers))
	m.mu.Unlock()
	for _, s := range servers {
		f(s)
	}
}

func (m *Manager) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.servers)
}

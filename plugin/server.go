package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// server is the device-plugin gRPC server of one resource: its socket, its
// current Resource value and device snapshot, its open ListAndWatch streams
// and its registration loop.
type server struct {
	pluginapi.UnimplementedDevicePluginServer

	name    string
	socket  string
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	res      Resource
	devs     *deviceList
	watchers map[*watcher]struct{}
	grpc     *grpc.Server
	created  os.FileInfo // the socket file we made, to tell it from a newer one
	stopped  bool
	done     chan struct{} // closed by stop: ends every stream
	// grace bounds how long stop waits for calls in flight.
	grace time.Duration

	registered atomic.Bool
	// kubeletGen is the manager's count of kubelet.sock events: a
	// registration that straddles one was with a kubelet that is gone.
	kubeletGen *atomic.Uint64
	// absence is the manager's, shared by its servers; nil outside one.
	absence  *kubeletAbsence
	kick     chan struct{} // asks the registration loop to register now
	cancel   context.CancelFunc
	loopDone chan struct{}
}

// watcher is one open ListAndWatch stream. Its channel holds at most the
// latest list: a slow stream skips intermediate lists and never blocks Sync.
type watcher struct {
	ch chan *deviceList
}

func newServer(name, socket string, res Resource, log *slog.Logger, m *metrics, kubeletGen *atomic.Uint64, grace time.Duration) *server {
	return &server{
		name:       name,
		grace:      grace,
		kubeletGen: kubeletGen,
		socket:     socket,
		log:        log.With("resource", name),
		metrics:    m,
		res:        res,
		devs:       newDeviceList(res.Devices()),
		watchers:   map[*watcher]struct{}{},
		done:       make(chan struct{}),
		kick:       make(chan struct{}, 1),
		loopDone:   make(chan struct{}),
	}
}

// serve (re)creates the socket and starts a fresh gRPC server on it. An old
// gRPC server, if any, is stopped: its streams belong to a kubelet that is
// gone. The socket is created under s.mu, so a server that beginStop has
// marked stopped never creates one: after a resource is removed and added
// again, only the new server owns the path.
func (s *server) serve() error {
	g := grpc.NewServer(
		grpc.UnaryInterceptor(s.metrics.unary(s.name)),
		grpc.StreamInterceptor(s.metrics.stream(s.name)),
	)
	pluginapi.RegisterDevicePluginServer(g, s)

	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return fmt.Errorf("device-plugin server for %s stopped", s.name)
	}
	lis, created, err := listenUnix(s.socket)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	old := s.grpc
	s.grpc, s.created = g, created
	s.mu.Unlock()

	if old != nil {
		old.Stop()
	}
	go func() {
		// Serve returns when the listener is closed by Stop; that is the
		// normal way out, so its error is not worth a log line.
		_ = g.Serve(lis)
	}()
	return nil
}

// ensureServing re-creates the socket if someone (the kubelet, at start)
// removed it. It reports whether it had to. A stopped server, which the
// manager may still hold in a snapshot, is left alone.
func (s *server) ensureServing() (bool, error) {
	s.mu.Lock()
	leave := s.stopped || s.created != nil && socketIntact(s.socket, s.created)
	s.mu.Unlock()
	if leave {
		return false, nil
	}
	return true, s.serve()
}

// start serves the socket and starts the registration loop, which makes its
// first attempt once watching is closed: a kubelet.sock created before the
// directory watch exists would otherwise go unnoticed during a backoff.
func (s *server) start(kubeletSocket string, watching <-chan struct{}) error {
	if err := s.serve(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.registerLoop(ctx, kubeletSocket, watching)
	return nil
}

// stop ends every stream, stops the gRPC server, stops registering and
// removes the socket. The kubelet notices the resource is gone when its
// ListAndWatch stream ends.
func (s *server) stop() error {
	err := s.beginStop()
	s.finishStop()
	return err
}

// beginStop is the quick part of stop, safe to call under the manager's
// lock: it marks the server stopped (so nothing re-creates its socket or
// touches its metrics again), ends every stream, cancels the registration
// loop and removes the socket. finishStop does the waiting.
func (s *server) beginStop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	close(s.done)
	s.registered.Store(false)
	if s.cancel != nil {
		s.cancel()
	}
	if err := removeSocket(s.socket, s.created); err != nil {
		return fmt.Errorf("stop %s: %w", s.name, err)
	}
	return nil
}

// finishStop waits for the registration loop to end and for calls in flight
// (at most the grace period), then closes the gRPC server. It may take a
// while, so callers run it without the manager's lock.
func (s *server) finishStop() {
	if s.cancel != nil {
		<-s.loopDone
	}
	s.mu.Lock()
	g := s.grpc
	s.mu.Unlock()
	if g != nil {
		stopGracefully(g, s.grace)
	}
}

// gracePeriod bounds how long a stopping server waits for calls in flight
// (a slow Resource.Allocate) before it cuts them off.
const gracePeriod = time.Second

// stopGracefully lets streams, which end as soon as done is closed, send
// their final status, so the kubelet sees a clean end rather than a reset.
func stopGracefully(g *grpc.Server, grace time.Duration) {
	t := time.AfterFunc(grace, g.Stop)
	g.GracefulStop()
	t.Stop()
}

// setRegistered records a registration outcome unless the server has been
// stopped: after stop its gauge is deleted, and setting it would resurrect
// a series for a resource that is no longer served.
func (s *server) setRegistered(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.registered.Store(ok)
	s.metrics.setRegistered(s.name, ok)
}

// resource returns the current Resource value and device snapshot.
func (s *server) resource() (Resource, *deviceList) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res, s.devs
}

// update swaps in a new Resource value, re-reads its devices and pushes the
// list to every stream if it changed. It reports whether the registration
// options changed, which needs a new registration for the kubelet to see.
func (s *server) update(res Resource) (optionsChanged bool) {
	devs := newDeviceList(res.Devices())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	optionsChanged = !sameOptions(options(s.res), options(res))
	s.res = res
	if devs.equal(s.devs) {
		return optionsChanged
	}
	s.devs = devs
	for w := range s.watchers {
		select {
		case <-w.ch: // drop the list the stream has not sent yet
		default:
		}
		w.ch <- devs
	}
	s.log.Info("device list changed", "devices", len(devs.devs), "healthy", devs.healthyCount(), "streams", len(s.watchers))
	return optionsChanged
}

// addWatcher registers a stream and returns the list it must send first;
// both happen under one lock so no update falls between them.
func (s *server) addWatcher() (*watcher, *deviceList, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, nil, fmt.Errorf("resource %s no longer served", s.name)
	}
	w := &watcher{ch: make(chan *deviceList, 1)}
	s.watchers[w] = struct{}{}
	s.metrics.setStreams(s.name, len(s.watchers))
	return w, s.devs, nil
}

func (s *server) removeWatcher(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers, w)
	if !s.stopped {
		// After stop the series is deleted; setting it would resurrect it.
		s.metrics.setStreams(s.name, len(s.watchers))
	}
}

// requestRegistration makes the registration loop register now, e.g. after
// kubelet.sock was re-created.
func (s *server) requestRegistration() {
	select {
	case s.kick <- struct{}{}:
	default: // one is already pending
	}
}

// options are what the kubelet is told at registration: optional hooks are
// found by interface assertion, never by flags.
func options(res Resource) *pluginapi.DevicePluginOptions {
	_, pa := res.(PreferredAllocator)
	_, ps := res.(PreStarter)
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: pa, PreStartRequired: ps}
}

func sameOptions(a, b *pluginapi.DevicePluginOptions) bool {
	return a.GetPreferredAllocationAvailable == b.GetPreferredAllocationAvailable && a.PreStartRequired == b.PreStartRequired
}

// compile-time check that server is what RegisterDevicePluginServer wants.
var _ pluginapi.DevicePluginServer = (*server)(nil)

// watcherCount is the number of open ListAndWatch streams.
func (s *server) watcherCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

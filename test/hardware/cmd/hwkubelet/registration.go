package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// connectTimeout bounds dialling a plugin back and asking for its options,
// as the kubelet's plugin client does within Register.
const connectTimeout = 10 * time.Second

// Registration is one RegisterRequest as the kubelet received it.
type Registration struct {
	Time         time.Time `json:"time"`
	Version      string    `json:"version"`
	Endpoint     string    `json:"endpoint"`
	ResourceName string    `json:"resourceName"`
	Options      Options   `json:"options"`
	// Error is why the registration was refused or the plugin could not
	// be dialled back; empty when it connected.
	Error string `json:"error,omitempty"`
}

// Options is a plugin's DevicePluginOptions.
type Options struct {
	PreStartRequired                bool `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool `json:"getPreferredAllocationAvailable"`
}

func optionsOf(o *pluginapi.DevicePluginOptions) Options {
	return Options{PreStartRequired: o.GetPreStartRequired(), GetPreferredAllocationAvailable: o.GetGetPreferredAllocationAvailable()}
}

// registrationServer is a standalone form of the kubelet's device-plugin
// registration server (pkg/kubelet/cm/devicemanager/plugin/v1beta1/
// server.go) on the device-plugin API alone, so that the binary carries
// no k8s.io/kubernetes: Register checks the version, dials the plugin's
// endpoint back and asks for its options before it answers (the
// handler's PluginConnected), then follows ListAndWatch in the
// background. A resource that registers again replaces its client, as in
// the kubelet.
type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer

	socket string
	dir    string
	h      devicemanager.Handler
	log    *slog.Logger

	mu      sync.Mutex
	grpc    *grpc.Server
	regs    []Registration
	clients map[string]*pluginClient
}

// pluginClient is the connection to one registered resource's plugin.
type pluginClient struct {
	conn   *grpc.ClientConn
	cancel context.CancelFunc
}

// newServerFunc returns the devicemanager.ServerFunc that creates a
// registrationServer; srv receives it, so that main can read the
// registrations it recorded.
func newServerFunc(log *slog.Logger, srv **registrationServer) devicemanager.ServerFunc {
	return func(socketPath string, h devicemanager.Handler) (devicemanager.Server, error) {
		s := &registrationServer{
			socket:  socketPath,
			dir:     filepath.Dir(socketPath),
			h:       h,
			log:     log,
			clients: map[string]*pluginClient{},
		}
		*srv = s
		return s, nil
	}
}

// Start cleans the plugin directory of sockets, as the kubelet does, and
// serves kubelet.sock.
func (s *registrationServer) Start() error {
	if err := s.h.CleanupPluginDirectory(s.dir); err != nil {
		return err
	}
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", s.socket, err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	g := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(g, s)
	s.mu.Lock()
	s.grpc = g
	s.mu.Unlock()
	go func() {
		if err := g.Serve(l); err != nil {
			s.log.Error("registration server stopped", "socket", s.socket, "err", err)
		}
	}()
	s.log.Info("serving the kubelet's registration socket", "socket", s.socket)
	return nil
}

// Stop stops serving and closes every plugin client.
func (s *registrationServer) Stop() error {
	s.mu.Lock()
	g := s.grpc
	s.grpc = nil
	clients := s.clients
	s.clients = map[string]*pluginClient{}
	s.mu.Unlock()
	if g != nil {
		g.Stop()
	}
	for name, c := range clients {
		c.close()
		s.h.PluginDisconnected(name)
	}
	return nil
}

// Registrations returns a copy of every RegisterRequest received so far.
func (s *registrationServer) Registrations() []Registration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Registration(nil), s.regs...)
}

// Register is the kubelet's Register.
func (s *registrationServer) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	reg := Registration{
		Time:         time.Now(),
		Version:      r.GetVersion(),
		Endpoint:     r.GetEndpoint(),
		ResourceName: r.GetResourceName(),
		Options:      optionsOf(r.GetOptions()),
	}
	err := s.connect(ctx, r)
	if err != nil {
		reg.Error = err.Error()
		s.log.Warn("registration refused", "resource", reg.ResourceName, "endpoint", reg.Endpoint, "err", err)
	} else {
		s.log.Info("plugin registered", "resource", reg.ResourceName, "endpoint", reg.Endpoint)
	}
	s.mu.Lock()
	s.regs = append(s.regs, reg)
	s.mu.Unlock()
	return &pluginapi.Empty{}, err
}

// connect checks the request, dials the plugin back, hands its client to
// the handler and follows its ListAndWatch.
func (s *registrationServer) connect(ctx context.Context, r *pluginapi.RegisterRequest) error {
	if r.GetVersion() != pluginapi.Version {
		return fmt.Errorf("version %q is not supported (want %s)", r.GetVersion(), pluginapi.Version)
	}
	if r.GetResourceName() == "" || r.GetEndpoint() == "" {
		return errors.New("resource name and endpoint must be set")
	}
	path := filepath.Join(s.dir, r.GetEndpoint())
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial plugin %s: %w", path, err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := s.h.PluginConnected(cctx, r.GetResourceName(), client); err != nil {
		conn.Close()
		return err
	}
	lctx, lcancel := context.WithCancel(context.Background())
	pc := &pluginClient{conn: conn, cancel: lcancel}
	s.mu.Lock()
	old := s.clients[r.GetResourceName()]
	s.clients[r.GetResourceName()] = pc
	s.mu.Unlock()
	if old != nil {
		old.close()
	}
	go s.listAndWatch(lctx, r.GetResourceName(), client, pc)
	return nil
}

// listAndWatch follows one plugin's device list until the stream ends.
func (s *registrationServer) listAndWatch(ctx context.Context, resource string, client pluginapi.DevicePluginClient, pc *pluginClient) {
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err == nil {
		for {
			var resp *pluginapi.ListAndWatchResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			s.h.PluginListAndWatchReceiver(resource, resp)
		}
	}
	if ctx.Err() == nil {
		s.log.Info("plugin's ListAndWatch ended", "resource", resource, "err", err)
	}
	s.mu.Lock()
	current := s.clients[resource] == pc
	if current {
		delete(s.clients, resource)
	}
	s.mu.Unlock()
	if current {
		pc.close()
		s.h.PluginDisconnected(resource)
	}
}

func (c *pluginClient) close() {
	c.cancel()
	c.conn.Close()
}

package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/clock"
)

// DefaultKubeletDir is the kubelet's root directory.
const DefaultKubeletDir = "/var/lib/kubelet"

// Socket paths under the kubelet directory, as the library's kubeletplugin
// lays them out (KubeletRegistryDir, KubeletPluginsDir, "dra.sock" and
// "<driver>-reg.sock" in k8s.io/dynamic-resource-allocation v0.36.3
// kubeletplugin/draplugin.go): the kubelet's plugin watcher finds the
// registration socket and connects to the DRA socket GetInfo names.
func RegistrationSocket(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins_registry", DriverName+"-reg.sock")
}

// DRASocket is the socket of the DRA service (see RegistrationSocket).
func DRASocket(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins", DriverName, "dra.sock")
}

// SupportedServices are the DRA gRPC services the plugin serves and
// advertises in GetInfo's supported versions: v1 (kubelet 1.34 and later
// prefer it) and v1beta1 (which kubelet 1.34 to 1.37 still speak), the
// default of the library's kubeletplugin (NodeV1, NodeV1beta1 options),
// and the health service (HealthService), which kubelet 1.37 opens only
// when it is listed here (see health.go).
var SupportedServices = []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService, HealthService}

// KubeletPlugin serves a Preparer to the kubelet: the registration service
// on RegistrationSocket, and the DRA service (v1 and v1beta1) and the
// health service (SetHealth) on DRASocket.
type KubeletPlugin struct {
	prep       *Preparer
	kubeletDir string
	log        *slog.Logger
	clock      clock.WithTicker // tests replace it before Start

	// healthMu guards the health state and the streams waiting for it; it
	// is not mu, so SetHealth never waits for Start or Stop.
	healthMu      sync.Mutex
	health        *healthState // nil until the first SetHealth
	healthSubs    map[chan struct{}]struct{}
	healthStreams atomic.Int64

	mu         sync.Mutex
	registered bool
	regErr     string
	servers    []*grpc.Server
	sockets    []string
	wg         sync.WaitGroup

	drapbv1.UnsafeDRAPluginServer
}

// NewKubeletPlugin returns a plugin for prep; Start serves it.
func NewKubeletPlugin(prep *Preparer, kubeletDir string, log *slog.Logger) *KubeletPlugin {
	if kubeletDir == "" {
		kubeletDir = DefaultKubeletDir
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KubeletPlugin{prep: prep, kubeletDir: kubeletDir, log: log, clock: clock.RealClock{},
		healthSubs: map[chan struct{}]struct{}{}}
}

// Start listens on both sockets and serves them until Stop. The DRA
// socket comes first so the kubelet, once it sees the registration
// socket, can connect at once (the library's order). Stale sockets of an
// earlier run are removed first.
func (p *KubeletPlugin) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.servers) > 0 {
		return errors.New("dra kubelet plugin: already started")
	}
	// Stop waits for the DRA handlers, so no health stream outlives it.
	// Not the registration server: its NotifyRegistrationStatus takes mu,
	// which Stop holds.
	dra := grpc.NewServer(grpc.WaitForHandlers(true))
	drapbv1.RegisterDRAPluginServer(dra, p)
	drapbv1beta1.RegisterDRAPluginServer(dra, drapbv1beta1.V1ServerWrapper{DRAPluginServer: p})
	drahealth.RegisterDRAResourceHealthServer(dra, healthServer{p: p})
	if err := p.serve(dra, DRASocket(p.kubeletDir)); err != nil {
		return err
	}
	reg := grpc.NewServer()
	registerapi.RegisterRegistrationServer(reg, registrationServer{p: p})
	if err := p.serve(reg, RegistrationSocket(p.kubeletDir)); err != nil {
		p.stopLocked()
		return err
	}
	p.log.Info("dra kubelet plugin serving", "driver", DriverName, "socket", DRASocket(p.kubeletDir), "registration", RegistrationSocket(p.kubeletDir))
	return nil
}

func (p *KubeletPlugin) serve(s *grpc.Server, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		return fmt.Errorf("dra kubelet plugin: create socket dir: %w", err)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dra kubelet plugin: remove stale socket %s: %w", socket, err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("dra kubelet plugin: listen on %s: %w", socket, err)
	}
	p.servers = append(p.servers, s)
	p.sockets = append(p.sockets, socket)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := s.Serve(l); err != nil {
			p.log.Error("dra kubelet plugin: grpc server stopped", "socket", socket, "err", err)
		}
	}()
	return nil
}

// Stop stops both servers and removes their sockets, the registration
// socket first so the kubelet stops calling (it unregisters the plugin
// when the socket goes). It returns once every call in progress,
// health streams included, has ended.
func (p *KubeletPlugin) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked()
}

func (p *KubeletPlugin) stopLocked() {
	for i := len(p.servers) - 1; i >= 0; i-- {
		p.servers[i].Stop()
		_ = os.Remove(p.sockets[i])
	}
	p.wg.Wait()
	p.servers, p.sockets = nil, nil
}

// Registered reports whether the kubelet said it registered the plugin,
// and its error if it said it did not.
func (p *KubeletPlugin) Registered() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered, p.regErr
}

// NodePrepareResources prepares each claim; per-claim failures go into
// the claim's response, as the kubelet expects, never the RPC error.
func (p *KubeletPlugin) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	refs := make([]ClaimRef, 0, len(req.Claims))
	for _, c := range req.Claims {
		refs = append(refs, ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: c.Uid})
	}
	res := p.prep.Prepare(ctx, refs)
	resp := &drapbv1.NodePrepareResourcesResponse{Claims: make(map[string]*drapbv1.NodePrepareResourceResponse, len(res))}
	for uid, r := range res {
		cr := &drapbv1.NodePrepareResourceResponse{}
		if r.Err != nil {
			cr.Error = r.Err.Error()
		}
		for _, d := range r.Devices {
			cr.Devices = append(cr.Devices, &drapbv1.Device{
				RequestNames: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CdiDeviceIds: d.CDIDeviceIDs,
			})
		}
		resp.Claims[uid] = cr
	}
	return resp, nil
}

// NodeUnprepareResources unprepares each claim; an unknown claim is a
// success.
func (p *KubeletPlugin) NodeUnprepareResources(_ context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	refs := make([]ClaimRef, 0, len(req.Claims))
	for _, c := range req.Claims {
		refs = append(refs, ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: c.Uid})
	}
	res := p.prep.Unprepare(refs)
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: make(map[string]*drapbv1.NodeUnprepareResourceResponse, len(res))}
	for uid, err := range res {
		cr := &drapbv1.NodeUnprepareResourceResponse{}
		if err != nil {
			cr.Error = err.Error()
		}
		resp.Claims[uid] = cr
	}
	return resp, nil
}

// registrationServer answers the kubelet's plugin watcher, as the
// library's registrationServer does (kubeletplugin/registrationserver.go).
type registrationServer struct {
	p *KubeletPlugin
	registerapi.UnsafeRegistrationServer
}

var _ registerapi.RegistrationServer = registrationServer{}

// GetInfo names the driver, its DRA socket and the services it serves.
func (r registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DRAPlugin,
		Name:              DriverName,
		Endpoint:          DRASocket(r.p.kubeletDir),
		SupportedVersions: SupportedServices,
	}, nil
}

// NotifyRegistrationStatus records what the kubelet made of GetInfo. A
// refusal is answered with an error, as the library does.
func (r registrationServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.p.mu.Lock()
	r.p.registered, r.p.regErr = st.PluginRegistered, st.Error
	r.p.mu.Unlock()
	if !st.PluginRegistered {
		r.p.log.Error("dra kubelet plugin: kubelet refused registration", "err", st.Error)
		return nil, fmt.Errorf("dra plugin registration failed: %s", st.Error)
	}
	r.p.log.Info("dra kubelet plugin registered with the kubelet", "driver", DriverName)
	return &registerapi.RegistrationStatusResponse{}, nil
}

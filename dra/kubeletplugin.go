package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/clock"
)

// DefaultKubeletDir is the kubelet's root directory.
const DefaultKubeletDir = "/var/lib/kubelet"

// RegistryDir is where the kubelet's plugin watcher looks for registration
// sockets under kubeletDir (the library's KubeletRegistryDir under the
// default root).
func RegistryDir(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins_registry")
}

// PluginDir is the plugin's data directory under kubeletDir, which holds
// its DRA socket and, in a rolling update, the lock file that serializes
// the calls of both instances (the library's KubeletPluginsDir/<driver>).
func PluginDir(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins", DriverName)
}

// RegistrationSocket is the registration socket the plugin serves when it
// is not in a rolling update: "<driver>-reg.sock" in RegistryDir. In a
// rolling update each instance has its own, named by its pod's UID
// (kubeletplugin.RollingUpdateRegistrarSocketFile).
func RegistrationSocket(kubeletDir string) string {
	return filepath.Join(RegistryDir(kubeletDir), DriverName+"-reg.sock")
}

// DRASocket is the socket of the DRA service when the plugin is not in a
// rolling update ("dra-<pod UID>.sock" when it is).
func DRASocket(kubeletDir string) string {
	return filepath.Join(PluginDir(kubeletDir), "dra.sock")
}

// PluginConfig is what a KubeletPlugin needs beside its Preparer.
type PluginConfig struct {
	// KubeletDir is the kubelet's root directory; DefaultKubeletDir if
	// empty.
	KubeletDir string
	// NodeName is this node, the pool of its ResourceSlices.
	NodeName string
	// PodUID is the agent pod's UID (from the downward API). When set, the
	// plugin runs in the library's rolling-update mode: its sockets carry
	// the UID, so two pods on one node (a DaemonSet rollout that surges)
	// both serve the kubelet, neither removes the other's sockets, and
	// their calls are serialized through a lock file.
	PodUID types.UID
	// DeviceMetadata turns on the library's device metadata (KEP-5304):
	// for each prepared request a JSON file with the attributes its
	// devices have in the ResourceSlice, under the plugin's directory,
	// and a CDI spec in CDIDir that mounts it into the containers.
	DeviceMetadata bool
	// CDIDir is where those CDI specs go; DefaultCDIDir if empty.
	CDIDir string
	Log    *slog.Logger
}

// KubeletPlugin is the agent's DRA driver as k8s.io/dynamic-resource-allocation's
// kubeletplugin helper runs it: the helper serves the registration
// service, the DRA services (v1 and v1beta1), the DRAResourceHealth
// services (v1 and v1alpha1), reads each claim before a prepare, and
// publishes the node's ResourceSlices through its resourceslice
// controller. KubeletPlugin is the kubeletplugin.DRAPlugin behind it:
// prepare and unprepare through the Preparer, the devices' health from
// SetHealth, background errors logged.
type KubeletPlugin struct {
	prep  *Preparer
	cfg   PluginConfig
	log   *slog.Logger
	clock clock.WithTicker // tests replace it before Start

	// healthMu guards the health state and the streams waiting for it; it
	// is not mu, so SetHealth never waits for Start or Stop.
	healthMu      sync.Mutex
	health        *healthState // nil until the first SetHealth
	healthSubs    map[chan struct{}]struct{}
	healthStreams atomic.Int64

	mu     sync.Mutex
	helper *kubeletplugin.Helper
	// registration is what the kubelet last said in
	// NotifyRegistrationStatus, recorded by regInterceptor (the helper's
	// own RegistrationStatus is not safe to read while the kubelet calls).
	registration *registerapi.RegistrationStatus
	// devices and counters are the last SetDevices; published once the
	// helper runs.
	devices     []resourceapi.Device
	counters    []resourceapi.CounterSet
	haveDevices bool
	published   bool
}

var _ kubeletplugin.DRAPlugin = (*KubeletPlugin)(nil)

// NewKubeletPlugin returns a plugin for prep; Start serves it.
func NewKubeletPlugin(prep *Preparer, cfg PluginConfig) *KubeletPlugin {
	if cfg.KubeletDir == "" {
		cfg.KubeletDir = DefaultKubeletDir
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &KubeletPlugin{prep: prep, cfg: cfg, log: cfg.Log, clock: clock.RealClock{},
		healthSubs: map[chan struct{}]struct{}{}}
}

// Start starts the library's helper over client, the API client it reads
// ResourceClaims and writes ResourceSlices with: it listens on the DRA
// socket, then on the registration socket (stale sockets of an earlier
// run removed), and serves both until Stop or ctx ends. Devices set
// before Start are published now.
func (p *KubeletPlugin) Start(ctx context.Context, client kubernetes.Interface) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.helper != nil {
		return errors.New("dra kubelet plugin: already started")
	}
	if client == nil || p.cfg.NodeName == "" {
		return errors.New("dra kubelet plugin: an API client and the node name are required")
	}
	// The library listens in these directories but does not make them
	// (the kubelet makes the registry; the plugin's own is ours to make).
	for _, dir := range []string{RegistryDir(p.cfg.KubeletDir), PluginDir(p.cfg.KubeletDir)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("dra kubelet plugin: %w", err)
		}
	}
	// The library logs through klog's context logger: route it to ours.
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(p.log.Handler()))
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(p.cfg.NodeName),
		kubeletplugin.RegistrarDirectoryPath(RegistryDir(p.cfg.KubeletDir)),
		kubeletplugin.PluginDataDirectoryPath(PluginDir(p.cfg.KubeletDir)),
		kubeletplugin.GRPCInterceptor(p.regInterceptor),
	}
	if p.cfg.PodUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(p.cfg.PodUID))
	}
	if p.cfg.DeviceMetadata {
		cdiDir := p.cfg.CDIDir
		if cdiDir == "" {
			cdiDir = DefaultCDIDir
		}
		// v1beta1 is the newest metadata version of this library; the
		// library refuses a list without the newest.
		opts = append(opts, kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
			kubeletplugin.CDIDirectory(cdiDir))
	}
	h, err := kubeletplugin.Start(ctx, p, opts...)
	if err != nil {
		return fmt.Errorf("dra kubelet plugin: %w", err)
	}
	p.helper = h
	if p.haveDevices {
		if err := p.publishLocked(); err != nil {
			h.Stop()
			p.helper = nil
			return err
		}
	}
	p.log.Info("dra kubelet plugin serving", "driver", DriverName, "pluginDir", PluginDir(p.cfg.KubeletDir),
		"registryDir", RegistryDir(p.cfg.KubeletDir), "rollingUpdate", p.cfg.PodUID != "")
	return nil
}

// Stop stops the helper: its servers (removing their sockets, the
// registration socket's removal makes the kubelet unregister the plugin),
// its health streams and its ResourceSlice controller. The slices stay
// on the API server: the next run takes them over.
func (p *KubeletPlugin) Stop() {
	p.mu.Lock()
	h := p.helper
	p.helper, p.registration = nil, nil
	p.mu.Unlock()
	h.Stop()
}

// Registered reports whether the kubelet said it registered the plugin,
// and its error if it said it did not.
func (p *KubeletPlugin) Registered() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.helper == nil {
		return false, "not started"
	}
	if p.registration == nil {
		return false, "the kubelet has not called yet"
	}
	return p.registration.PluginRegistered, p.registration.Error
}

// regInterceptor records each NotifyRegistrationStatus the kubelet sends
// the helper's registration server, then lets the helper answer it.
func (p *KubeletPlugin) regInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		p.mu.Lock()
		p.registration = st
		p.mu.Unlock()
		if st.PluginRegistered {
			p.log.Info("dra kubelet plugin registered with the kubelet", "driver", DriverName)
		} else {
			p.log.Error("dra kubelet plugin: kubelet refused registration", "err", st.Error)
		}
	}
	return handler(ctx, req)
}

// SetDevices makes devs (Build's devices, in order) and counters (Build's
// counter sets) the node's published devices, split into the slices of
// its pool (SplitCounters, then Split); the latest call wins. The
// library's controller writes only what changed. Never blocks on the API
// server.
func (p *KubeletPlugin) SetDevices(devs []resourceapi.Device, counters []resourceapi.CounterSet) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices, p.counters, p.haveDevices = devs, counters, true
	if p.helper == nil {
		return
	}
	if err := p.publishLocked(); err != nil {
		p.log.Error("ResourceSlices not published", "err", err)
	}
}

func (p *KubeletPlugin) publishLocked() error {
	var slices []resourceslice.Slice
	for _, c := range SplitCounters(p.counters) {
		slices = append(slices, resourceslice.Slice{SharedCounters: c})
	}
	for _, s := range Split(p.devices) {
		slices = append(slices, resourceslice.Slice{Devices: s})
	}
	err := p.helper.PublishResources(context.Background(), resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{p.cfg.NodeName: {Slices: slices}},
	})
	if err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	p.published = true
	return nil
}

// Published reports whether devices have been handed to the library's
// ResourceSlice controller (which then writes them in the background).
func (p *KubeletPlugin) Published() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published
}

// PrepareResourceClaims prepares each claim the helper has read and
// checked (allocated, same UID); per-claim failures go into the claim's
// result, as the kubelet expects.
func (p *KubeletPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	res := p.prep.Prepare(claims)
	attrs := p.metadataAttributes()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(res))
	for uid, r := range res {
		pr := kubeletplugin.PrepareResult{Err: r.Err, Devices: make([]kubeletplugin.Device, 0, len(r.Devices))}
		for _, d := range r.Devices {
			dev := kubeletplugin.Device{
				Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: d.CDIDeviceIDs,
			}
			if d.ShareID != "" {
				id := types.UID(d.ShareID)
				dev.ShareID = &id
			}
			if a, ok := attrs[d.Device]; ok && d.Pool == p.cfg.NodeName {
				dev.Metadata = &kubeletplugin.DeviceMetadata{Attributes: a}
			}
			pr.Devices = append(pr.Devices, dev)
		}
		out[types.UID(uid)] = pr
	}
	return out, nil
}

// metadataAttributes are the attributes of each published device by name,
// as the device metadata files give them (nil when they are off): the
// same attributes the ResourceSlice has, as the library advises.
func (p *KubeletPlugin) metadataAttributes() map[string]map[string]resourceapi.DeviceAttribute {
	if !p.cfg.DeviceMetadata {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]map[string]resourceapi.DeviceAttribute, len(p.devices))
	for _, d := range p.devices {
		a := make(map[string]resourceapi.DeviceAttribute, len(d.Attributes))
		for k, v := range d.Attributes {
			a[string(k)] = v
		}
		out[d.Name] = a
	}
	return out
}

// UnprepareResourceClaims unprepares each claim; an unknown claim is a
// success.
func (p *KubeletPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	refs := make([]ClaimRef, 0, len(claims))
	for _, c := range claims {
		refs = append(refs, ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)})
	}
	res := p.prep.Unprepare(refs)
	out := make(map[types.UID]error, len(res))
	for uid, err := range res {
		out[types.UID(uid)] = err
	}
	return out, nil
}

// HandleError logs an error of the helper's background work (publishing
// slices, a gRPC server, stale health reports). None is fatal to the
// agent: the device plugin, health and metrics go on, the library retries
// what can be retried, and the readiness check reports a plugin the
// kubelet does not have.
func (p *KubeletPlugin) HandleError(_ context.Context, err error, msg string) {
	p.log.Error("dra kubelet plugin: "+msg, "err", err, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

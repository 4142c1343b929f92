// Package devicemanager runs the kubelet's own device-plugin registration
// server and plugin clients (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/
// plugin/v1beta1) in the test process and records what every plugin told it.
//
// The package itself depends only on the device-plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1), so one source compiles
// against every Kubernetes version the conformance tests cover; the
// registration server of a given version comes in through a ServerFunc,
// which each conformance module writes against its own k8s.io/kubernetes.
package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocket is the registration socket name the kubelet serves.
const KubeletSocket = "kubelet.sock"

// Server is the kubelet's device-plugin registration server
// (plugin/v1beta1.Server) of one Kubernetes version.
type Server interface {
	Start() error
	Stop() error
}

// ServerFunc creates the kubelet's registration server on socketPath with h
// as its registration and client handler. Its signature differs between
// Kubernetes versions (1.37 adds a logger to NewServer, Start, Stop and the
// callbacks, a context to PluginConnected and the socket path to
// PluginDisconnected), so it is supplied per version.
type ServerFunc func(socketPath string, h Handler) (Server, error)

// Handler is the version-neutral form of the device manager's
// RegistrationHandler and ClientHandler callbacks that a ServerFunc wires
// the version's server to.
type Handler interface {
	// CleanupPluginDirectory is called when the server starts.
	CleanupPluginDirectory(dir string) error
	// PluginConnected is called when a plugin registered and the kubelet
	// dialled it back; an error refuses the plugin.
	PluginConnected(ctx context.Context, resource string, api pluginapi.DevicePluginClient) error
	// PluginDisconnected is called when the plugin's connection ends.
	PluginDisconnected(resource string)
	// PluginListAndWatchReceiver is called for every ListAndWatch response.
	PluginListAndWatchReceiver(resource string, resp *pluginapi.ListAndWatchResponse)
}

// Plugin is what the kubelet knows about one registered resource.
type Plugin struct {
	Resource string
	// Generation is the kubelet generation (1 for the first Start, +1 per
	// Restart) in which the plugin last connected.
	Generation int
	Connected  bool
	Options    *pluginapi.DevicePluginOptions
	// Devices is the last ListAndWatch response; nil before the first one.
	Devices []*pluginapi.Device
	// Updates counts ListAndWatch responses received in this generation.
	Updates     int
	ConnectedAt time.Time
	client      pluginapi.DevicePluginClient
}

// Kubelet is a stand-in for the kubelet's device manager: it serves the
// real registration server and handles the plugin clients' callbacks the
// way the device manager does (options fetched on connect, plugin directory
// cleaned of sockets on start).
type Kubelet struct {
	dir       string
	newServer ServerFunc

	mu         sync.Mutex
	server     Server
	generation int
	plugins    map[string]*Plugin
	changed    chan struct{}
}

// Start serves <dir>/kubelet.sock with the registration server newServer
// creates.
func Start(dir string, newServer ServerFunc) (*Kubelet, error) {
	k := &Kubelet{dir: dir, newServer: newServer, plugins: map[string]*Plugin{}, changed: make(chan struct{})}
	if err := k.Serve(); err != nil {
		return nil, err
	}
	return k, nil
}

// Dir is the device-plugin directory.
func (k *Kubelet) Dir() string { return k.dir }

// Generation is the number of times the registration server was started.
func (k *Kubelet) Generation() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.generation
}

// Serve starts a new generation of the registration server (after Stop):
// the plugin directory is cleaned of sockets and kubelet.sock created anew.
func (k *Kubelet) Serve() error {
	s, err := k.newServer(filepath.Join(k.dir, KubeletSocket), (*handler)(k))
	if err != nil {
		return fmt.Errorf("create registration server in %s: %w", k.dir, err)
	}
	k.mu.Lock()
	k.generation++
	k.server = s
	k.mu.Unlock()
	if err := s.Start(); err != nil {
		return fmt.Errorf("start registration server in %s: %w", k.dir, err)
	}
	k.notify()
	return nil
}

// Stop stops the registration server, disconnects every plugin client and
// removes kubelet.sock, as a kubelet going down does.
func (k *Kubelet) Stop() error {
	k.mu.Lock()
	s := k.server
	k.server = nil
	k.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.Stop()
	if rmErr := os.Remove(filepath.Join(k.dir, KubeletSocket)); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove kubelet socket: %w", rmErr))
	}
	return err
}

// Restart stops the server and starts a new one on a fresh kubelet.sock.
func (k *Kubelet) Restart() error {
	if err := k.Stop(); err != nil {
		return err
	}
	return k.Serve()
}

// Plugins returns a copy of the current plugin table, keyed by resource.
func (k *Kubelet) Plugins() map[string]Plugin {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]Plugin, len(k.plugins))
	for name, p := range k.plugins {
		out[name] = *p
	}
	return out
}

// Client returns the gRPC client the kubelet holds for a connected resource.
func (k *Kubelet) Client(resource string) (pluginapi.DevicePluginClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.plugins[resource]
	if !ok || !p.Connected {
		return nil, fmt.Errorf("resource %s is not connected", resource)
	}
	return p.client, nil
}

// WaitFor blocks until cond holds for the plugin table or ctx ends; it
// returns the table that satisfied cond (or the last one seen).
func (k *Kubelet) WaitFor(ctx context.Context, cond func(map[string]Plugin) bool) (map[string]Plugin, error) {
	for {
		k.mu.Lock()
		ch := k.changed
		k.mu.Unlock()
		snap := k.Plugins()
		if cond(snap) {
			return snap, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return snap, fmt.Errorf("wait for device manager state: %w", ctx.Err())
		}
	}
}

// Connected lists the resources connected in the current generation with at
// least one ListAndWatch response, sorted.
func Connected(plugins map[string]Plugin, generation int) []string {
	var out []string
	for name, p := range plugins {
		if p.Connected && p.Generation == generation && p.Updates > 0 {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func (k *Kubelet) notify() {
	k.mu.Lock()
	close(k.changed)
	k.changed = make(chan struct{})
	k.mu.Unlock()
}

// handler implements the device manager's callbacks.
type handler Kubelet

var _ Handler = (*handler)(nil)

func (h *handler) PluginConnected(ctx context.Context, resource string, api pluginapi.DevicePluginClient) error {
	k := (*Kubelet)(h)
	// The device manager asks for the options as part of the connection
	// and refuses the plugin when that fails; do the same.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, err := api.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("get device plugin options of %s: %w", resource, err)
	}
	k.mu.Lock()
	k.plugins[resource] = &Plugin{
		Resource:    resource,
		Generation:  k.generation,
		Connected:   true,
		Options:     opts,
		ConnectedAt: time.Now(),
		client:      api,
	}
	k.mu.Unlock()
	k.notify()
	return nil
}

func (h *handler) PluginDisconnected(resource string) {
	k := (*Kubelet)(h)
	k.mu.Lock()
	if p, ok := k.plugins[resource]; ok {
		p.Connected = false
	}
	k.mu.Unlock()
	k.notify()
}

func (h *handler) PluginListAndWatchReceiver(resource string, resp *pluginapi.ListAndWatchResponse) {
	k := (*Kubelet)(h)
	k.mu.Lock()
	if p, ok := k.plugins[resource]; ok {
		p.Devices = resp.Devices
		p.Updates++
	}
	k.mu.Unlock()
	k.notify()
}

// CleanupPluginDirectory removes every socket but kubelet.sock from the
// plugin directory, which is what the kubelet's device manager does when it
// starts: a plugin must notice and re-create its socket before
// re-registering.
func (h *handler) CleanupPluginDirectory(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read plugin directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

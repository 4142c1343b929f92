package conformance

// The kubelet code of k8s.io/kubernetes v1.37 behind what the shared tests
// call. kubelet134/version_test.go is the same for v1.34; every other test
// file here is shared with it. What differs from 1.34:
//   - a klog.Logger (or a context) is the first argument of the
//     registration server's NewServer, Start and Stop, of its callbacks, of
//     the device manager's constructor, Start, Stop and
//     GetAllocatableDevices, and of the topology manager's NewManager and
//     AddHintProvider;
//   - PluginConnected takes a context, PluginDisconnected also the socket
//     path (1.37 keeps several endpoints per resource);
//   - the topology manager's Admit takes a context and the attributes an
//     Operation (add or resize); the device manager's Allocate likewise;
//   - cadvisor's types moved from github.com/google/cadvisor/info/v1 to
//     github.com/google/cadvisor/lib/model (same fields and JSON).

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	dm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	standin "github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// kubeletVersion is the k8s.io/kubernetes this module pins (../go.mod).
const kubeletVersion = "v1.37.2"

// keepsEndpointPerSocket: this device manager keeps one endpoint per plugin
// socket of a resource, so two agents on a node (a rollout that surges)
// serve side by side and the old one leaving takes nothing away.
const keepsEndpointPerSocket = true

// newRegistrationServer is the standin.ServerFunc of this version.
func newRegistrationServer(socketPath string, h standin.Handler) (standin.Server, error) {
	logger := klog.Background()
	s, err := dm.NewServer(logger, socketPath, handler{h}, handler{h})
	if err != nil {
		return nil, err
	}
	return server{s: s, logger: logger}, nil
}

type server struct {
	s      dm.Server
	logger klog.Logger
}

func (s server) Start() error { return s.s.Start(s.logger) }
func (s server) Stop() error  { return s.s.Stop(s.logger) }

// handler adapts the version-neutral callbacks to this version's
// RegistrationHandler and ClientHandler.
type handler struct{ h standin.Handler }

func (a handler) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	return a.h.CleanupPluginDirectory(dir)
}

func (a handler) PluginConnected(ctx context.Context, resource string, p dm.DevicePlugin) error {
	return a.h.PluginConnected(ctx, resource, p.API())
}

func (a handler) PluginDisconnected(_ klog.Logger, resource, _ string) {
	a.h.PluginDisconnected(resource)
}

func (a handler) PluginListAndWatchReceiver(_ klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	a.h.PluginListAndWatchReceiver(resource, resp)
}

// newManagerImpl is the device manager's constructor with the socket path
// as a parameter, which its own tests use: the exported NewManagerImpl
// always serves /var/lib/kubelet/device-plugins/kubelet.sock (and keeps its
// checkpoint there), which a test must not take over.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

type topologyKubeletImpl struct {
	ctx    context.Context
	logger klog.Logger
	tm     topologymanager.Manager
	dm     *devicemanager.ManagerImpl
}

// startTopologyKubelet wires the topology manager and the device manager
// as the container manager does and starts the device manager's
// registration server on socketPath; both stop when the test ends.
func startTopologyKubelet(t *testing.T, socketPath string, machine []byte, policy, scope string, activePods func() []*v1.Pod) topologyKubelet {
	t.Helper()
	var info cadvisorapi.MachineInfo
	if err := json.Unmarshal(machine, &info); err != nil {
		t.Fatalf("decode machine info: %v", err)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	tm, err := topologymanager.NewManager(logger, info.Topology, policy, scope, nil)
	if err != nil {
		t.Fatalf("topology manager: %v", err)
	}
	m, err := newManagerImpl(logger, socketPath, info.Topology, tm)
	if err != nil {
		t.Fatalf("device manager: %v", err)
	}
	tm.AddHintProvider(logger, m)
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := m.Start(logger, activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatalf("start device manager: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Stop(logger); err != nil {
			t.Errorf("stop device manager: %v", err)
		}
	})
	return &topologyKubeletImpl{ctx: klog.NewContext(context.Background(), logger), logger: logger, tm: tm, dm: m}
}

func (k *topologyKubeletImpl) Admit(pod *v1.Pod) admitResult {
	r := k.tm.Admit(k.ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
	return admitResult{Admit: r.Admit, Reason: r.Reason, Message: r.Message}
}

func (k *topologyKubeletImpl) Allocatable() map[string][]*pluginapi.Device {
	return flatten(k.dm.GetAllocatableDevices(k.logger))
}

func (k *topologyKubeletImpl) Devices(podUID, container string) map[string][]*pluginapi.Device {
	return flatten(k.dm.GetDevices(podUID, container))
}

func (k *topologyKubeletImpl) Envs(pod *v1.Pod, container string) (map[string]string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		opts, err := k.dm.GetDeviceRunContainerOptions(k.ctx, pod, &c)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		if opts != nil {
			for _, e := range opts.Envs {
				out[e.Name] = e.Value
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("pod %s has no container %s", pod.Name, container)
}

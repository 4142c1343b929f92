package conformance

// The kubelet code of k8s.io/kubernetes v1.34 behind what the shared tests
// call (../version_test.go is the same for v1.37, and lists what differs);
// every other test file here is a symlink to test/conformance.

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	dm "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	standin "github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// kubeletVersion is the k8s.io/kubernetes this module pins (go.mod).
const kubeletVersion = "v1.34.4"

// keepsEndpointPerSocket: this device manager keeps one plugin per
// resource; when one of two agents on a node stops, it disconnects the
// other's client (see ../rollout_test.go).
const keepsEndpointPerSocket = false

// newRegistrationServer is the standin.ServerFunc of this version.
func newRegistrationServer(socketPath string, h standin.Handler) (standin.Server, error) {
	return dm.NewServer(socketPath, handler{h}, handler{h})
}

// handler adapts the version-neutral callbacks to this version's
// RegistrationHandler and ClientHandler.
type handler struct{ h standin.Handler }

func (a handler) CleanupPluginDirectory(dir string) error { return a.h.CleanupPluginDirectory(dir) }

func (a handler) PluginConnected(resource string, p dm.DevicePlugin) error {
	return a.h.PluginConnected(context.Background(), resource, p.API())
}

func (a handler) PluginDisconnected(resource string) { a.h.PluginDisconnected(resource) }

func (a handler) PluginListAndWatchReceiver(resource string, resp *pluginapi.ListAndWatchResponse) {
	a.h.PluginListAndWatchReceiver(resource, resp)
}

// newManagerImpl is the device manager's constructor with the socket path
// as a parameter, which its own tests use: the exported NewManagerImpl
// always serves /var/lib/kubelet/device-plugins/kubelet.sock (and keeps its
// checkpoint there), which a test must not take over.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

type topologyKubeletImpl struct {
	tm topologymanager.Manager
	dm *devicemanager.ManagerImpl
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
	// 1.34 logs through the global klog, to stderr: klog.SetLogger cannot
	// be swapped safely while the previous test's goroutines still log.
	tm, err := topologymanager.NewManager(info.Topology, policy, scope, nil)
	if err != nil {
		t.Fatalf("topology manager: %v", err)
	}
	m, err := newManagerImpl(socketPath, info.Topology, tm)
	if err != nil {
		t.Fatalf("device manager: %v", err)
	}
	tm.AddHintProvider(m)
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := m.Start(activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatalf("start device manager: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("stop device manager: %v", err)
		}
	})
	return &topologyKubeletImpl{tm: tm, dm: m}
}

func (k *topologyKubeletImpl) Admit(pod *v1.Pod) admitResult {
	r := k.tm.Admit(&lifecycle.PodAdmitAttributes{Pod: pod})
	return admitResult{Admit: r.Admit, Reason: r.Reason, Message: r.Message}
}

func (k *topologyKubeletImpl) Allocatable() map[string][]*pluginapi.Device {
	return flatten(k.dm.GetAllocatableDevices())
}

func (k *topologyKubeletImpl) Devices(podUID, container string) map[string][]*pluginapi.Device {
	return flatten(k.dm.GetDevices(podUID, container))
}

func (k *topologyKubeletImpl) Envs(pod *v1.Pod, container string) (map[string]string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		opts, err := k.dm.GetDeviceRunContainerOptions(pod, &c)
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

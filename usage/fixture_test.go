package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage/usagetest"
)

const mib = 1 << 20

// Real-looking identities used across the tests.
const (
	gpu0 = "GPU-9b341c59-f96b-ba85-c137-78c3652fea65"
	gpu1 = "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"
	gpu2 = "GPU-77a702db-e37f-3a74-d46d-c5713f66058c"
	mig0 = "MIG-1b2e3a4c-5d6e-5f70-8a9b-0c1d2e3f4a5b"
	mig1 = "MIG-2c3f4b5d-6e7f-5081-9bac-1d2e3f4a5b6c"

	uidTrain = "513cb897-0262-4868-826f-aa943ee45a38"
	uidInfer = "94283d1b-ce5a-4797-bff8-0cf0c7143b2b"
	uidNoGPU = "f21fe02b-e6e2-4d04-9a4a-9e57367fa324"
	uidGone  = "de6df8b8-a6b7-41cc-97a6-19d0fbd44714"

	ctrID = "aaefb9d8feed2d453b543f6d928cede7a4dbefa6a0ae7c9b990dd234c56e93b9"
)

// podCgroup is a cgroup v2 file of a process of pod uid (systemd driver,
// containerd, burstable), as a real node writes it.
func podCgroup(uid string) string {
	return "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") +
		".slice/cri-containerd-" + ctrID + ".scope\n"
}

const hostCgroup = "0::/user.slice/user-0.slice/session-3.scope\n"

// hostTree is a host root in a temporary directory: /proc entries, the
// kubelet's device-plugin directory with its checkpoint, pod log dirs.
type hostTree struct {
	t    testing.TB
	root string
}

func newHostTree(t testing.TB) *hostTree {
	h := &hostTree{t: t, root: t.TempDir()}
	h.mkdir("proc")
	h.mkdir("var/log/pods")
	h.mkdir("var/lib/kubelet/device-plugins")
	return h
}

func (h *hostTree) mkdir(rel string) {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Join(h.root, rel), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *hostTree) write(rel, content string) {
	h.t.Helper()
	h.mkdir(filepath.Dir(rel))
	if err := os.WriteFile(filepath.Join(h.root, rel), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// hostPIDs makes <root>/proc/self this process's PID, as a host /proc
// read from the host's PID namespace shows it.
func (h *hostTree) hostPIDs() {
	h.t.Helper()
	if err := os.Symlink(strconv.Itoa(os.Getpid()), filepath.Join(h.root, "proc/self")); err != nil {
		h.t.Fatal(err)
	}
}

// proc writes /proc/<pid>/{stat,cgroup} (stat in proc(5)'s format, as
// the kernel writes it, start time in field 22).
func (h *hostTree) proc(pid uint32, start uint64, comm, state, cgroup string) {
	h.t.Helper()
	dir := filepath.Join("proc", strconv.FormatUint(uint64(pid), 10))
	h.write(filepath.Join(dir, "stat"), fmt.Sprintf("%d (%s) %s 1 %d %d 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 %d 3133440 410 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
		pid, comm, state, pid, pid, start))
	h.write(filepath.Join(dir, "cgroup"), cgroup)
}

func (h *hostTree) killProc(pid uint32) {
	h.t.Helper()
	if err := os.RemoveAll(filepath.Join(h.root, "proc", strconv.FormatUint(uint64(pid), 10))); err != nil {
		h.t.Fatal(err)
	}
}

// podLogs makes the kubelet's log directory of a pod.
func (h *hostTree) podLogs(namespace, name, uid string) {
	h.mkdir(filepath.Join("var/log/pods", namespace+"_"+name+"_"+uid, "main"))
}

func (h *hostTree) rmPodLogs(namespace, name, uid string) {
	h.t.Helper()
	if err := os.RemoveAll(filepath.Join(h.root, "var/log/pods", namespace+"_"+name+"_"+uid)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *hostTree) pluginDir() string { return filepath.Join(h.root, "var/lib/kubelet/device-plugins") }

// checkpoint writes the device manager's checkpoint as the kubelet does
// (per-NUMA DeviceIDs, NUMA node 0).
func (h *hostTree) checkpoint(entries ...CheckpointEntry) {
	h.t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	var es []entry
	for _, e := range entries {
		es = append(es, entry{e.PodUID, e.Container, e.Resource, map[string][]string{"0": e.DeviceIDs}, []byte("resp")})
	}
	b, err := json.Marshal(map[string]any{"Data": map[string]any{"PodDeviceEntries": es,
		"RegisteredDevices": map[string][]string{"nvidia.com/gpu": {gpu0, gpu1, gpu2}}}, "Checksum": 2442330366})
	if err != nil {
		h.t.Fatal(err)
	}
	h.write("var/lib/kubelet/device-plugins/"+CheckpointFile, string(b))
}

func pod(namespace, name string, ctrs ...*podresourcesv1.ContainerResources) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Name: name, Namespace: namespace, Containers: ctrs}
}

func container(name, resource string, ids ...string) *podresourcesv1.ContainerResources {
	c := &podresourcesv1.ContainerResources{Name: name}
	if resource != "" {
		c.Devices = []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}
	}
	return c
}

// fakeSamples stands in for the NVML sampler.
type fakeSamples struct {
	mu   sync.Mutex
	snap *nvmlowner.Snapshot
	ch   chan struct{}
}

func newFakeSamples() *fakeSamples { return &fakeSamples{ch: make(chan struct{}, 1)} }

func (f *fakeSamples) Subscribe() <-chan struct{} { return f.ch }

func (f *fakeSamples) Latest() *nvmlowner.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// publish makes samples the next cycle.
func (f *fakeSamples) publish(samples ...nvmlowner.Sample) {
	f.mu.Lock()
	seq := uint64(1)
	if f.snap != nil {
		seq = f.snap.Seq + 1
	}
	f.snap = &nvmlowner.Snapshot{Seq: seq, Samples: samples}
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// gpuSample is a sample of GPU uuid with the processes listed and the
// memory NVML reports: used (v1, reserved included) and reserved.
func gpuSample(uuid string, usedMiB, reservedMiB uint64, procs ...nvmlowner.Process) nvmlowner.Sample {
	s := nvmlowner.Sample{UUID: uuid, Processes: procs, ProcessesRead: nvmlowner.Value{Status: nvmlowner.OK}}
	s.Values[nvmlowner.FieldFBUsed] = nvmlowner.Value{V: usedMiB * mib, Status: nvmlowner.OK}
	s.Values[nvmlowner.FieldFBReserved] = nvmlowner.Value{V: reservedMiB * mib, Status: nvmlowner.OK}
	return s
}

func nvmlProc(pid uint32, memMiB uint64) nvmlowner.Process {
	return nvmlowner.Process{PID: pid, UsedMemory: nvmlowner.Value{V: memMiB * mib, Status: nvmlowner.OK}, Compute: true}
}

// fakeHealth records observations and, like the monitor, keeps the state
// they leave per device and cause.
type fakeHealth struct {
	mu    sync.Mutex
	obs   []health.Observation
	fatal map[string]string // device/key -> reason
}

func (f *fakeHealth) Observe(o health.Observation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.obs = append(f.obs, o)
	if f.fatal == nil {
		f.fatal = map[string]string{}
	}
	k := o.DeviceID + "/" + o.Key
	if o.Fatal {
		f.fatal[k] = o.Reason
	} else if o.Cleared {
		delete(f.fatal, k)
	}
}

// reason is the active cause of device for class ("" when none).
func (f *fakeHealth) reason(device string, c Class) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fatal[device+"/"+string(c)]
}

func (f *fakeHealth) observations() []health.Observation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]health.Observation(nil), f.obs...)
}

type event struct{ typ, reason, msg string }

type fakeEvents struct {
	mu     sync.Mutex
	events []event
}

func (f *fakeEvents) Event(typ, reason, msg string) {
	f.mu.Lock()
	f.events = append(f.events, event{typ, reason, msg})
	f.mu.Unlock()
}

func (f *fakeEvents) byReason(reason string) []event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []event
	for _, e := range f.events {
		if e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// fakeSignaller is a node's processes as far as signals go: a process
// exits on a signal unless it ignores it (D state ignores all).
type fakeSignaller struct {
	mu      sync.Mutex
	sent    []string
	ignore  map[uint32][]syscall.Signal
	exited  func(pid uint32)
	failErr error
}

func (f *fakeSignaller) Signal(p ProcessRef, sig syscall.Signal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failErr != nil {
		return f.failErr
	}
	f.sent = append(f.sent, fmt.Sprintf("%d:%s", p.PID, signalName(sig)))
	for _, s := range f.ignore[p.PID] {
		if s == sig {
			return nil
		}
	}
	if f.exited != nil {
		f.exited(p.PID)
	}
	return nil
}

func (f *fakeSignaller) signals() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sent...)
}

// testNode is a node with GPUs gpu0..gpu2, gpu2 with two MIG devices.
func testNode() *topology.Node {
	return &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: gpu0, Model: "NVIDIA H100 80GB HBM3"},
		{Index: 1, UUID: gpu1, Model: "NVIDIA H100 80GB HBM3"},
		{Index: 2, UUID: gpu2, Model: "NVIDIA H100 80GB HBM3", MIGEnabled: true, MIG: []topology.MIGDevice{
			{UUID: mig0, Profile: "3g.40gb", GPUInstance: 1, Index: 0},
			{UUID: mig1, Profile: "1g.10gb", GPUInstance: 9, Index: 1},
		}},
	}}
}

// rig is a tracker on a host tree with a fake kubelet and a fake clock.
type rig struct {
	t       *testing.T
	host    *hostTree
	kubelet *usagetest.PodResources
	samples *fakeSamples
	clock   *clocktesting.FakeClock
	health  *fakeHealth
	events  *fakeEvents
	signals *fakeSignaller
	reg     *prometheus.Registry
	tr      *Tracker
}

type rigOption func(*Config, *Options)

func newRig(t *testing.T, hostPIDs bool, opts ...rigOption) *rig {
	t.Helper()
	r := &rig{t: t, host: newHostTree(t), samples: newFakeSamples(), clock: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)),
		health: &fakeHealth{}, events: &fakeEvents{}, signals: &fakeSignaller{}, reg: prometheus.NewPedanticRegistry()}
	if hostPIDs {
		r.host.hostPIDs()
	}
	socket := PodResourcesSocketPath(r.host.root)
	r.kubelet = usagetest.ServePodResources(t, socket)
	cfg := Config{Judge: true, HostRoot: r.host.root, DevicePluginDir: r.host.pluginDir(), PodResourcesSocket: socket, MIGDevicesServed: true}
	o := Options{Samples: r.samples, Health: r.health, Events: r.events, Signaller: r.signals, Clock: r.clock,
		Logger: testLogger(t), Registerer: r.reg}
	for _, f := range opts {
		f(&cfg, &o)
	}
	tr, err := NewTracker(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	tr.SetNode(testNode())
	r.tr = tr
	return r
}

// cycle publishes samples and runs the tracker's cycle on them.
func (r *rig) cycle(samples ...nvmlowner.Sample) {
	r.t.Helper()
	r.samples.publish(samples...)
	r.tr.Cycle(context.Background())
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

var errKubeletDown = errors.New("kubelet restarting")

package usage

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// This node's name, which is its DRA pool's.
const draPool = "dgx-h100-07"

// Claim UIDs (the kubelet's CDI device IDs carry them).
const (
	claimTrain = "3f0d7a52-8e7b-4c61-9d0e-5a4b2c1d0e9f"
	claimInfer = "7c2e9b14-1a3d-4f5e-8b6c-0d9e8f7a6b5c"
	claimNV    = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"
	claimExt   = "b1c2d3e4-f5a6-4b7c-8d9e-0f1a2b3c4d5e"
)

// Our DRA device names of draNode's devices (dra.GPUName, MIGName, NICName).
const (
	devGPU0 = "gpu-0"
	devGPU1 = "gpu-1"
	devMIG0 = "gpu-2-mig-3g40gb-1-0"
	devMIG1 = "gpu-2-mig-1g10gb-9-0"
	devNIC0 = "nic-mlx5-0"
)

// draNode is testNode with two RDMA NICs, as the agent hands the tracker
// its model (rdma adds the NICs to it).
func draNode() *topology.Node {
	n := testNode()
	n.NICs = []topology.NIC{{Name: "mlx5_0", LinkLayer: "InfiniBand"}, {Name: "mlx5_1", LinkLayer: "InfiniBand"}}
	return n
}

// ours is one device of our driver in a container's dynamic resources, as
// the kubelet records it from our kubelet plugin's NodePrepareResources
// answer (dra/prepare.go): the device's own CDI device
// gpu-node-agent.io/claim=<claim UID>-<device> and, on the first device of
// a request, the request's environment <claim UID>-request-<request>.
func ours(claimUID, pool, device, firstOfRequest string) *podresourcesv1.ClaimResource {
	cdi := []*podresourcesv1.CDIDevice{{Name: "gpu-node-agent.io/claim=" + claimUID + "-" + device}}
	if firstOfRequest != "" {
		cdi = append(cdi, &podresourcesv1.CDIDevice{Name: "gpu-node-agent.io/claim=" + claimUID + "-request-" + firstOfRequest})
	}
	return &podresourcesv1.ClaimResource{CdiDevices: cdi, DriverName: dra.DriverName, PoolName: pool, DeviceName: device}
}

// nvidiaDRA is a device of NVIDIA's DRA driver: the same GPU names in a
// pool of the same name (the node's), CDI device
// k8s.gpu.nvidia.com/claim=<claim UID>-<device> (k8s-dra-driver-gpu,
// CDIHandler.GetClaimDeviceName).
func nvidiaDRA(claimUID, pool, device string) *podresourcesv1.ClaimResource {
	return &podresourcesv1.ClaimResource{CdiDevices: []*podresourcesv1.CDIDevice{{Name: "k8s.gpu.nvidia.com/claim=" + claimUID + "-" + device}},
		DriverName: "gpu.nvidia.com", PoolName: pool, DeviceName: device}
}

// claim is one ResourceClaim a container references, as the kubelet lists
// it: name and namespace, every device of the claim.
func claim(namespace, name string, devs ...*podresourcesv1.ClaimResource) *podresourcesv1.DynamicResource {
	return &podresourcesv1.DynamicResource{ClaimName: name, ClaimNamespace: namespace, ClaimResources: devs}
}

// draContainer is a container whose devices all come through claims: the
// kubelet lists no device-plugin devices for it.
func draContainer(name string, claims ...*podresourcesv1.DynamicResource) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, DynamicResources: claims}
}

// withClaims adds claims to a container.
func withClaims(c *podresourcesv1.ContainerResources, claims ...*podresourcesv1.DynamicResource) *podresourcesv1.ContainerResources {
	c.DynamicResources = append(c.DynamicResources, claims...)
	return c
}

// trainDRA is ml/train-0 holding gpu-0 through its claim train-0-gpus-x7k2p
// (made from the pod's ResourceClaimTemplate).
func trainDRA(pool string) *podresourcesv1.PodResources {
	return pod("ml", "train-0", draContainer("trainer", claim("ml", "train-0-gpus-x7k2p", ours(claimTrain, pool, devGPU0, "gpus"))))
}

// TestDRADeviceNames: the tracker resolves exactly the device names
// dra.Build publishes, each to the device's UUID (GPU, MIG) or RDMA
// device name (NIC), on simulated DGX H100 (GPUs and NICs) and DGX A100
// with MIG (a GPU in MIG mode is offered as its MIG devices only).
func TestDRADeviceNames(t *testing.T) {
	for _, tt := range []struct {
		name    string
		profile string
		opts    []sim.ProfileOption
	}{
		{name: "dgx-h100", profile: "dgx-h100"},
		{name: "dgx-a100-mig", profile: "dgx-a100", opts: []sim.ProfileOption{
			sim.WithMIG(0, "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"),
			sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb"),
			sim.WithMIG(2, "7g.40gb"),
		}},
		{name: "pcie-8gpu", profile: "pcie-8gpu"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, err := sim.Profile(tt.profile, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			res, err := dra.Build(n, dra.Options{})
			if err != nil {
				t.Fatal(err)
			}
			devs := newDRADevices(draPool, n)
			want := map[string]string{}
			for _, d := range res.Devices {
				attr := dra.AttrUUID
				if d.Attributes[dra.AttrType].StringValue != nil && *d.Attributes[dra.AttrType].StringValue == dra.TypeNIC {
					attr = dra.AttrRDMADevice
				}
				v := d.Attributes[attr].StringValue
				if v == nil {
					t.Fatalf("%s has no %s attribute", d.Name, attr)
				}
				want[d.Name] = *v
			}
			if len(want) == 0 || len(n.NICs) > 0 && !hasKind(res.Devices, dra.TypeNIC) {
				t.Fatalf("profile has no devices to check: %v", want)
			}
			if len(devs.ids) != len(want) {
				t.Errorf("resolver has %d names, Build publishes %d", len(devs.ids), len(want))
			}
			for name, id := range want {
				if got := devs.ids[name]; got != id {
					t.Errorf("%s resolves to %q, Build publishes it for %q", name, got, id)
				}
			}
		})
	}
	t.Run("lost GPU without a UUID and DRA off", func(t *testing.T) {
		n := draNode()
		n.GPUs[1].UUID, n.GPUs[1].Lost = "", true
		devs := newDRADevices(draPool, n)
		if id, ok := devs.ids[devGPU1]; ok {
			t.Errorf("a GPU without a UUID resolves to %q", id)
		}
		if devs.ids[devGPU0] != gpu0 || devs.ids[devMIG1] != mig1 || devs.ids[devNIC0] != "mlx5_0" {
			t.Errorf("resolver = %v", devs.ids)
		}
		if _, ok := devs.ids["gpu-2"]; ok {
			t.Error("a GPU in MIG mode resolves as a whole GPU; Build does not publish it")
		}
		if newDRADevices("", n) != nil {
			t.Error("no pool (DRA off) must ignore dynamic resources")
		}
	})
}

func hasKind(devs []resourceapi.Device, kind string) bool {
	for _, d := range devs {
		if v := d.Attributes[dra.AttrType].StringValue; v != nil && *v == kind {
			return true
		}
	}
	return false
}

// TestDRAAssignments: which containers the kubelet's List makes each
// device's owners, with DRA on, from List messages as the kubelet fills
// them.
func TestDRAAssignments(t *testing.T) {
	type owner struct{ uid, pod, container, claim, device string }
	tests := []struct {
		name       string
		pods       []*podresourcesv1.PodResources
		checkpoint []CheckpointEntry
		logs       map[podName][]string
		pool       string
		want       map[string][]owner // device ID -> owners
		unresolved []string           // device names
	}{
		{
			name: "a GPU through a claim: owner with the UID of the pod's log directory",
			pods: []*podresourcesv1.PodResources{trainDRA(draPool)},
			logs: map[podName][]string{{"ml", "train-0"}: {uidTrain}},
			want: map[string][]owner{gpu0: {{uidTrain, "train-0", "trainer", "ml/train-0-gpus-x7k2p", devGPU0}}},
		},
		{
			name: "a MIG device and a NIC in one claim, two containers referencing it",
			pods: []*podresourcesv1.PodResources{pod("serving", "infer-1",
				draContainer("server", claim("serving", "infer-1-mig-n4w8d", ours(claimInfer, draPool, devMIG1, "mig"), ours(claimInfer, draPool, devNIC0, "nic"))),
				draContainer("proxy", claim("serving", "infer-1-mig-n4w8d", ours(claimInfer, draPool, devMIG1, "mig"), ours(claimInfer, draPool, devNIC0, "nic"))),
			)},
			logs: map[podName][]string{{"serving", "infer-1"}: {uidInfer}},
			want: map[string][]owner{
				mig1:     {{uidInfer, "infer-1", "server", "serving/infer-1-mig-n4w8d", devMIG1}, {uidInfer, "infer-1", "proxy", "serving/infer-1-mig-n4w8d", devMIG1}},
				"mlx5_0": {{uidInfer, "infer-1", "server", "serving/infer-1-mig-n4w8d", devNIC0}, {uidInfer, "infer-1", "proxy", "serving/infer-1-mig-n4w8d", devNIC0}},
			},
		},
		{
			name: "another driver's device of the same name and pool, and our driver's in another pool, are not ours",
			pods: []*podresourcesv1.PodResources{pod("ml", "train-0", draContainer("trainer",
				claim("ml", "nv-gpu", nvidiaDRA(claimNV, draPool, devGPU1)),
				claim("ml", "elsewhere", ours(claimTrain, "dgx-h100-08", devGPU0, "gpus"))))},
			logs: map[podName][]string{{"ml", "train-0"}: {uidTrain}},
			want: map[string][]owner{},
		},
		{
			name:       "a device name the node does not have is left out and reported",
			pods:       []*podresourcesv1.PodResources{pod("ml", "train-0", draContainer("trainer", claim("ml", "train-0-gpus-x7k2p", ours(claimTrain, draPool, "gpu-7", "gpus"), ours(claimTrain, draPool, devGPU0, ""))))},
			logs:       map[podName][]string{{"ml", "train-0"}: {uidTrain}},
			want:       map[string][]owner{gpu0: {{uidTrain, "train-0", "trainer", "ml/train-0-gpus-x7k2p", devGPU0}}},
			unresolved: []string{"gpu-7"},
		},
		{
			name: "mixed pod: a device-plugin GPU and a DRA GPU; the DRA one has the checkpoint's UID without a log directory",
			pods: []*podresourcesv1.PodResources{pod("ml", "train-0",
				withClaims(container("trainer", "nvidia.com/gpu", gpu1), claim("ml", "train-0-gpus-x7k2p", ours(claimTrain, draPool, devGPU0, "gpus"))))},
			checkpoint: []CheckpointEntry{{PodUID: uidTrain, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu1}}},
			want: map[string][]owner{
				gpu0: {{uidTrain, "train-0", "trainer", "ml/train-0-gpus-x7k2p", devGPU0}},
				gpu1: {{uidTrain, "train-0", "trainer", "", ""}},
			},
		},
		{
			name: "two log directories for the pod's name (an earlier pod of that name not yet cleaned up): UID unknown",
			pods: []*podresourcesv1.PodResources{trainDRA(draPool)},
			logs: map[podName][]string{{"ml", "train-0"}: {uidGone, uidTrain}},
			want: map[string][]owner{gpu0: {{"", "train-0", "trainer", "ml/train-0-gpus-x7k2p", devGPU0}}},
		},
		{
			name: "no log directory yet: UID unknown",
			pods: []*podresourcesv1.PodResources{trainDRA(draPool)},
			want: map[string][]owner{gpu0: {{"", "train-0", "trainer", "ml/train-0-gpus-x7k2p", devGPU0}}},
		},
		{
			name: "a plain nvidia.com/gpu request served through DRA (DRAExtendedResource): the kubelet lists its special claim",
			pods: []*podresourcesv1.PodResources{pod("ml", "notebook", draContainer("jupyter",
				claim("ml", "notebook-extended-resources-q9z8v", ours(claimExt, draPool, devGPU1, "container-0-request-0"))))},
			logs: map[podName][]string{{"ml", "notebook"}: {uidNoGPU}},
			want: map[string][]owner{gpu1: {{uidNoGPU, "notebook", "jupyter", "ml/notebook-extended-resources-q9z8v", devGPU1}}},
		},
		{
			name: "DRA off (no pool): dynamic resources ignored",
			pods: []*podresourcesv1.PodResources{trainDRA(draPool)},
			logs: map[podName][]string{{"ml", "train-0"}: {uidTrain}},
			pool: "-",
			want: map[string][]owner{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := draPool
			if tt.pool == "-" {
				pool = ""
			}
			a := newAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: tt.pods}, tt.checkpoint, newDRADevices(pool, draNode()), tt.logs)
			for _, id := range []string{gpu0, gpu1, gpu2, mig0, mig1, "mlx5_0", "mlx5_1"} {
				var got []owner
				for _, as := range a.Of(id) {
					got = append(got, owner{as.PodUID, as.Pod, as.Container, as.Claim, as.DRADevice})
					if as.Claim != "" && (as.Resource != dra.DriverName || as.DeviceID != id || as.Namespace == "") {
						t.Errorf("DRA assignment of %s = %+v", id, as)
					}
				}
				if !slices.Equal(got, tt.want[id]) {
					t.Errorf("owners of %s = %+v, want %+v", id, got, tt.want[id])
				}
				if a.Allocated()[id] != (len(tt.want[id]) > 0) {
					t.Errorf("Allocated()[%s] = %v, want %v", id, a.Allocated()[id], len(tt.want[id]) > 0)
				}
			}
			var unresolved []string
			for _, d := range a.unresolved {
				unresolved = append(unresolved, d.name)
				if d.claim != "ml/train-0-gpus-x7k2p" {
					t.Errorf("unresolved %s names claim %q", d.name, d.claim)
				}
			}
			if !slices.Equal(unresolved, tt.unresolved) {
				t.Errorf("unresolved = %v, want %v", unresolved, tt.unresolved)
			}
		})
	}
}

// TestJudgeDRA is the classification table for devices assigned through
// DRA: a pod's own process on its DRA GPU or MIG device is own, a gone
// pod's is a zombie, another's foreign; a DRA owner whose UID is unknown
// makes a pod process unknown, never a finding against it.
func TestJudgeDRA(t *testing.T) {
	devs := newDRADevices(draPool, draNode())
	// ml/train-0 holds gpu-0, serving/infer-1 the 1g.10gb MIG device, ml/mixed a
	// device-plugin GPU (gpu1) and a DRA one (the 3g.40gb MIG device); ops/monitor
	// runs without devices; ml/nv holds NVIDIA's gpu-1 claim.
	list := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		trainDRA(draPool),
		pod("serving", "infer-1", draContainer("server", claim("serving", "infer-1-mig-n4w8d", ours(claimInfer, draPool, devMIG1, "mig")))),
		pod("ml", "mixed", withClaims(container("main", "nvidia.com/gpu", gpu1), claim("ml", "mixed-mig-5bd7c", ours(claimExt, draPool, devMIG0, "mig")))),
		pod("ops", "monitor", container("agent", "")),
		pod("ml", "nv", draContainer("main", claim("ml", "nv-gpu", nvidiaDRA(claimNV, draPool, "gpu-2")))),
	}}
	const uidMixed, uidNV = "c0a8f1e2-3b4c-4d5e-8f6a-7b8c9d0e1f2a", "e9d8c7b6-a5f4-4e3d-9c2b-1a0f9e8d7c6b"
	checkpoint := []CheckpointEntry{{PodUID: uidMixed, Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu1}}}
	logs := map[podName][]string{
		{"ml", "train-0"}: {uidTrain}, {"serving", "infer-1"}: {uidInfer}, {"ops", "monitor"}: {uidNoGPU}, {"ml", "nv"}: {uidNV},
	}
	running := map[string]bool{uidTrain: true, uidInfer: true, uidNoGPU: true, uidMixed: true, uidNV: true}
	known := attribution{assignments: newAssignments(list, checkpoint, devs, logs), checkpointOK: true,
		running: running, runningComplete: true, pids: true}
	with := func(f func(*attribution)) attribution { a := known; f(&a); return a }
	proc := func(pid uint32, uid string) procUse {
		p := procUse{PID: pid, Memory: 2048 * mib, MemoryKnown: true, Proc: Process{PID: pid, StartTime: 5000 + uint64(pid), Comm: "python3", State: "S"}}
		if uid != "" {
			p.Proc.Cgroup = CgroupInfo{PodUID: uid, QoS: QoSBurstable, ContainerID: ctrID, Runtime: RuntimeContainerd}
		}
		return p
	}
	dev := func(id string, p procUse) deviceUse {
		return deviceUse{ID: id, assignIDs: []string{id}, read: true, processes: []procUse{p}}
	}
	tests := []struct {
		name     string
		device   deviceUse
		attr     attribution
		class    Class
		killSafe bool
		why      string
	}{
		{name: "own: the claim's pod on its DRA GPU", device: dev(gpu0, proc(201, uidTrain)), attr: known, class: ClassOwn},
		{name: "own: the claim's pod on its DRA MIG device", device: dev(mig1, proc(202, uidInfer)), attr: known, class: ClassOwn},
		{name: "own: a mixed pod on its DRA MIG device (UID from the checkpoint, no log directory)", device: dev(mig0, proc(203, uidMixed)),
			attr: known, class: ClassOwn},
		{name: "own: a mixed pod on its device-plugin GPU", device: dev(gpu1, proc(204, uidMixed)), attr: known, class: ClassOwn},
		{name: "own: the pod of a MIG device's claim on its GPU (MIG devices not served separately)",
			device: deviceUse{ID: gpu2, assignIDs: []string{gpu2, mig0, mig1}, read: true, processes: []procUse{proc(205, uidInfer)}}, attr: known, class: ClassOwn},
		{name: "foreign: another running pod on a DRA GPU", device: dev(gpu0, proc(206, uidNoGPU)), attr: known, class: ClassForeign,
			why: "assigned to ml/train-0 (trainer)"},
		{name: "foreign: a host process on a DRA MIG device", device: dev(mig1, proc(207, "")), attr: known, class: ClassForeign, why: "host process"},
		{name: "foreign: a gone pod's process on a DRA GPU now another pod's", device: dev(gpu0, proc(208, uidGone)), attr: known, class: ClassForeign},
		{name: "foreign: the pod of NVIDIA's gpu-2 claim is not an owner of our GPU", device: dev(gpu2, proc(209, uidNV)), attr: known, class: ClassForeign,
			why: "not assigned to it"},
		{name: "zombie: a gone pod's process on a GPU no claim holds", device: dev(gpu2, proc(210, uidGone)), attr: known, class: ClassZombie,
			killSafe: true, why: "no longer runs"},
		{name: "foreign: the checkpoint unreadable does not hide a DRA owner's known UID", device: dev(gpu0, proc(211, uidNoGPU)),
			attr: with(func(a *attribution) {
				a.checkpointOK = false
				a.assignments = newAssignments(list, nil, devs, logs)
			}), class: ClassForeign},
		{name: "unknown: the DRA owner's UID is unknown (no log directory)", device: dev(gpu0, proc(212, uidTrain)),
			attr: with(func(a *attribution) {
				a.assignments = newAssignments(list, checkpoint, devs, map[podName][]string{{"serving", "infer-1"}: {uidInfer}})
			}), class: ClassUnknown, why: "ml/train-0 (trainer), assigned the device through DRA, is unknown"},
		{name: "unknown: two log directories for the DRA owner's name", device: dev(gpu0, proc(213, uidGone)),
			attr: with(func(a *attribution) {
				a.assignments = newAssignments(list, checkpoint, devs, map[podName][]string{{"ml", "train-0"}: {uidGone, uidTrain}})
			}), class: ClassUnknown, why: "through DRA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := judge(tt.device, tt.attr, uint64(DefaultLeakedThresholdMiB)*mib)
			if !got.judged || len(got.verdicts) != 1 {
				t.Fatalf("judged %v, verdicts %s", got.judged, describeVerdicts(got.verdicts))
			}
			v := got.verdicts[0]
			if v.Class != tt.class || v.KillSafe != tt.killSafe || !strings.Contains(v.Why, tt.why) {
				t.Errorf("verdict = %s killSafe=%v (%s), want %s killSafe=%v with %q", v.Class, v.KillSafe, v.Why, tt.class, tt.killSafe, tt.why)
			}
		})
	}
}

// draRig is a rig with DRA on for this node's pool, on draNode, on a node
// whose kubelet no device plugin has registered with (no checkpoint).
func draRig(t *testing.T, opts ...rigOption) *rig {
	t.Helper()
	r := newRig(t, true, append([]rigOption{func(c *Config, _ *Options) { c.DRAPool = draPool }}, opts...)...)
	r.tr.SetNode(draNode())
	return r
}

// TestDRAZombieAfterGrace: a pod holds a GPU (or a MIG device) through a
// claim on a node with no device-plugin checkpoint; its own process is
// never a finding nor signalled while it runs. Once it is deleted, its
// process left on the device is a zombie after the grace, reported with
// the pod's name and killed (action kill).
func TestDRAZombieAfterGrace(t *testing.T) {
	for _, tt := range []struct {
		name   string
		pod    *podresourcesv1.PodResources
		device string
		sample func(procs ...nvmlowner.Process) nvmlowner.Sample
	}{
		{name: "gpu", pod: trainDRA(draPool), device: gpu0, sample: func(procs ...nvmlowner.Process) nvmlowner.Sample {
			return gpuSample(gpu0, 30500, 500, procs...)
		}},
		{name: "mig", pod: pod("ml", "train-0", draContainer("trainer", claim("ml", "train-0-mig-x7k2p", ours(claimTrain, draPool, devMIG1, "mig")))),
			device: mig1, sample: func(procs ...nvmlowner.Process) nvmlowner.Sample {
				for i := range procs {
					procs[i].MIG = mig1
				}
				s := gpuSample(gpu2, 0, 0, procs...)
				s.MIG = []nvmlowner.MIGSample{{UUID: mig0, FBUsed: nvmlowner.Value{V: 13 * mib, Status: nvmlowner.OK}},
					{UUID: mig1, FBUsed: nvmlowner.Value{V: 9013 * mib, Status: nvmlowner.OK}}}
				return s
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := draRig(t, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
			r.kubelet.Set(tt.pod)
			r.host.podLogs("ml", "train-0", uidTrain)
			r.host.proc(4242, 77001, "python3", "S", podCgroup(uidTrain))
			busy := tt.sample(nvmlProc(4242, 9000))
			for range 20 {
				r.cycle(busy)
				r.clock.Step(15 * time.Second)
			}
			for _, c := range findingClasses {
				if got := r.health.reason(tt.device, c); got != "" {
					t.Fatalf("the claim's pod's own process was flagged %s: %q", c, got)
				}
			}
			if got := gauge(t, r, "gpu_node_agent_gpu_processes", map[string]string{"device": tt.device, "class": string(ClassOwn)}); got != 1 {
				t.Errorf("own processes on %s = %v, want 1", tt.device, got)
			}
			if got := gauge(t, r, "gpu_node_agent_gpu_process_attribution", map[string]string{"source": SourceCheckpoint}); got != 1 {
				t.Errorf("attribution{checkpoint} = %v, want 1: no device plugin, no checkpoint needed", got)
			}
			if s := r.signals.signals(); len(s) != 0 {
				t.Fatalf("signalled the running pod's process: %v", s)
			}

			r.trainDeleted()
			r.cycle(busy)
			r.clock.Step(DefaultGrace)
			r.cycle(busy)
			reason := r.health.reason(tt.device, ClassZombie)
			if !strings.Contains(reason, "pid 4242") || !strings.Contains(reason, "ml/train-0 (uid "+uidTrain+")") {
				t.Errorf("zombie reason on %s = %q, want pid 4242 of ml/train-0", tt.device, reason)
			}
			if s := r.signals.signals(); !slices.Equal(s, []string{"4242:SIGTERM"}) {
				t.Errorf("signals after the grace = %v, want SIGTERM to the zombie", s)
			}
			if evs := r.events.byReason(ReasonZombie); len(evs) != 1 || !strings.Contains(evs[0].msg, "ml/train-0") {
				t.Errorf("zombie events = %+v", evs)
			}
		})
	}
}

// TestDRANeverKillsRunningPod: a running pod's process on the GPU of its
// claim is never signalled, whatever is missing: its log directory, a
// unique log directory, or the device in the node's model.
func TestDRANeverKillsRunningPod(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(r *rig)
		class Class
	}{
		{name: "known", class: ClassOwn, setup: func(r *rig) {
			r.host.podLogs("ml", "train-0", uidTrain)
		}},
		{name: "no-logs", class: ClassUnknown, setup: func(*rig) {}},
		{name: "two-logs", class: ClassUnknown, setup: func(r *rig) {
			r.host.podLogs("ml", "train-0", uidGone)
			r.host.podLogs("ml", "train-0", uidTrain)
		}},
		{name: "unresolved", class: ClassForeign, setup: func(r *rig) {
			n := draNode()
			n.GPUs[0].Index = 5 // now gpu-5: gpu-0 does not resolve
			r.tr.SetNode(n)
			r.host.podLogs("ml", "train-0", uidTrain)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := draRig(t, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
			r.kubelet.Set(trainDRA(draPool))
			tt.setup(r)
			r.host.proc(4242, 77001, "python3", "S", podCgroup(uidTrain))
			s := gpuSample(gpu0, 30500, 500, nvmlProc(4242, 9000))
			for range 10 {
				r.cycle(s)
				r.clock.Step(DefaultGrace)
			}
			if got := gauge(t, r, "gpu_node_agent_gpu_processes", map[string]string{"device": gpu0, "class": string(tt.class)}); got != 1 {
				t.Errorf("%s processes on gpu0 = %v, want 1", tt.class, got)
			}
			if s := r.signals.signals(); len(s) != 0 {
				t.Errorf("signalled a running pod's process: %v", s)
			}
			if r.health.reason(gpu0, ClassZombie) != "" {
				t.Errorf("a running pod's process reported a zombie: %q", r.health.reason(gpu0, ClassZombie))
			}
		})
	}
}

// TestDRAFreeAndLabels: devices held through claims count as
// allocated for the fragmentation gauges, and carry their pod, namespace
// and container for the GPU metrics' labels, with the process check on or
// off (pod attribution alone); NVIDIA's driver's claims count for neither.
func TestDRAFreeAndLabels(t *testing.T) {
	for _, judge := range []bool{true, false} {
		t.Run(map[bool]string{true: "judged", false: "labels-only"}[judge], func(t *testing.T) {
			frag := NewFragmentation(draPool, FragmentationOptions{})
			r := draRig(t, func(c *Config, o *Options) {
				c.Judge = judge
				o.Allocations = frag
			})
			r.kubelet.Set(
				trainDRA(draPool),
				pod("serving", "infer-1", draContainer("server", claim("serving", "infer-1-mig-n4w8d",
					ours(claimInfer, draPool, devMIG1, "mig"), ours(claimInfer, draPool, devNIC0, "nic")))),
				pod("ml", "nv", draContainer("main", claim("ml", "nv-gpu", nvidiaDRA(claimNV, draPool, devGPU1)))),
			)
			r.host.podLogs("ml", "train-0", uidTrain)
			r.host.podLogs("serving", "infer-1", uidInfer)
			r.cycle(gpuSample(gpu0, 500, 500), gpuSample(gpu1, 500, 500), gpuSample(gpu2, 0, 0))

			want := `
# HELP gpu_node_agent_free_gpus Whole GPUs the kubelet could give a new pod now: healthy, not lost, not in MIG mode, and neither they nor a replica or MIG device of them allocated to any pod.
# TYPE gpu_node_agent_free_gpus gauge
gpu_node_agent_free_gpus{Hostname="` + draPool + `"} 1
# HELP gpu_node_agent_free_mig_devices Free MIG devices by profile (healthy, their GPU not lost, allocated to no pod); 0 for a profile configured on the node with none free.
# TYPE gpu_node_agent_free_mig_devices gauge
gpu_node_agent_free_mig_devices{Hostname="` + draPool + `",profile="1g.10gb"} 0
gpu_node_agent_free_mig_devices{Hostname="` + draPool + `",profile="3g.40gb"} 1
`
			if err := testutil.CollectAndCompare(frag, strings.NewReader(want), "gpu_node_agent_free_gpus", "gpu_node_agent_free_mig_devices"); err != nil {
				t.Error(err)
			}
			a := r.tr.Assignments()
			for _, tt := range []struct {
				id, pod, namespace, container string
			}{
				{gpu0, "train-0", "ml", "trainer"},
				{mig1, "infer-1", "serving", "server"},
				{"mlx5_0", "infer-1", "serving", "server"},
				{gpu1, "", "", ""},
				{mig0, "", "", ""},
			} {
				got, ok := a.Container(tt.id)
				if ok != (tt.pod != "") || got.Pod != tt.pod || got.Namespace != tt.namespace || got.Container != tt.container {
					t.Errorf("Container(%s) = %+v, %v; want %s/%s (%s)", tt.id, got, ok, tt.namespace, tt.pod, tt.container)
				}
			}
			if got, _ := a.Container(gpu0); judge && got.PodUID != uidTrain {
				t.Errorf("gpu0's pod UID = %q, want %s from its log directory", got.PodUID, uidTrain)
			}
		})
	}
}

// TestDRACheckpointNeeded: without the device manager's checkpoint a pod
// process is judged only when no device-plugin device is listed (nothing
// needs its UIDs) and the checkpoint's directory is there.
func TestDRACheckpointNeeded(t *testing.T) {
	for _, tt := range []struct {
		name      string
		pods      []*podresourcesv1.PodResources
		noDir     bool
		available float64
		class     Class
	}{
		{name: "dra-only", pods: []*podresourcesv1.PodResources{trainDRA(draPool)}, available: 1, class: ClassForeign},
		{name: "dp-listed", available: 0, class: ClassUnknown,
			pods: []*podresourcesv1.PodResources{trainDRA(draPool), pod("ml", "other", container("main", "example.com/fpga", "fpga-0"))}},
		{name: "no-dir", noDir: true, available: 0, class: ClassUnknown,
			pods: []*podresourcesv1.PodResources{trainDRA(draPool)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := draRig(t, func(c *Config, _ *Options) {
				if tt.noDir {
					c.DevicePluginDir += "-absent"
				}
			})
			r.kubelet.Set(tt.pods...)
			r.host.podLogs("ml", "train-0", uidTrain)
			r.host.podLogs("ml", "other", uidNoGPU)
			r.host.proc(4242, 77001, "python3", "S", podCgroup(uidNoGPU))
			r.host.proc(4243, 77002, "python3", "S", podCgroup(uidGone))
			r.cycle(gpuSample(gpu0, 1500, 500, nvmlProc(4242, 900)), gpuSample(gpu1, 1500, 500, nvmlProc(4243, 900)))
			if got := gauge(t, r, "gpu_node_agent_gpu_process_attribution", map[string]string{"source": SourceCheckpoint}); got != tt.available {
				t.Errorf("attribution{checkpoint} = %v, want %v", got, tt.available)
			}
			// Another running pod's process on ml/train-0's DRA GPU is
			// foreign whatever the checkpoint: the owner's UID is known.
			if got := gauge(t, r, "gpu_node_agent_gpu_processes", map[string]string{"device": gpu0, "class": string(ClassForeign)}); got != 1 {
				t.Errorf("foreign processes on gpu0 = %v, want 1", got)
			}
			want := map[Class]Class{ClassForeign: ClassZombie, ClassUnknown: ClassUnknown}[tt.class]
			if got := gauge(t, r, "gpu_node_agent_gpu_processes", map[string]string{"device": gpu1, "class": string(want)}); got != 1 {
				t.Errorf("%s processes on gpu1 (a gone pod's, unassigned) = %v, want 1", want, got)
			}
		})
	}
}

// TestDRAUnresolvedLoggedOnce: a device name of our pool the node does not
// have is ignored and logged once (debug) while the kubelet keeps listing
// it, and again when it comes back after it was gone.
func TestDRAUnresolvedLoggedOnce(t *testing.T) {
	logs := &recordingHandler{}
	r := draRig(t, func(_ *Config, o *Options) { o.Logger = slog.New(logs) })
	gone := pod("ml", "train-0", draContainer("trainer", claim("ml", "train-0-gpus-x7k2p", ours(claimTrain, draPool, "gpu-7", "gpus"))))
	r.host.podLogs("ml", "train-0", uidTrain)
	for _, pods := range [][]*podresourcesv1.PodResources{{gone}, {gone}, {gone}, {trainDRA(draPool)}, {gone}} {
		r.kubelet.Set(pods...)
		r.cycle(gpuSample(gpu0, 500, 500))
		r.clock.Step(15 * time.Second)
	}
	got := logs.messages(slog.LevelDebug, "dra device of a pod not on this node, ignored")
	if len(got) != 2 || got[0]["device"] != "gpu-7" || got[0]["pool"] != draPool || got[0]["driver"] != dra.DriverName ||
		got[0]["claim"] != "ml/train-0-gpus-x7k2p" {
		t.Errorf("unresolved device logs = %v, want 2 naming gpu-7", got)
	}
	for _, l := range logs.all() {
		if l.level >= slog.LevelWarn && strings.Contains(l.msg, "dra") {
			t.Errorf("an unresolved device logged at %s: %s", l.level, l.msg)
		}
	}
	if r.tr.Assignments() == nil {
		t.Error("an unresolved device failed the cycle")
	} else if r.tr.Assignments().Listed().IsZero() {
		t.Error("the tracker's assignments do not say when they were listed")
	}
}

// recordingHandler keeps every log record with its attributes.
type recordingHandler struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	l := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, l)
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) all() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.records)
}

// messages returns the attributes of every record of level and message.
func (h *recordingHandler) messages(level slog.Level, msg string) []map[string]string {
	var out []map[string]string
	for _, l := range h.all() {
		if l.level == level && l.msg == msg {
			out = append(out, l.attrs)
		}
	}
	return out
}

// TestDRAPlacementNames: on a GPU whose MIG devices are made on demand
// (its MIG profiles read), a MIG device resolves under the name of its
// placement too, the name its claim was allocated under; on a GPU with a
// static layout it does not.
func TestDRAPlacementNames(t *testing.T) {
	n, err := sim.Profile("dgx-h100", sim.WithMIG(0, "3g.40gb"), sim.WithMIG(1, "3g.40gb"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(n, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	n = node.Spec()
	m0, m1 := n.GPUs[0].MIG[0], n.GPUs[1].MIG[0]
	if m0.Placement.Size == 0 || m1.Placement.Size == 0 {
		t.Fatalf("simulated MIG devices without placements: %+v %+v", m0, m1)
	}
	n.GPUs[0].MIGProfiles = []topology.MIGProfile{{Name: m0.Profile, Placements: []topology.MIGPlacement{m0.Placement}}}
	devs := newDRADevices(draPool, n)
	if got := devs.ids[dra.PlacementName(0, m0.Profile, m0.Placement.Start)]; got != m0.UUID {
		t.Errorf("placement name of GPU 0's device resolves to %q, want %s", got, m0.UUID)
	}
	if got, ok := devs.ids[dra.PlacementName(1, m1.Profile, m1.Placement.Start)]; ok {
		t.Errorf("GPU 1 has a static layout, yet its placement name resolves to %q", got)
	}
}

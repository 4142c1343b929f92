package usage

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// TestJudge is the classification table: one device, its processes and
// what is known about pods; what each process (or the memory) is.
func TestJudge(t *testing.T) {
	// ml/train-0 holds gpu0; serving/infer-1 holds a replica of gpu1;
	// ops/monitor runs without a GPU. uidGone's pod is deleted, its
	// checkpoint entry lingering on gpu2's old assignment.
	list := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)),
		pod("serving", "infer-1", container("server", "nvidia.com/gpu", gpu1+"::3")),
		pod("ops", "monitor", container("agent", "")),
	}}
	checkpoint := []CheckpointEntry{
		{PodUID: uidTrain, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu0}},
		{PodUID: uidInfer, Container: "server", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu1 + "::3"}},
		{PodUID: uidGone, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu2}},
	}
	known := attribution{
		assignments: NewAssignments(list, checkpoint), checkpointOK: true,
		running:         map[string]bool{uidTrain: true, uidInfer: true, uidNoGPU: true},
		runningComplete: true, pids: true,
	}
	proc := func(pid uint32, uid string, memMiB uint64) procUse {
		p := procUse{PID: pid, Memory: memMiB * mib, MemoryKnown: true, Proc: Process{PID: pid, StartTime: 1000 + uint64(pid), Comm: "python3", State: "S"}}
		if uid != "" {
			p.Proc.Cgroup = CgroupInfo{PodUID: uid, QoS: QoSBurstable, ContainerID: ctrID, Runtime: RuntimeContainerd}
		}
		return p
	}
	dev := func(id string, procs ...procUse) deviceUse {
		return deviceUse{ID: id, assignIDs: []string{id}, read: true, processes: procs}
	}
	with := func(a attribution, f func(*attribution)) attribution { f(&a); return a }
	threshold := uint64(DefaultLeakedThresholdMiB) * mib

	type want struct {
		class    Class
		killSafe bool
		why      string // a substring of Why
	}
	tests := []struct {
		name   string
		device deviceUse
		attr   attribution
		judged bool
		want   []want
	}{
		{name: "own: the assigned pod's process", device: dev(gpu0, proc(101, uidTrain, 30000)), attr: known, judged: true,
			want: []want{{class: ClassOwn}}},
		{name: "own: a time-sliced replica's pod", device: dev(gpu1, proc(102, uidInfer, 5000)), attr: known, judged: true,
			want: []want{{class: ClassOwn}}},
		{name: "own: a MIG process of the pod assigned the whole GPU (mig-strategy none)",
			device: deviceUse{ID: gpu0, assignIDs: []string{gpu0, mig0}, read: true, processes: []procUse{proc(103, uidTrain, 100)}},
			attr:   known, judged: true, want: []want{{class: ClassOwn}}},
		{name: "foreign: another running pod's process on an assigned device", device: dev(gpu0, proc(104, uidInfer, 900)), attr: known,
			judged: true, want: []want{{class: ClassForeign, why: "assigned to ml/train-0 (trainer)"}}},
		{name: "foreign: a gone pod's process on an assigned device", device: dev(gpu0, proc(105, uidGone, 900)), attr: known,
			judged: true, want: []want{{class: ClassForeign, why: "on a device assigned to ml/train-0"}}},
		{name: "foreign: a host process on an assigned device", device: dev(gpu0, proc(106, "", 900)), attr: known, judged: true,
			want: []want{{class: ClassForeign, why: "host process"}}},
		{name: "foreign: a running pod without a GPU on an unassigned device", device: dev(gpu2, proc(107, uidNoGPU, 900)), attr: known,
			judged: true, want: []want{{class: ClassForeign, why: "running pod " + uidNoGPU}}},
		{name: "own and foreign side by side", device: dev(gpu0, proc(108, uidTrain, 30000), proc(109, uidNoGPU, 500)), attr: known,
			judged: true, want: []want{{class: ClassOwn}, {class: ClassForeign}}},
		{name: "zombie: a gone pod's process (its checkpoint entry lingering) on an unassigned device", device: dev(gpu2, proc(110, uidGone, 4096)),
			attr: known, judged: true, want: []want{{class: ClassZombie, killSafe: true, why: "no longer runs"}}},
		{name: "zombie: a host process on an unassigned device", device: dev(gpu2, proc(111, "", 2048)), attr: known, judged: true,
			want: []want{{class: ClassZombie, killSafe: true, why: "host process"}}},
		{name: "zombie not kill-safe: the running pods' UIDs are not all known", device: dev(gpu2, proc(112, uidGone, 4096)),
			attr: with(known, func(a *attribution) { a.runningComplete = false }), judged: true,
			want: []want{{class: ClassZombie, why: "not killed"}}},
		{name: "leaked: memory allocated, no process", device: deviceUse{ID: gpu2, assignIDs: []string{gpu2}, read: true, memory: 4 << 30, memoryKnown: true},
			attr: known, judged: true, want: []want{{class: ClassLeaked, why: "4.0 GiB allocated"}}},
		{name: "leaked on an assigned device too", device: deviceUse{ID: gpu0, assignIDs: []string{gpu0}, read: true, memory: threshold, memoryKnown: true},
			attr: known, judged: true, want: []want{{class: ClassLeaked}}},
		{name: "not leaked: below the threshold (idle MIG device)", device: deviceUse{ID: mig1, assignIDs: []string{mig1}, read: true, memory: 13 * mib, memoryKnown: true},
			attr: known, judged: true},
		{name: "not leaked: memory not known", device: deviceUse{ID: gpu2, assignIDs: []string{gpu2}, read: true},
			attr: known, judged: true},
		{name: "not leaked: a process holds it", device: deviceUse{ID: gpu2, assignIDs: []string{gpu2}, read: true, memory: 4 << 30, memoryKnown: true,
			processes: []procUse{proc(113, uidNoGPU, 4096)}}, attr: known, judged: true, want: []want{{class: ClassForeign}}},
		{name: "unjudged: NVML's process list not read", device: deviceUse{ID: gpu2, assignIDs: []string{gpu2}, processes: []procUse{proc(114, uidGone, 4096)},
			memory: 4 << 30, memoryKnown: true}, attr: known, want: []want{{class: ClassUnknown, why: "not read"}}},
		{name: "unjudged: the kubelet's List failed", device: dev(gpu2, proc(115, uidGone, 4096)),
			attr: with(known, func(a *attribution) { a.assignments = nil }), want: []want{{class: ClassUnknown, why: "List failed"}}},
		{name: "unjudged: PIDs not in the agent's namespace", device: deviceUse{ID: gpu2, assignIDs: []string{gpu2}, read: true, memory: 4 << 30, memoryKnown: true},
			attr: with(known, func(a *attribution) { a.pids, a.pidsWhy = false, "not in the host's PID namespace" })},
		{name: "unknown: the process exited before /proc was read",
			device: dev(gpu2, procUse{PID: 116, Memory: 4096 * mib, MemoryKnown: true, procErr: errors.New("process 116: no such file or directory")}),
			attr:   known, judged: true, want: []want{{class: ClassUnknown, why: "no such file"}}},
		{name: "unknown: checkpoint unreadable, a pod process on an assigned device", device: dev(gpu0, proc(117, uidTrain, 30000)),
			attr: with(known, func(a *attribution) {
				a.checkpointOK = false
				a.assignments = NewAssignments(list, nil)
			}), judged: true, want: []want{{class: ClassUnknown, why: "checkpoint is unreadable"}}},
		{name: "zombie from a host process even with the checkpoint unreadable", device: dev(gpu2, proc(118, "", 2048)),
			attr: with(known, func(a *attribution) {
				a.checkpointOK = false
				a.assignments = NewAssignments(list, nil)
			}), judged: true, want: []want{{class: ClassZombie, killSafe: true}}},
		{name: "unknown: the checkpoint does not hold a new assignment yet", device: dev(gpu0, proc(119, uidTrain, 300)),
			attr: with(known, func(a *attribution) {
				a.assignments = NewAssignments(list, checkpoint[1:])
			}), judged: true, want: []want{{class: ClassUnknown, why: "does not (yet) hold"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := judge(tt.device, tt.attr, threshold)
			if got.judged != tt.judged {
				t.Errorf("judged = %v, want %v", got.judged, tt.judged)
			}
			if len(got.verdicts) != len(tt.want) {
				t.Fatalf("verdicts = %s, want %d", describeVerdicts(got.verdicts), len(tt.want))
			}
			for i, w := range tt.want {
				v := got.verdicts[i]
				if v.Class != w.class || v.KillSafe != w.killSafe || !strings.Contains(v.Why, w.why) {
					t.Errorf("verdict %d = %s killSafe=%v (%s), want %s killSafe=%v with %q", i, v.Class, v.KillSafe, v.Why, w.class, w.killSafe, w.why)
				}
				if v.Device != tt.device.ID {
					t.Errorf("verdict %d device = %s, want %s", i, v.Device, tt.device.ID)
				}
			}
		})
	}
}

func describeVerdicts(vs []Verdict) string {
	var s []string
	for _, v := range vs {
		s = append(s, fmt.Sprintf("%s pid %d (%s)", v.Class, v.Process.PID, v.Why))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

func TestAssignments(t *testing.T) {
	a := NewAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0), container("sidecar", "example.com/other", "dev-7")),
		pod("serving", "infer-1", container("server", "nvidia.com/mig-1g.10gb", mig1)),
		pod("ml", "shared", container("app", "nvidia.com/gpu", gpu1+"::3")),
		pod("ml", "shared-2", container("app", "nvidia.com/gpu", gpu1+"::0")),
	}}, []CheckpointEntry{{PodUID: uidTrain, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu0}}})

	for _, tt := range []struct {
		id, pod, uid string
		ok           bool
	}{
		{gpu0, "train-0", uidTrain, true},
		{gpu1, "shared", "", true}, // the first replica's pod, as the metrics label it
		{gpu1 + "::0", "shared", "", true},
		{mig1, "infer-1", "", true},
		{mig0, "", "", false},
		{gpu2, "", "", false},
	} {
		got, ok := a.Container(tt.id)
		if ok != tt.ok || got.Pod != tt.pod || got.PodUID != tt.uid {
			t.Errorf("Container(%s) = %+v, %v; want pod %q uid %q, %v", tt.id, got, ok, tt.pod, tt.uid, tt.ok)
		}
	}
	if n := len(a.Of(gpu1)); n != 2 {
		t.Errorf("Of(gpu1) has %d assignments, want both replicas' pods", n)
	}
	want := map[string]bool{gpu0: true, "dev-7": true, mig1: true, gpu1 + "::3": true, gpu1 + "::0": true}
	if got := a.Allocated(); len(got) != len(want) {
		t.Errorf("Allocated() = %v, want %v", got, want)
	} else {
		for id := range want {
			if !got[id] {
				t.Errorf("Allocated() lacks %s", id)
			}
		}
	}
	if a.Pods() != 4 {
		t.Errorf("Pods() = %d, want 4", a.Pods())
	}
	var none *Assignments
	if _, ok := none.Container(gpu0); ok || none.Of(gpu0) != nil || none.Allocated() != nil {
		t.Error("a nil Assignments (List failed) must know nothing")
	}
}

package usage

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// Two notebooks share gpu1 through time-slicing replicas, as NVIDIA's
// device plugin names them and the kubelet lists them in pod-resources
// and its checkpoint ("<uuid>::<n>"); train-0 holds gpu0 whole.
const (
	uidNotebookA = "0b6d5c1e-3c1f-4a8e-9a43-2f0d4a8e7c11"
	uidNotebookB = "7f3e2d1c-9b8a-4c6d-8e5f-1a2b3c4d5e6f"
	uidPair      = "c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f"
)

func (r *rig) notebooksSharing() {
	r.kubelet.Set(
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)),
		pod("ml", "notebook-a", container("lab", "nvidia.com/gpu.shared", gpu1+"::0")),
		pod("research", "notebook-b", container("lab", "nvidia.com/gpu.shared", gpu1+"::3")),
	)
	r.host.checkpoint(
		CheckpointEntry{PodUID: uidTrain, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu0}},
		CheckpointEntry{PodUID: uidNotebookA, Container: "lab", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpu1 + "::0"}},
		CheckpointEntry{PodUID: uidNotebookB, Container: "lab", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpu1 + "::3"}},
	)
	r.host.podLogs("ml", "train-0", uidTrain)
	r.host.podLogs("ml", "notebook-a", uidNotebookA)
	r.host.podLogs("research", "notebook-b", uidNotebookB)
}

// busyProc is an NVML process holding memMiB with the given SM and
// memory utilisation.
func busyProc(pid uint32, memMiB, sm, mem uint64) nvmlowner.Process {
	p := nvmlProc(pid, memMiB)
	ok := func(v uint64) nvmlowner.Value { return nvmlowner.Value{V: v, Status: nvmlowner.OK} }
	p.Util = nvmlowner.ProcessUtil{SM: ok(sm), Memory: ok(mem), Encoder: ok(0), Decoder: ok(1)}
	return p
}

// utilRead marks s's process utilisation read.
func utilRead(s nvmlowner.Sample) nvmlowner.Sample {
	s.ProcessUtilRead = nvmlowner.Value{V: uint64(len(s.Processes)), Status: nvmlowner.OK}
	return s
}

func u64(v uint64) *uint64 { return &v }

func use(procs int, memMiB uint64, sm, mem, enc, dec uint64) *Use {
	return &Use{Processes: procs, MemoryBytes: u64(memMiB * mib), SMUtil: u64(sm), MemUtil: u64(mem), EncUtil: u64(enc), DecUtil: u64(dec)}
}

func holdersOf(t *testing.T, r *rig, id string) []Holder {
	t.Helper()
	return r.tr.Assignments().Holders(id)
}

// TestHoldersShareReplicas: each container holding a replica of gpu1 gets
// the sums of its own processes; a foreign host process on the GPU counts
// for neither; the whole GPU's holder has zeros without a process.
func TestHoldersShareReplicas(t *testing.T) {
	r := newRig(t, true)
	r.notebooksSharing()
	r.host.proc(4101, 9001, "python3", "S", podCgroup(uidNotebookA))
	r.host.proc(4102, 9002, "python3", "S", podCgroup(uidNotebookA))
	r.host.proc(4201, 9003, "python3", "S", podCgroup(uidNotebookB))
	r.host.proc(4301, 9004, "nvidia-smi", "S", hostCgroup)
	r.cycle(
		utilRead(gpuSample(gpu0, 500, 500)),
		utilRead(gpuSample(gpu1, 6500, 500, busyProc(4101, 3000, 35, 10), busyProc(4102, 1000, 5, 2), busyProc(4201, 2000, 50, 20),
			busyProc(4301, 64, 0, 0))),
	)
	want := []Holder{
		{Pod: "notebook-a", Namespace: "ml", Container: "lab", PodUID: uidNotebookA, IDs: []string{gpu1 + "::0"}, Use: use(2, 4000, 40, 12, 0, 2)},
		{Pod: "notebook-b", Namespace: "research", Container: "lab", PodUID: uidNotebookB, IDs: []string{gpu1 + "::3"}, Use: use(1, 2000, 50, 20, 0, 1)},
	}
	for _, id := range []string{gpu1, gpu1 + "::0", gpu1 + "::7"} {
		if got := holdersOf(t, r, id); !reflect.DeepEqual(got, want) {
			t.Errorf("Holders(%s) = %s, want %s", id, holdersString(got), holdersString(want))
		}
	}
	// Each call hands out its own copy.
	h := holdersOf(t, r, gpu1)
	*h[0].Use.MemoryBytes, h[0].IDs[0] = 0, "x"
	if again := holdersOf(t, r, gpu1); *again[0].Use.MemoryBytes != 4000*mib || again[0].IDs[0] != gpu1+"::0" {
		t.Errorf("a caller's change reached the next caller: %s", holdersString(again))
	}
	if got, want := holdersOf(t, r, gpu0), []Holder{{Pod: "train-0", Namespace: "ml", Container: "trainer", PodUID: uidTrain,
		IDs: []string{gpu0}, Use: use(0, 0, 0, 0, 0, 0)}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Holders(gpu0) = %s, want %s", holdersString(got), holdersString(want))
	}
	if got := holdersOf(t, r, gpu2); got != nil {
		t.Errorf("Holders(gpu2) = %s, want none", holdersString(got))
	}
	// The host process is foreign on the shared GPU, as before.
	if got := gauge(t, r, "gpu_node_agent_gpu_processes", map[string]string{"device": gpu1, "class": "foreign"}); got != 1 {
		t.Errorf("foreign processes on gpu1 = %v, want 1", got)
	}
}

// TestHoldersUseUnknown: what leaves a holder without a Use, or a Use
// without some of its fields.
func TestHoldersUseUnknown(t *testing.T) {
	procs := func(r *rig) {
		r.host.proc(4101, 9001, "python3", "S", podCgroup(uidNotebookA))
		r.host.proc(4201, 9003, "python3", "S", podCgroup(uidNotebookB))
	}
	sample := func() nvmlowner.Sample {
		return utilRead(gpuSample(gpu1, 5500, 500, busyProc(4101, 3000, 35, 10), busyProc(4201, 2000, 50, 20)))
	}
	// Names are short: the fake kubelet's socket path is under the
	// test's temporary directory, and a unix socket path has 108 bytes.
	for _, tc := range []struct {
		name   string
		hostID bool
		opts   []rigOption
		setup  func(r *rig)
		sample func() nvmlowner.Sample
		// want is notebook-a's and notebook-b's Use.
		want [2]*Use
	}{
		{name: "attributed", hostID: true, setup: procs, sample: sample,
			want: [2]*Use{use(1, 3000, 35, 10, 0, 1), use(1, 2000, 50, 20, 0, 1)}},
		// A process gone from /proc before it was read: nobody's use is known.
		{name: "proc gone", hostID: true,
			setup: func(r *rig) { r.host.proc(4101, 9001, "python3", "S", podCgroup(uidNotebookA)) }, sample: sample},
		{name: "no host pids", hostID: false, setup: procs, sample: sample},
		{name: "check off", hostID: true, setup: procs, sample: sample,
			opts: []rigOption{func(c *Config, _ *Options) { c.Judge = false }}},
		{name: "lists unread", hostID: true, setup: procs, sample: func() nvmlowner.Sample {
			s := sample()
			s.ProcessesRead = nvmlowner.Value{Status: nvmlowner.NoPermission}
			return s
		}},
		{name: "util unread", hostID: true, setup: procs, sample: func() nvmlowner.Sample {
			s := sample()
			s.ProcessUtilRead = nvmlowner.Value{Status: nvmlowner.NotSupported}
			return s
		}, want: [2]*Use{{Processes: 1, MemoryBytes: u64(3000 * mib)}, {Processes: 1, MemoryBytes: u64(2000 * mib)}}},
		{name: "partial", hostID: true, setup: procs, sample: func() nvmlowner.Sample {
			s := sample()
			s.Processes[0].UsedMemory = nvmlowner.Value{Status: nvmlowner.NotSupported}
			s.Processes[1].Util.SM = nvmlowner.Value{Status: nvmlowner.Failed}
			return s
		}, want: [2]*Use{{Processes: 1, SMUtil: u64(35), MemUtil: u64(10), EncUtil: u64(0), DecUtil: u64(1)},
			{Processes: 1, MemoryBytes: u64(2000 * mib), MemUtil: u64(20), EncUtil: u64(0), DecUtil: u64(1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.hostID, tc.opts...)
			r.notebooksSharing()
			tc.setup(r)
			r.cycle(tc.sample())
			got := holdersOf(t, r, gpu1)
			if len(got) != 2 {
				t.Fatalf("Holders(gpu1) = %s, want the two notebooks", holdersString(got))
			}
			for i, h := range got {
				if !reflect.DeepEqual(h.Use, tc.want[i]) {
					t.Errorf("%s/%s: use %s, want %s", h.Namespace, h.Pod, useString(h.Use), useString(tc.want[i]))
				}
			}
		})
	}
}

// TestHoldersTwoContainersOfOnePod: the kubelet does not say which of a
// pod's containers runs a PID, so two containers of one pod holding
// replicas of the same GPU get no Use; another pod's holder still does.
func TestHoldersTwoContainersOfOnePod(t *testing.T) {
	r := newRig(t, true)
	r.kubelet.Set(
		pod("ml", "pair", container("left", "nvidia.com/gpu.shared", gpu1+"::0"), container("right", "nvidia.com/gpu.shared", gpu1+"::1")),
		pod("ml", "notebook-a", container("lab", "nvidia.com/gpu.shared", gpu1+"::2")),
	)
	r.host.checkpoint(
		CheckpointEntry{PodUID: uidPair, Container: "left", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpu1 + "::0"}},
		CheckpointEntry{PodUID: uidPair, Container: "right", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpu1 + "::1"}},
		CheckpointEntry{PodUID: uidNotebookA, Container: "lab", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpu1 + "::2"}},
	)
	r.host.podLogs("ml", "pair", uidPair)
	r.host.podLogs("ml", "notebook-a", uidNotebookA)
	r.host.proc(4101, 9001, "python3", "S", podCgroup(uidPair))
	r.host.proc(4201, 9003, "python3", "S", podCgroup(uidNotebookA))
	r.cycle(utilRead(gpuSample(gpu1, 5500, 500, busyProc(4101, 3000, 35, 10), busyProc(4201, 2000, 50, 20))))
	got := holdersOf(t, r, gpu1)
	if len(got) != 3 || got[0].Container != "left" || got[1].Container != "right" || got[2].Pod != "notebook-a" {
		t.Fatalf("Holders(gpu1) = %s", holdersString(got))
	}
	if got[0].Use != nil || got[1].Use != nil {
		t.Errorf("pair's containers: uses %s, %s; want none", useString(got[0].Use), useString(got[1].Use))
	}
	if want := use(1, 2000, 50, 20, 0, 1); !reflect.DeepEqual(got[2].Use, want) {
		t.Errorf("notebook-a: use %s, want %s", useString(got[2].Use), useString(want))
	}
}

// TestHoldersSharedMIG: replicas of a MIG device (mixed strategy); NVML
// gives no per-process utilisation with MIG on, so only memory is known,
// even for an idle holder.
func TestHoldersSharedMIG(t *testing.T) {
	r := newRig(t, true)
	r.kubelet.Set(
		pod("ml", "notebook-a", container("lab", "nvidia.com/mig-1g.10gb.shared", mig1+"::0")),
		pod("research", "notebook-b", container("lab", "nvidia.com/mig-1g.10gb.shared", mig1+"::1")),
	)
	r.host.checkpoint(
		CheckpointEntry{PodUID: uidNotebookA, Container: "lab", Resource: "nvidia.com/mig-1g.10gb.shared", DeviceIDs: []string{mig1 + "::0"}},
		CheckpointEntry{PodUID: uidNotebookB, Container: "lab", Resource: "nvidia.com/mig-1g.10gb.shared", DeviceIDs: []string{mig1 + "::1"}},
	)
	r.host.podLogs("ml", "notebook-a", uidNotebookA)
	r.host.podLogs("research", "notebook-b", uidNotebookB)
	r.host.proc(4101, 9001, "python3", "S", podCgroup(uidNotebookA))
	p := nvmlProc(4101, 4000)
	p.MIG = mig1
	s := gpuSample(gpu2, 0, 0, p)
	s.ProcessUtilRead = nvmlowner.Value{Status: nvmlowner.NotSupported}
	r.cycle(s)
	got := holdersOf(t, r, mig1)
	want := []*Use{{Processes: 1, MemoryBytes: u64(4000 * mib)}, {MemoryBytes: u64(0)}}
	if len(got) != 2 {
		t.Fatalf("Holders(mig1) = %s", holdersString(got))
	}
	for i, h := range got {
		if !reflect.DeepEqual(h.Use, want[i]) {
			t.Errorf("%s: use %s, want %s", h.Pod, useString(h.Use), useString(want[i]))
		}
	}
}

func holdersString(hs []Holder) string {
	s := "["
	for _, h := range hs {
		s += h.Namespace + "/" + h.Pod + "/" + h.Container + " uid " + h.PodUID + " ids " + strings.Join(h.IDs, ",") + " use " + useString(h.Use) + "; "
	}
	return s + "]"
}

func useString(u *Use) string {
	if u == nil {
		return "<unknown>"
	}
	p := func(v *uint64) string {
		if v == nil {
			return "?"
		}
		return fmt.Sprint(*v)
	}
	return "{procs " + fmt.Sprint(u.Processes) + " mem " + p(u.MemoryBytes) + " sm " + p(u.SMUtil) + " memutil " + p(u.MemUtil) +
		" enc " + p(u.EncUtil) + " dec " + p(u.DecUtil) + "}"
}

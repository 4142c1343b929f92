package sim

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// newProcNode is a DGX H100 with MIG on GPU 1 (3g.40gb, 3g.40gb).
func newProcNode(t *testing.T) *Node {
	t.Helper()
	spec, err := Profile("dgx-h100", WithMIG(1, "3g.40gb", "3g.40gb"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func migUUID(t *testing.T, n *Node, gpu, k int) string {
	t.Helper()
	g := n.gpuSpec(gpu)
	if len(g.MIG) <= k {
		t.Fatalf("gpu %d has %d MIG devices", gpu, len(g.MIG))
	}
	return g.MIG[k].UUID
}

func mustStart(t *testing.T, n *Node, spec ProcessSpec) uint32 {
	t.Helper()
	pid, err := n.StartProcess(spec)
	if err != nil {
		t.Fatalf("StartProcess(%+v): %v", spec, err)
	}
	return pid
}

func TestStartProcessRefusesBadSpecs(t *testing.T) {
	n := newProcNode(t)
	mig := migUUID(t, n, 1, 0)
	if err := n.setGPULost(5, true); err != nil {
		t.Fatal(err)
	}
	pod := func(f func(*ProcessSpec)) ProcessSpec {
		s := ProcessSpec{GPU: 0, MemoryMiB: 1024, Kind: ProcessPod}
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		spec ProcessSpec
		want string
	}{
		{"unknown gpu", pod(func(s *ProcessSpec) { s.GPU = 8 }), "gpu: no such gpu 8 (node has 8)"},
		{"negative gpu", pod(func(s *ProcessSpec) { s.GPU = -1 }), "gpu: no such gpu -1"},
		{"lost gpu", pod(func(s *ProcessSpec) { s.GPU = 5 }), "gpu: gpu 5 is lost"},
		{"no memory", pod(func(s *ProcessSpec) { s.MemoryMiB = 0 }), "memoryMiB: required"},
		{"more memory than the gpu has", pod(func(s *ProcessSpec) { s.MemoryMiB = 81601 }), "memoryMiB: 81601 MiB is more than the 81600 MiB free on gpu 0"},
		{"more memory than the mig device has", pod(func(s *ProcessSpec) { s.GPU, s.MIG, s.MemoryMiB = 1, mig, 40961 }), "40961 MiB is more than the 40960 MiB free on gpu 1 MIG device " + mig},
		{"mig required on a MIG gpu", pod(func(s *ProcessSpec) { s.GPU = 1 }), "mig: required: gpu 1 has MIG enabled"},
		{"mig on a gpu without MIG", pod(func(s *ProcessSpec) { s.MIG = mig }), "mig: gpu 0 has MIG disabled"},
		{"unknown mig", pod(func(s *ProcessSpec) { s.GPU, s.MIG = 1, "MIG-nope" }), `mig: no MIG device "MIG-nope" on gpu 1`},
		{"graphics on mig", pod(func(s *ProcessSpec) { s.GPU, s.MIG, s.Graphics = 1, mig, true }), "graphics: MIG devices have no graphics contexts"},
		{"no kind", pod(func(s *ProcessSpec) { s.Kind = "" }), "kind: required"},
		{"unknown kind", pod(func(s *ProcessSpec) { s.Kind = "vm" }), `kind: "vm": want pod or host`},
		{"pod uid not a uid", pod(func(s *ProcessSpec) { s.PodUID = "my-pod" }), `podUID: "my-pod": want a pod's metadata.uid`},
		{"pod uid upper case", pod(func(s *ProcessSpec) { s.PodUID = "DDE1244B-5BB5-4297-B544-85F3BC0D80BF" }), "podUID:"},
		{"container id short", pod(func(s *ProcessSpec) { s.ContainerID = "abc" }), `containerID: "abc": want 64 lower-case hex digits`},
		{"container id of another runtime", pod(func(s *ProcessSpec) { s.ContainerID = "cri-o://" + strings.Repeat("a", 64) }), "containerID: \"cri-o://" + strings.Repeat("a", 64) + "\" is a cri-o:// ID; runtime containerd shows containerd:// IDs"},
		{"qos", pod(func(s *ProcessSpec) { s.QOS = "gold" }), `qos: "gold": want guaranteed, burstable or besteffort`},
		{"cgroup version", pod(func(s *ProcessSpec) { s.CgroupVersion = "v3" }), `cgroupVersion: "v3": want v2, v1 or hybrid`},
		{"cgroup driver", pod(func(s *ProcessSpec) { s.CgroupDriver = "cgroupfs2" }), `cgroupDriver: "cgroupfs2": want systemd or cgroupfs`},
		{"runtime", pod(func(s *ProcessSpec) { s.Runtime = "docker" }), `runtime: "docker": want containerd or crio`},
		{"oci runtime", pod(func(s *ProcessSpec) { s.OCIRuntime = "youki" }), `ociRuntime: "youki": want runc or crun`},
		{"host cgroup on a pod", pod(func(s *ProcessSpec) { s.HostCgroup = "/system.slice/x.service" }), "hostCgroup: only for kind \"host\""},
		{"pod uid on a host process", pod(func(s *ProcessSpec) { s.Kind, s.PodUID = ProcessHost, "dde1244b-5bb5-4297-b544-85f3bc0d80bf" }), "podUID: only for kind \"pod\""},
		{"relative host cgroup", pod(func(s *ProcessSpec) { s.Kind, s.HostCgroup = ProcessHost, "system.slice/x.service" }), `hostCgroup: "system.slice/x.service": want a clean absolute cgroup path`},
		{"unclean host cgroup", pod(func(s *ProcessSpec) { s.Kind, s.HostCgroup = ProcessHost, "/system.slice/../x" }), "hostCgroup:"},
		{"comm too long", pod(func(s *ProcessSpec) { s.Comm = "a-very-long-process-name" }), `comm: "a-very-long-process-name": at most 15 bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid, err := n.StartProcess(tc.spec)
			if err == nil {
				t.Fatalf("started pid %d, want an error with %q", pid, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if ps := n.Processes(); len(ps) != 0 {
		t.Fatalf("refused specs left processes: %+v", ps)
	}
	if pid := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 1, Kind: ProcessHost}); pid != FirstPID {
		t.Errorf("first pid after refused specs %d, want %d (a refused spec takes no PID)", pid, FirstPID)
	}
}

// TestCgroupFilesAreRealWorldFormats: the /proc/<pid>/cgroup written for
// each combination is the format real nodes show. Cases with real IDs are
// the real-world lines they come from.
func TestCgroupFilesAreRealWorldFormats(t *testing.T) {
	n := newProcNode(t)
	const (
		// An EKS node's burstable pod (containerd, systemd, cgroup v2), as
		// quoted in a public cgroup parser's tests.
		eksUID = "dde1244b-5bb5-4297-b544-85f3bc0d80bf"
		eksCID = "acb62391578595ec849d87d8556369cee7f935f0425097fd5f870df0e8aabd3c"
		// DataDog datadog-agent pkg/util/cgroups test fixture: a burstable
		// pod on a cgroup v1 (hybrid) containerd node with the cgroupfs
		// driver.
		ddUID = "15513b48-e7a5-48fc-b9e3-92f713f36504"
		ddCID = "a51a9f7d073f848e7fc59e56e8f11524f330a2175a4ed26327da2dfe0d28015f"
		// A static pod's UID (md5 of its manifest, 32 hex digits).
		staticUID = "6c2e1a8e3b8f4d5e9a0b1c2d3e4f5a6b"
	)
	ddPath := "/kubepods/burstable/pod" + ddUID + "/" + ddCID
	ddFixture := "12:rdma:/\n" +
		"11:memory:" + ddPath + "\n10:hugetlb:" + ddPath + "\n9:devices:" + ddPath + "\n8:perf_event:" + ddPath + "\n" +
		"7:cpuset:" + ddPath + "\n6:net_cls,net_prio:" + ddPath + "\n5:cpu,cpuacct:" + ddPath + "\n4:blkio:" + ddPath + "\n" +
		"3:freezer:" + ddPath + "\n2:pids:" + ddPath + "\n1:name=systemd:" + ddPath + "\n0::/system.slice/containerd.service\n"
	v1Lines := func(p string) string {
		var b strings.Builder
		for i, h := range v1Hierarchies {
			at := p
			if h == "rdma" {
				at = "/"
			}
			b.WriteString(strconv.Itoa(12-i) + ":" + h + ":" + at + "\n")
		}
		return b.String()
	}
	sysScope := "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(eksUID, "-", "_") + ".slice/cri-containerd-" + eksCID + ".scope"
	for _, tc := range []struct {
		name string
		spec ProcessSpec
		want string
	}{
		{"containerd systemd v2 burstable (EKS)",
			ProcessSpec{PodUID: eksUID, ContainerID: eksCID},
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + "dde1244b_5bb5_4297_b544_85f3bc0d80bf" + ".slice/cri-containerd-" + eksCID + ".scope\n"},
		{"containerd systemd v2 guaranteed",
			ProcessSpec{PodUID: eksUID, ContainerID: "containerd://" + eksCID, QOS: "Guaranteed"},
			"0::/kubepods.slice/kubepods-poddde1244b_5bb5_4297_b544_85f3bc0d80bf.slice/cri-containerd-" + eksCID + ".scope\n"},
		{"containerd cgroupfs v2 burstable",
			ProcessSpec{PodUID: ddUID, ContainerID: ddCID, CgroupDriver: DriverCgroupfs},
			"0::" + ddPath + "\n"},
		{"containerd cgroupfs v2 guaranteed",
			ProcessSpec{PodUID: ddUID, ContainerID: ddCID, CgroupDriver: DriverCgroupfs, QOS: QOSGuaranteed},
			"0::/kubepods/pod" + ddUID + "/" + ddCID + "\n"},
		{"containerd cgroupfs hybrid burstable (datadog fixture)",
			ProcessSpec{PodUID: ddUID, ContainerID: ddCID, CgroupDriver: DriverCgroupfs, CgroupVersion: CgroupHybrid},
			ddFixture},
		{"containerd cgroupfs v1 burstable",
			ProcessSpec{PodUID: ddUID, ContainerID: ddCID, CgroupDriver: DriverCgroupfs, CgroupVersion: CgroupV1},
			strings.TrimSuffix(ddFixture, "0::/system.slice/containerd.service\n")},
		{"containerd systemd hybrid besteffort",
			ProcessSpec{PodUID: eksUID, ContainerID: eksCID, QOS: "BestEffort", CgroupVersion: CgroupHybrid},
			v1Lines(sysScope) + "0::" + sysScope + "\n"},
		{"cri-o systemd v2 besteffort",
			ProcessSpec{PodUID: eksUID, ContainerID: "cri-o://" + eksCID, Runtime: RuntimeCRIO, QOS: QOSBestEffort},
			"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddde1244b_5bb5_4297_b544_85f3bc0d80bf.slice/crio-" + eksCID + ".scope\n"},
		{"cri-o systemd v2 crun",
			ProcessSpec{PodUID: eksUID, ContainerID: eksCID, Runtime: RuntimeCRIO, OCIRuntime: OCICrun},
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poddde1244b_5bb5_4297_b544_85f3bc0d80bf.slice/crio-" + eksCID + ".scope/container\n"},
		{"cri-o systemd v1 crun (no sub-cgroup on v1)",
			ProcessSpec{PodUID: eksUID, ContainerID: eksCID, Runtime: RuntimeCRIO, OCIRuntime: OCICrun, CgroupVersion: CgroupV1},
			v1Lines("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poddde1244b_5bb5_4297_b544_85f3bc0d80bf.slice/crio-" + eksCID + ".scope")},
		{"cri-o cgroupfs hybrid",
			ProcessSpec{PodUID: ddUID, ContainerID: ddCID, Runtime: RuntimeCRIO, CgroupDriver: DriverCgroupfs, CgroupVersion: CgroupHybrid},
			v1Lines("/kubepods/burstable/pod"+ddUID+"/crio-"+ddCID) + "0::/system.slice/crio.service\n"},
		{"static pod",
			ProcessSpec{PodUID: staticUID, ContainerID: eksCID, QOS: QOSGuaranteed},
			"0::/kubepods.slice/kubepods-pod" + staticUID + ".slice/cri-containerd-" + eksCID + ".scope\n"},
		{"host login session",
			ProcessSpec{Kind: ProcessHost},
			"0::/user.slice/user-1000.slice/session-1.scope\n"},
		{"host service on v1",
			ProcessSpec{Kind: ProcessHost, HostCgroup: "/system.slice/train.service", CgroupVersion: CgroupV1},
			v1Lines("/system.slice/train.service")},
		{"orphan of docker rm -f on the host",
			ProcessSpec{Kind: ProcessHost, HostCgroup: "/system.slice/docker-" + eksCID + ".scope"},
			"0::/system.slice/docker-" + eksCID + ".scope\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.GPU, spec.MemoryMiB = 2, 100
			if spec.Kind == "" {
				spec.Kind = ProcessPod
			}
			pid := mustStart(t, n, spec)
			t.Cleanup(func() { _ = n.StopProcess(pid) })
			got, err := os.ReadFile(filepath.Join(n.HostRoot(), "proc", strconv.Itoa(int(pid)), "cgroup"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("/proc/%d/cgroup:\n%s\nwant:\n%s", pid, got, tc.want)
			}
		})
	}
}

func TestVanishedPodGetsAUIDAndContainerID(t *testing.T) {
	n := newProcNode(t)
	pid := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 10, Kind: ProcessPod, QOS: QOSBestEffort})
	p := n.Processes()[0]
	if p.PID != pid || !podUIDPattern.MatchString(p.PodUID) || !containerIDPattern.MatchString(p.ContainerID) {
		t.Fatalf("process %+v: want a derived pod UID and container ID", p)
	}
	want := "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(p.PodUID, "-", "_") + ".slice/cri-containerd-" + p.ContainerID + ".scope"
	if p.Cgroup != want || p.CgroupFile != "0::"+want+"\n" {
		t.Fatalf("cgroup %q file %q, want %q", p.Cgroup, p.CgroupFile, want)
	}
	other := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 10, Kind: ProcessPod})
	if q := n.Processes()[1]; q.PID != other || q.PodUID == p.PodUID {
		t.Fatalf("two vanished pods share UID %s", q.PodUID)
	}
}

func memOf(t *testing.T, n *Node, gpu int) (nvml.Memory, nvml.Memory_v2) {
	t.Helper()
	d := n.handle(gpu)
	m, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("gpu %d GetMemoryInfo: %v", gpu, ret)
	}
	m2, ret := d.GetMemoryInfo_v2()
	if ret != nvml.SUCCESS {
		t.Fatalf("gpu %d GetMemoryInfo_v2: %v", gpu, ret)
	}
	return m, m2
}

func migMemOf(t *testing.T, n *Node, gpu, k int) nvml.Memory {
	t.Helper()
	mig, ret := n.handle(gpu).GetMigDeviceHandleByIndex(k)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	m, ret := mig.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return m
}

// TestMemoryAccounting: a GPU's used memory is its reserved memory plus
// what processes and leaks hold (GetMemoryInfo), allocated memory alone in
// GetMemoryInfo_v2; a MIG device's is what is on it; all of it comes back
// when the process ends or the leak is freed.
func TestMemoryAccounting(t *testing.T) {
	n := newProcNode(t)
	const mib = 1 << 20
	total := n.Device(0).MemoryInfo.Total
	reserved := total >> 8
	mig0, mig1 := migUUID(t, n, 1, 0), migUUID(t, n, 1, 1)

	a := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 1000, Kind: ProcessPod})
	b := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 500, Kind: ProcessHost, Graphics: true})
	c := mustStart(t, n, ProcessSpec{GPU: 1, MIG: mig0, MemoryMiB: 2000, Kind: ProcessPod})
	if err := n.SetLeakedMemory(0, "", 300); err != nil {
		t.Fatal(err)
	}
	if err := n.SetLeakedMemory(1, mig1, 700); err != nil {
		t.Fatal(err)
	}
	type want struct{ gpu0, gpu1, mig0, mig1 uint64 } // allocated MiB
	check := func(step string, w want) {
		t.Helper()
		for _, g := range []struct {
			gpu   int
			alloc uint64
		}{{0, w.gpu0}, {1, w.gpu1}, {2, 0}} {
			m, m2 := memOf(t, n, g.gpu)
			if m.Total != total || m.Used != reserved+g.alloc*mib || m.Free != total-m.Used {
				t.Errorf("%s: gpu %d memory %+v, want used %d (reserved %d + %d MiB)", step, g.gpu, m, reserved+g.alloc*mib, reserved, g.alloc)
			}
			if m2.Reserved != reserved || m2.Used != g.alloc*mib || m2.Free != total-reserved-g.alloc*mib || m2.Total != total {
				t.Errorf("%s: gpu %d memory_v2 %+v, want used %d MiB", step, g.gpu, m2, g.alloc)
			}
		}
		for k, alloc := range []uint64{w.mig0, w.mig1} {
			m := migMemOf(t, n, 1, k)
			if m.Total != 40960*mib || m.Used != alloc*mib || m.Free != m.Total-m.Used {
				t.Errorf("%s: gpu 1 MIG %d memory %+v, want used %d MiB", step, k, m, alloc)
			}
		}
	}
	check("started", want{gpu0: 1800, gpu1: 2700, mig0: 2000, mig1: 700})

	// Memory counts against what is free: GPU 0 has 81920 MiB, 320 of
	// them reserved (1/256), 1800 allocated.
	if _, err := n.StartProcess(ProcessSpec{GPU: 0, MemoryMiB: 81920 - 320 - 1800 + 1, Kind: ProcessPod}); err == nil {
		t.Error("a process larger than the free memory started")
	}
	if err := n.SetLeakedMemory(1, mig0, 40960-2000+1); err == nil {
		t.Error("a leak larger than the MIG device's free memory was set")
	}
	// A leak is replaced, not added to: its old size counts as free.
	if err := n.SetLeakedMemory(1, mig1, 40960); err != nil {
		t.Errorf("replacing a leak by one filling the MIG device: %v", err)
	}
	check("leak replaced", want{gpu0: 1800, gpu1: 42960, mig0: 2000, mig1: 40960})

	for _, pid := range []uint32{a, b, c} {
		if err := n.StopProcess(pid); err != nil {
			t.Fatal(err)
		}
	}
	check("processes stopped", want{gpu0: 300, gpu1: 40960, mig1: 40960})
	if err := n.SetLeakedMemory(0, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := n.SetLeakedMemory(1, mig1, 0); err != nil {
		t.Fatal(err)
	}
	check("leaks freed", want{})
	if l := n.Leaks(); len(l) != 0 {
		t.Errorf("leaks after freeing: %+v", l)
	}
}

func processLists(t *testing.T, d interface {
	GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
}) (compute, graphics []nvml.ProcessInfo, cret, gret nvml.Return) {
	t.Helper()
	compute, cret = d.GetComputeRunningProcesses()
	graphics, gret = d.GetGraphicsRunningProcesses()
	return
}

// TestProcessLists: NVML lists each process on its device's compute and/or
// graphics list; a MIG-enabled GPU lists its MIG devices' processes with
// their GPU and compute instance IDs and without per-process memory, a MIG
// device handle with it; an unprivileged caller gets NO_PERMISSION from a
// MIG-enabled GPU only; a lost GPU answers GPU_IS_LOST.
func TestProcessLists(t *testing.T) {
	n := newProcNode(t)
	mig := n.gpuSpec(1).MIG[1]
	const mib = 1 << 20
	comp := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 100, Kind: ProcessPod})
	both := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 200, Kind: ProcessHost, Compute: true, Graphics: true})
	gfx := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 300, Kind: ProcessHost, Graphics: true})
	onMIG := mustStart(t, n, ProcessSpec{GPU: 1, MIG: mig.UUID, MemoryMiB: 400, Kind: ProcessPod})
	none := uint32(0xFFFFFFFF)

	compute, graphics, cret, gret := processLists(t, n.handle(0))
	wantC := []nvml.ProcessInfo{{Pid: comp, UsedGpuMemory: 100 * mib, GpuInstanceId: none, ComputeInstanceId: none},
		{Pid: both, UsedGpuMemory: 200 * mib, GpuInstanceId: none, ComputeInstanceId: none}}
	wantG := []nvml.ProcessInfo{{Pid: both, UsedGpuMemory: 200 * mib, GpuInstanceId: none, ComputeInstanceId: none},
		{Pid: gfx, UsedGpuMemory: 300 * mib, GpuInstanceId: none, ComputeInstanceId: none}}
	if cret != nvml.SUCCESS || gret != nvml.SUCCESS || !equalInfos(compute, wantC) || !equalInfos(graphics, wantG) {
		t.Errorf("gpu 0: compute %+v (%v), graphics %+v (%v); want %+v and %+v", compute, cret, graphics, gret, wantC, wantG)
	}

	compute, graphics, cret, gret = processLists(t, n.handle(1))
	wantC = []nvml.ProcessInfo{{Pid: onMIG, UsedGpuMemory: memoryNotAvailable, GpuInstanceId: uint32(mig.GPUInstance), ComputeInstanceId: uint32(mig.ComputeInstance)}}
	if cret != nvml.SUCCESS || gret != nvml.SUCCESS || !equalInfos(compute, wantC) || len(graphics) != 0 {
		t.Errorf("MIG gpu 1 through the parent: compute %+v (%v), graphics %+v (%v); want %+v", compute, cret, graphics, gret, wantC)
	}
	migDev, ret := n.handle(1).GetMigDeviceHandleByIndex(1)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	compute, graphics, cret, gret = processLists(t, migDev)
	wantC[0].UsedGpuMemory = 400 * mib
	if cret != nvml.SUCCESS || gret != nvml.SUCCESS || !equalInfos(compute, wantC) || len(graphics) != 0 {
		t.Errorf("MIG device handle: compute %+v (%v), graphics %+v (%v); want %+v", compute, cret, graphics, gret, wantC)
	}
	other, _ := n.handle(1).GetMigDeviceHandleByIndex(0)
	if compute, _, _, _ = processLists(t, other); len(compute) != 0 {
		t.Errorf("the other MIG device lists %+v", compute)
	}
	if compute, _, cret, _ = processLists(t, n.handle(2)); cret != nvml.SUCCESS || compute == nil || len(compute) != 0 {
		t.Errorf("idle gpu 2: %#v (%v), want an empty list and SUCCESS", compute, cret)
	}

	n.SetUnprivileged(true)
	if _, _, cret, gret = processLists(t, n.handle(1)); cret != nvml.ERROR_NO_PERMISSION || gret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("unprivileged, MIG gpu: %v/%v, want ERROR_NO_PERMISSION (aggregate information needs privileges)", cret, gret)
	}
	if _, ret := n.handle(1).GetMemoryInfo_v2(); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("unprivileged, MIG gpu GetMemoryInfo_v2: %v, want ERROR_NO_PERMISSION", ret)
	}
	if compute, _, cret, _ = processLists(t, n.handle(0)); cret != nvml.SUCCESS || len(compute) != 2 {
		t.Errorf("unprivileged, gpu 0: %+v (%v), want both compute processes", compute, cret)
	}
	if compute, _, cret, _ = processLists(t, migDev); cret != nvml.SUCCESS || len(compute) != 1 {
		t.Errorf("unprivileged, MIG device handle: %+v (%v), want its process", compute, cret)
	}
	n.SetUnprivileged(false)

	if err := n.setGPULost(0, true); err != nil {
		t.Fatal(err)
	}
	if _, _, cret, gret = processLists(t, n.handle(0)); cret != nvml.ERROR_GPU_IS_LOST || gret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost gpu: %v/%v, want ERROR_GPU_IS_LOST", cret, gret)
	}
	calls := n.NVMLCalls()
	if calls["GetComputeRunningProcesses"] == 0 || calls["GetGraphicsRunningProcesses"] == 0 {
		t.Errorf("process list calls not counted: %v", calls)
	}
}

func equalInfos(a, b []nvml.ProcessInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRunningProcessesBufferRules: the C call's buffer handling as nvml.h
// documents it, and go-nvml's way of driving it.
func TestRunningProcessesBufferRules(t *testing.T) {
	three := []nvml.ProcessInfo{{Pid: 1}, {Pid: 2}, {Pid: 3}}
	for _, tc := range []struct {
		name      string
		all       []nvml.ProcessInfo
		count     uint32
		buf       []nvml.ProcessInfo
		nilCount  bool
		want      nvml.Return
		wantCount uint32
	}{
		{"size query with processes", three, 0, nil, false, nvml.ERROR_INSUFFICIENT_SIZE, 3},
		{"size query without processes", nil, 0, nil, false, nvml.SUCCESS, 0},
		{"buffer too small", three, 2, make([]nvml.ProcessInfo, 2), false, nvml.ERROR_INSUFFICIENT_SIZE, 3},
		{"buffer exact", three, 3, make([]nvml.ProcessInfo, 3), false, nvml.SUCCESS, 3},
		{"buffer larger", three, 8, make([]nvml.ProcessInfo, 8), false, nvml.SUCCESS, 3},
		{"infos NULL with a count", three, 4, nil, false, nvml.ERROR_INVALID_ARGUMENT, 4},
		{"infoCount NULL", three, 0, nil, true, nvml.ERROR_INVALID_ARGUMENT, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			count := tc.count
			p := &count
			if tc.nilCount {
				p = nil
			}
			ret := runningProcesses(tc.all, p, tc.buf)
			if ret != tc.want || count != tc.wantCount {
				t.Fatalf("ret %v count %d, want %v count %d", ret, count, tc.want, tc.wantCount)
			}
			if ret == nvml.SUCCESS && !equalInfos(tc.buf[:count], tc.all) {
				t.Fatalf("buffer %+v, want %+v", tc.buf[:count], tc.all)
			}
		})
	}
	for _, k := range []int{0, 1, 2, 5, 64} {
		all := make([]nvml.ProcessInfo, k)
		for i := range all {
			all[i].Pid = uint32(100 + i)
		}
		calls := 0
		got, ret := goNVMLList(func(c *uint32, infos []nvml.ProcessInfo) nvml.Return {
			calls++
			return runningProcesses(all, c, infos)
		})
		// go-nvml starts with one entry and doubles what NVML asked for:
		// one C call for at most one process, two otherwise.
		wantCalls := 1
		if k > 1 {
			wantCalls = 2
		}
		if ret != nvml.SUCCESS || !equalInfos(got, all) || calls != wantCalls {
			t.Errorf("%d processes: %d entries (%v) in %d calls, want all in %d", k, len(got), ret, calls, wantCalls)
		}
	}
}

func procFile(t *testing.T, n *Node, pid uint32, name string) (string, error) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.HostRoot(), "proc", strconv.Itoa(int(pid)), name))
	return string(b), err
}

// TestProcFiles: stat and comm in the kernel's formats; the entry goes
// with the process and leaves nothing behind.
func TestProcFiles(t *testing.T) {
	n := newProcNode(t)
	a := mustStart(t, n, ProcessSpec{GPU: 3, MemoryMiB: 1, Kind: ProcessPod, Comm: "trainer) x", IgnoreTerm: true})
	b := mustStart(t, n, ProcessSpec{GPU: 3, MemoryMiB: 1, Kind: ProcessHost, Uninterruptible: true})
	if a != FirstPID || b != FirstPID+1 {
		t.Fatalf("pids %d, %d; want %d, %d", a, b, FirstPID, FirstPID+1)
	}
	procs := n.Processes()
	for i, tc := range []struct {
		pid             uint32
		comm, state     string
		sigignoreSIGTRM bool
	}{{a, "trainer) x", "S", true}, {b, "python3", "D", false}} {
		comm, err := procFile(t, n, tc.pid, "comm")
		if err != nil || comm != tc.comm+"\n" {
			t.Errorf("pid %d comm %q (%v), want %q", tc.pid, comm, err, tc.comm)
		}
		stat, err := procFile(t, n, tc.pid, "stat")
		if err != nil {
			t.Fatal(err)
		}
		// proc(5): the fields after comm start after its last ')'.
		open, close := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
		if strings.TrimSpace(stat[:open]) != strconv.Itoa(int(tc.pid)) || stat[open+1:close] != tc.comm {
			t.Errorf("pid %d stat %q: pid or comm wrong", tc.pid, stat)
		}
		rest := strings.Fields(stat[close+1:]) // field 3 onwards
		if len(rest) != 50 {
			t.Fatalf("pid %d stat has %d fields, want 52", tc.pid, len(rest)+2)
		}
		if rest[0] != tc.state {
			t.Errorf("pid %d state %q, want %q", tc.pid, rest[0], tc.state)
		}
		start, err := strconv.ParseUint(rest[22-3], 10, 64)
		if err != nil || start != procs[i].StartTime || start == 0 {
			t.Errorf("pid %d starttime %q, want %d", tc.pid, rest[22-3], procs[i].StartTime)
		}
		sigignore, _ := strconv.ParseUint(rest[33-3], 10, 64)
		if got := sigignore&(1<<(syscall.SIGTERM-1)) != 0; got != tc.sigignoreSIGTRM {
			t.Errorf("pid %d sigignore %#x: SIGTERM ignored %v, want %v", tc.pid, sigignore, got, tc.sigignoreSIGTRM)
		}
	}
	if procs[1].StartTime <= procs[0].StartTime {
		t.Errorf("start times %d then %d, want increasing", procs[0].StartTime, procs[1].StartTime)
	}
	for _, pid := range []uint32{a, b} {
		if err := n.StopProcess(pid); err != nil {
			t.Fatal(err)
		}
		if _, err := procFile(t, n, pid, "stat"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pid %d stat after exit: %v, want it gone", pid, err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(n.HostRoot(), "proc"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "driver" {
			t.Errorf("proc/%s left behind", e.Name())
		}
	}
	if c := mustStart(t, n, ProcessSpec{GPU: 3, MemoryMiB: 1, Kind: ProcessHost}); c != FirstPID+2 {
		t.Errorf("pid %d after two exits, want %d (PIDs are not reused)", c, FirstPID+2)
	}
}

// TestSignalProcess: what each signal does to each kind of process.
func TestSignalProcess(t *testing.T) {
	n := newProcNode(t)
	for _, tc := range []struct {
		name            string
		uninterruptible bool
		ignoreTerm      bool
		signals         []syscall.Signal
		ends            bool
	}{
		{"sigterm ends", false, false, []syscall.Signal{syscall.SIGTERM}, true},
		{"sigkill ends", false, false, []syscall.Signal{syscall.SIGKILL}, true},
		{"sigint ends", false, false, []syscall.Signal{syscall.SIGINT}, true},
		{"signal 0 only checks", false, false, []syscall.Signal{0}, false},
		{"sigterm ignored", false, true, []syscall.Signal{syscall.SIGTERM}, false},
		{"sigterm ignored, then sigkill", false, true, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, true},
		{"ignoreTerm still ends on sighup", false, true, []syscall.Signal{syscall.SIGHUP}, true},
		{"uninterruptible survives everything", true, false, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGQUIT}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := mustStart(t, n, ProcessSpec{GPU: 4, MemoryMiB: 4096, Kind: ProcessPod, Uninterruptible: tc.uninterruptible, IgnoreTerm: tc.ignoreTerm})
			for _, sig := range tc.signals {
				if err := n.SignalProcess(pid, sig); err != nil {
					t.Fatalf("signal %v: %v", sig, err)
				}
			}
			_, m2 := memOf(t, n, 4)
			_, statErr := procFile(t, n, pid, "stat")
			listed := len(n.Processes()) == 1
			if tc.ends {
				if listed || m2.Used != 0 || !errors.Is(statErr, os.ErrNotExist) {
					t.Fatalf("after %v: listed %v, memory used %d, stat %v; want the process gone with its memory", tc.signals, listed, m2.Used, statErr)
				}
				if err := n.SignalProcess(pid, syscall.SIGKILL); !errors.Is(err, syscall.ESRCH) {
					t.Fatalf("signal to an ended process: %v, want ESRCH", err)
				}
				return
			}
			if !listed || m2.Used != 4096<<20 || statErr != nil {
				t.Fatalf("after %v: listed %v, memory used %d, stat %v; want the process running", tc.signals, listed, m2.Used, statErr)
			}
			// A normal exit ends any process, a D-state one too.
			if err := n.StopProcess(pid); err != nil {
				t.Fatal(err)
			}
		})
	}
	if err := n.SignalProcess(FirstPID+1000, syscall.SIGTERM); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("signal to an unknown pid: %v, want ESRCH", err)
	}
	if err := n.StopProcess(FirstPID + 1000); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("stop of an unknown pid: %v, want ESRCH", err)
	}
	pid := mustStart(t, n, ProcessSpec{GPU: 4, MemoryMiB: 1, Kind: ProcessHost})
	if err := n.SignalProcess(pid, syscall.SIGUSR1); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("SIGUSR1: %v, want EINVAL", err)
	}
}

// TestInUseGPURefusesResetAndMIGChange: a GPU reset or MIG change waits
// for the GPU to be idle (NVML_ERROR_IN_USE), and both free leaked memory.
func TestInUseGPURefusesResetAndMIGChange(t *testing.T) {
	n := newProcNode(t)
	mig := migUUID(t, n, 1, 0)
	p0 := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 10, Kind: ProcessPod})
	p1 := mustStart(t, n, ProcessSpec{GPU: 1, MIG: mig, MemoryMiB: 10, Kind: ProcessPod})
	if err := n.SetLeakedMemory(0, "", 50); err != nil {
		t.Fatal(err)
	}
	if err := n.SetLeakedMemory(1, migUUID(t, n, 1, 1), 50); err != nil {
		t.Fatal(err)
	}
	if err := n.applyFault(Fault{Kind: FaultGPUReset, GPU: 0}, true); err == nil || !strings.Contains(err.Error(), "NVML_ERROR_IN_USE") {
		t.Errorf("reset of a GPU in use: %v, want refused", err)
	}
	if err := n.SetMIGLayout(1, []string{"7g.80gb"}); err == nil || !strings.Contains(err.Error(), "in use by simulated processes [3000001]") {
		t.Errorf("MIG change of a GPU in use: %v, want refused", err)
	}
	if n.gpuSpec(1).MIG[0].UUID != mig {
		t.Error("the MIG layout changed although refused")
	}
	for _, pid := range []uint32{p0, p1} {
		if err := n.SignalProcess(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.applyFault(Fault{Kind: FaultGPUReset, GPU: 0}, true); err != nil {
		t.Fatalf("reset of an idle GPU: %v", err)
	}
	if err := n.SetMIGLayout(1, []string{"7g.80gb"}); err != nil {
		t.Fatalf("MIG change of an idle GPU: %v", err)
	}
	if l := n.Leaks(); len(l) != 0 {
		t.Errorf("leaks after a reset and a MIG change: %+v", l)
	}
	if _, m2 := memOf(t, n, 0); m2.Used != 0 {
		t.Errorf("gpu 0 used %d after its reset", m2.Used)
	}
}

// TestRestartInSameHostRoot: a new simulator in the host root of an
// earlier one starts without processes and removes their /proc entries,
// and nothing else.
func TestRestartInSameHostRoot(t *testing.T) {
	root := t.TempDir()
	spec, err := Profile("pcie-8gpu")
	if err != nil {
		t.Fatal(err)
	}
	first, err := New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := mustStart(t, first, ProcessSpec{GPU: 0, MemoryMiB: 10, Kind: ProcessPod})
	realPID := filepath.Join(root, "proc", "4242")
	if err := os.MkdirAll(realPID, 0o755); err != nil {
		t.Fatal(err)
	}
	second, err := New(spec, root, nil)
	if err != nil {
		t.Fatalf("New in the same host root: %v", err)
	}
	if ps := second.Processes(); len(ps) != 0 {
		t.Errorf("processes after a restart: %+v", ps)
	}
	if _, err := procFile(t, second, pid, "cgroup"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/proc/%d of the earlier simulator: %v, want removed", pid, err)
	}
	if _, err := os.Stat(realPID); err != nil {
		t.Errorf("a /proc entry below FirstPID was touched: %v", err)
	}
	if again := mustStart(t, second, ProcessSpec{GPU: 0, MemoryMiB: 10, Kind: ProcessPod}); again != FirstPID {
		t.Errorf("first pid after a restart %d, want %d", again, FirstPID)
	}
}

// TestProcessesConcurrentWithNVML: NVML calls from other goroutines while
// processes start and end see consistent answers (a listed process's
// memory is counted as used) and race with nothing.
func TestProcessesConcurrentWithNVML(t *testing.T) {
	n := newProcNode(t)
	done := make(chan struct{})
	errs := make(chan string, 4)
	for w := range 4 {
		go func() {
			defer func() { errs <- "" }()
			d := n.handle(w % 2 * 2) // GPUs 0 and 2
			for {
				select {
				case <-done:
					return
				default:
				}
				// At most one process runs at a time (the loop below
				// ends each before the next starts).
				list, ret := d.GetComputeRunningProcesses()
				m2, ret2 := d.GetMemoryInfo_v2()
				if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS {
					errs <- "list: " + ret.Error() + ", memory: " + ret2.Error()
					return
				}
				if len(list) > 1 || (m2.Used != 0 && m2.Used != 64<<20) || m2.Used+m2.Free+m2.Reserved != m2.Total {
					errs <- "inconsistent answers: " + strconv.Itoa(len(list)) + " processes, used " + strconv.FormatUint(m2.Used, 10)
					return
				}
			}
		}()
	}
	for i := range 50 {
		gpu := i % 2 * 2
		pid := mustStart(t, n, ProcessSpec{GPU: gpu, MemoryMiB: 64, Kind: ProcessPod})
		if i%3 == 0 {
			if err := n.SignalProcess(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		} else if err := n.StopProcess(pid); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for range 4 {
		if msg := <-errs; msg != "" {
			t.Error(msg)
		}
	}
	for _, gpu := range []int{0, 2} {
		if _, m2 := memOf(t, n, gpu); m2.Used != 0 {
			t.Errorf("gpu %d used %d after every process ended", gpu, m2.Used)
		}
	}
}

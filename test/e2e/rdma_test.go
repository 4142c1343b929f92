package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// waitDemoRDMA waits until the node offers exactly the demo node's rdma/*
// resources, in capacity and allocatable.
func waitDemoRDMA(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := shared.WaitNodeResources(ctx, "rdma/", agentdeploy.DemoRDMA, agentdeploy.DemoRDMA); err != nil {
		t.Fatal(err)
	}
}

// podDevices is what the workload printed of its /dev/infiniband and
// /dev/nvidia* nodes: path → "char MAJOR:MINOR PERM".
func podDevices(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(podLog(t, name), "\n") {
		if strings.HasPrefix(line, "DEVICE-ERROR ") {
			t.Errorf("pod %s: %s", name, line)
		}
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == "DEVICE" {
			out[f[1]] = strings.Join(f[2:], " ")
		}
	}
	return out
}

// simCharDevs lists the /dev/infiniband nodes of the simulated NIC ibdev on
// the host, as the workload prints them (path in the container → "char
// MAJOR:MINOR PERM"), found through the simulated sysfs the agent reads:
// the uverbs node of the device, the umad and issm nodes of its port.
func simCharDevs(t *testing.T, ibdev string) map[string]string {
	t.Helper()
	root := agentdeploy.SimHostRoot(shared)
	out := map[string]string{}
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		entries, err := os.ReadDir(filepath.Join(root, "sys", "class", class))
		if err != nil {
			t.Fatalf("simulated sysfs: %v", err)
		}
		for _, e := range entries {
			owner, err := os.ReadFile(filepath.Join(root, "sys", "class", class, e.Name(), "ibdev"))
			if err != nil || strings.TrimSpace(string(owner)) != ibdev {
				continue
			}
			out["/dev/infiniband/"+e.Name()] = hostCharDev(t, e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatalf("simulated sysfs under %s has no char devices of %s", root, ibdev)
	}
	return out
}

// hostCharDev describes the simulator's /dev/infiniband/<name> on the host.
func hostCharDev(t *testing.T, name string) string {
	t.Helper()
	var st unix.Stat_t
	path := filepath.Join(agentdeploy.SimHostRoot(shared), "dev", "infiniband", name)
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("simulated device node: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("simulated %s is not a character device (mode %o): the agent could not mknod", path, st.Mode)
	}
	return fmt.Sprintf("char %d:%d %o", unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mode&0o777)
}

// TestRDMAPod: a pod asking for rdma/ib: 2 runs, its container has exactly
// the /dev/infiniband nodes of the two ports the kubelet allocated (each
// device's uverbs, the port's umad and issm, and rdma_cm) as character
// devices with the host's numbers, and its RDMA_DEVICES and NCCL_IB_HCA
// name those two ports.
func TestRDMAPod(t *testing.T) {
	needAgent(t)
	waitDemoRDMA(t, time.Minute)
	workloadPod(t, "two-nics", map[string]int64{"rdma/ib": 2})
	pod := waitPodRunning(t, "two-nics", 2*time.Minute)

	allocs, err := shared.DeviceAllocations()
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, a := range allocs {
		if a.PodUID == string(pod.UID) && a.Resource == "rdma/ib" {
			recorded = append(recorded, a.DeviceIDs...)
		}
	}
	sort.Strings(recorded)
	if len(recorded) != 2 {
		t.Fatalf("kubelet recorded rdma/ib devices %v for the pod, want 2", recorded)
	}

	env := podEnv(t, pod.Name)
	got := strings.Split(env["RDMA_DEVICES"], ",")
	sort.Strings(got)
	if !slices.Equal(got, recorded) {
		t.Errorf("RDMA_DEVICES %q, but the kubelet allocated %v", env["RDMA_DEVICES"], recorded)
	}
	hcas := strings.Split(strings.TrimPrefix(env["NCCL_IB_HCA"], "="), ",")
	sort.Strings(hcas)
	if !strings.HasPrefix(env["NCCL_IB_HCA"], "=") || !slices.Equal(hcas, []string{recorded[0] + ":1", recorded[1] + ":1"}) {
		t.Errorf("NCCL_IB_HCA %q, want exactly port 1 of %v", env["NCCL_IB_HCA"], recorded)
	}

	want := map[string]string{"/dev/infiniband/rdma_cm": hostCharDev(t, "rdma_cm")}
	for _, id := range recorded {
		maps.Copy(want, simCharDevs(t, id))
	}
	if n := len(want); n != 7 { // 2 x (uverbs, umad, issm) + rdma_cm
		t.Errorf("expected %d device nodes from the simulated sysfs, want 7: %v", n, want)
	}
	gotDevs := podDevices(t, pod.Name)
	if !maps.Equal(gotDevs, want) {
		t.Errorf("container's /dev/infiniband:\n%s\nwant (the allocated ports' nodes on the host):\n%s", formatDevs(gotDevs), formatDevs(want))
	}
	t.Logf("pod %s got %v: %s", pod.Name, recorded, formatDevs(gotDevs))
}

func formatDevs(m map[string]string) string {
	var lines []string
	for p, d := range m {
		lines = append(lines, "  "+p+" "+d)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestRDMAPortDown: a port taken down in the simulator leaves rdma/ib's
// allocatable (capacity stays), the node is tainted with a GPUHealthy
// message naming the port, and all of it reverts once the port is up again
// and the recovery period has passed.
func TestRDMAPortDown(t *testing.T) {
	a := needAgent(t)
	waitDemoRDMA(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const nic = "mlx5_5"
	start := time.Now()
	clearFault := injectFault(ctx, t, a, agentproc.Fault{Kind: "port-down", NIC: nic})
	degraded := maps.Clone(agentdeploy.DemoRDMA)
	degraded["rdma/ib"]--
	if err := shared.WaitNodeResources(ctx, "rdma/", agentdeploy.DemoRDMA, degraded); err != nil {
		t.Fatalf("down port still allocatable: %v", err)
	}
	t.Logf("port down → rdma/ib allocatable 8→7 on the Node object after %s", time.Since(start).Round(time.Millisecond))
	_, cond := waitNodeHealth(ctx, t, false, "port "+nic+" went down")
	if !strings.Contains(cond.Message, nic) {
		t.Errorf("GPUHealthy message %q does not name the down port %s", cond.Message, nic)
	}
	clearFault()
	waitNodeHealth(ctx, t, true, "port "+nic+" came back")
	waitDemoRDMA(t, time.Minute)
}

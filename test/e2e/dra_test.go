package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// The DRA scenario's device kinds, DeviceClasses (the chart's) and the
// standard attribute its GPU + NIC claim aligns on.
var draKinds = []string{"gpu", "mig", "nic"}

const (
	gpuClass     = "gpu." + dra.DriverName
	nicClass     = "nic." + dra.DriverName
	pcieRootAttr = "resource.kubernetes.io/pcieRoot"
	nvlinkIsland = dra.DriverName + "/" + string(dra.AttrNVLinkIsland)
)

// draRescan is the agent's rescan interval in TestDRA.
const draRescan = 10 * time.Second

// TestDRA serves the demo node through the agent's DRA driver instead of
// the device plugin (the agent reinstalled with dra.enabled, every kind),
// and checks, on the real kubelet, scheduler and containerd:
//
//   - the ResourceSlices hold exactly the simulated node's devices and the
//     device plugin no longer offers them;
//   - a claim for 1 GPU + 1 NIC with matchAttribute pcieRoot runs a pod
//     that gets exactly those devices (env and device nodes from the
//     claim's CDI spec), and the pair shares a PCIe root complex in the
//     simulated topology;
//   - a claim for 2 GPUs with matchAttribute nvlinkIsland gets an
//     NVLink-connected pair;
//   - an unchanged pod asking for nvidia.com/gpu: 2 and rdma/ib: 1 is
//     served by DRA through the classes' extendedResourceName: the
//     scheduler's claim, the GPUs and the NIC in the container, the pod's
//     metrics attribution;
//   - no ResourceSlice write while nothing changes;
//   - the agent's pod deleted while a claim is prepared: the claim's pod
//     keeps running (same container), and after its deletion the new
//     agent unprepares it (CDI spec and checkpoint entry gone, claim
//     deallocated);
//   - an XID 79 on an allocated GPU taints that device in its slice
//     (time measured), the running pod's allocatedResourcesStatus reports
//     it Unhealthy, a new claim for that exact GPU is not allocated (one
//     tolerating the taint is), and after a GPU reset the taint goes.
//
// At the end the default install (device plugin only) is restored; no
// device-plugin pod may run meanwhile (the agent refuses to move a kind
// while a device of it is allocated through the other API).
func TestDRA(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	requireNoDevicePluginPods(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	// Registered first, so it runs last: after the cleanups below have
	// deleted every pod and claim of the scenario.
	defaults := a.Options
	t.Cleanup(func() { restoreDeviceplugin(t, a, defaults) })

	start := time.Now()
	opts := defaults
	opts.DRA = draKinds
	// Rescans every 10 s (30 s by default), so the quiet window below
	// spans one in a third of the time.
	opts.Values = withConfig(defaults.Values, "rescan-interval", draRescan.String())
	// Device metadata in the containers (KEP-5304).
	opts.Values["dra"] = map[string]any{"deviceMetadata": true}
	rctx, rcancel := context.WithTimeout(ctx, 4*time.Minute)
	agentPod, err := a.Reinstall(rctx, shared, opts)
	rcancel()
	if err != nil {
		t.Fatalf("reinstall the agent with DRA: %v\nagent log:\n%s", err, agentLog(a))
	}
	t.Logf("agent reinstalled with DRA %v: pod %s Ready after %s", draKinds, agentPod.Name, time.Since(start).Round(time.Millisecond))

	node := simTopology(t, a)
	want := expectedDRADevices(node)
	devs := waitSliceDevices(ctx, t, "the DRA install", func(devs map[string]resourcev1.Device) error {
		return sameDevices(devs, want, "")
	})
	t.Logf("ResourceSlices of %s/%s hold %d devices %s after %s", dra.DriverName, shared.NodeName, len(devs), strings.Join(slices.Sorted(maps.Keys(devs)), " "), time.Since(start).Round(time.Millisecond))
	logDevice(t, devs, "gpu-2")
	logDevice(t, devs, dra.MIGName(node.GPUs[1].Index, node.GPUs[1].MIG[0]))
	logDevice(t, devs, dra.NICName(node.NICs[2].Name))
	// One device, one API: the device plugin withdrew what DRA serves.
	for _, prefix := range []string{"nvidia.com/", "rdma/"} {
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		err := shared.WaitNodeResources(wctx, prefix, nil, map[string]int64{})
		wcancel()
		if err != nil {
			t.Errorf("device plugin still offers what DRA serves: %v", err)
		}
	}
	quietSince, versionsBefore := time.Now(), sliceVersions(ctx, t)

	// (a) 1 GPU + 1 NIC on one PCIe root complex.
	pair := runGPUNICClaim(ctx, t, node, devs)

	// (b) 2 GPUs on one NVLink island.
	twoGPUs := runTwoGPUClaim(ctx, t, node, devs)

	// (f) An unchanged pod asking for nvidia.com/gpu: 2 and rdma/ib: 1,
	// served by DRA.
	runExtendedResourcePod(ctx, t, a, node)

	// (e) Nothing changed since the slices settled: claims, pods, health
	// polls (e2ePollInterval) and at least one rescan (draRescan) later,
	// no slice write.
	if d := draRescan + 2*time.Second - time.Since(quietSince); d > 0 {
		time.Sleep(d)
	}
	if v := sliceVersions(ctx, t); v != versionsBefore {
		t.Errorf("ResourceSlices went from %s to %s in %s with no device or health change", versionsBefore, v, time.Since(quietSince).Round(time.Second))
	} else {
		t.Logf("no ResourceSlice write in %s without change (%s)", time.Since(quietSince).Round(time.Second), v)
	}

	// (d) The agent restarted while twoGPUs is prepared.
	agentRestartWhilePrepared(ctx, t, a, twoGPUs, want)

	// (c) A fault on the GPU of the first pair, which still runs.
	faultOnAllocatedGPU(ctx, t, a, node, pair)
}

// requireNoDevicePluginPods fails the test when a pod holding a device the
// switch to DRA moves (nvidia.com/*, rdma/*) is not finished.
func requireNoDevicePluginPods(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := shared.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var busy []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			for res := range c.Resources.Limits {
				if strings.HasPrefix(string(res), "nvidia.com/") || strings.HasPrefix(string(res), "rdma/") {
					busy = append(busy, p.Namespace+"/"+p.Name+" ("+string(res)+")")
				}
			}
		}
	}
	if len(busy) > 0 {
		t.Fatalf("device-plugin pods still hold devices; the agent would refuse to move them to DRA: %v", busy)
	}
}

// restoreDeviceplugin turns DRA off as the chart says to (two upgrades:
// first no kind with DRA still installed, so the agent hands its kinds
// back to the device plugin and deletes its ResourceSlices; then DRA
// uninstalled) and waits until the node offers the demo resources again
// through the device plugin, as the other tests expect. The driver's
// slices must be gone after the first step, so no device is offered
// through both APIs; slices left behind are reported, then removed so
// later runs start clean.
func restoreDeviceplugin(t *testing.T, a *agentdeploy.Agent, defaults agentdeploy.Options) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cctx, ccancel := context.WithTimeout(ctx, 90*time.Second)
	defer ccancel()
	// The kubelet unprepares a deleted pod's claims after the pod is gone
	// from the API: wait for it.
	var specs []string
	if err := poll(cctx, func(context.Context) (bool, error) {
		all, err := cluster.AgentCDISpecs()
		specs = slices.DeleteFunc(all, func(n string) bool { return !isClaimSpec(n) })
		return err == nil && len(specs) == 0, nil
	}); err != nil {
		t.Errorf("claim CDI specs %v left in %s after every claim's pod and claim were deleted", specs, cluster.CDIDir)
	}
	start := time.Now()
	noKind := defaults
	noKind.DRA = []string{}
	if _, err := a.Reinstall(ctx, shared, noKind); err != nil {
		t.Errorf("turn DRA off (dra.devices empty): %v\nagent log:\n%s", err, agentLog(a))
	}
	waitDevicePluginBack(ctx, t, "dra.devices was emptied")
	slicesGone(ctx, t)
	t.Logf("dra.devices emptied: device plugin serving again, no ResourceSlice, after %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := a.Reinstall(ctx, shared, defaults); err != nil {
		t.Errorf("restore the default install: %v\nagent log:\n%s", err, agentLog(a))
		return
	}
	waitDevicePluginBack(ctx, t, "DRA was uninstalled")
	slicesGone(ctx, t)
	t.Logf("default install restored (DRA uninstalled) in %s", time.Since(start).Round(time.Millisecond))
}

// waitDevicePluginBack waits until the device plugin offers every demo
// resource again.
func waitDevicePluginBack(ctx context.Context, t *testing.T, after string) {
	t.Helper()
	for prefix, want := range map[string]map[string]int64{"nvidia.com/": agentdeploy.DemoResources, "rdma/": agentdeploy.DemoRDMA} {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := shared.WaitNodeResources(wctx, prefix, want, want); err != nil {
			t.Errorf("device plugin after %s: %v", after, err)
		}
		wcancel()
	}
}

// slicesGone checks that the driver publishes no slice for the node any
// more (within a minute); left ones are deleted after the error.
func slicesGone(ctx context.Context, t *testing.T) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var left []string
	err := poll(wctx, func(ctx context.Context) (bool, error) {
		list, err := listSlices(ctx)
		if err != nil {
			return false, nil
		}
		left = left[:0]
		for _, s := range list {
			left = append(left, s.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("ResourceSlices %v of %s still published a minute after DRA was turned off: the device plugin serves the same devices", left, dra.DriverName)
		for _, name := range left {
			_ = shared.Client.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}
}

// agentLog is the agent container's log, or its previous one's when the
// current one has not written anything (a crash loop), for failure
// messages.
func agentLog(a *agentdeploy.Agent) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := a.Pod(ctx, shared)
	if err != nil {
		return err.Error()
	}
	var out string
	for _, previous := range []bool{false, true} {
		raw, err := shared.Client.CoreV1().Pods(a.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Previous: previous, TailLines: ptrTo(int64(60))}).DoRaw(ctx)
		if err == nil && len(strings.TrimSpace(string(raw))) > 0 {
			return fmt.Sprintf("(pod %s, previous container %v)\n%s", pod.Name, previous, raw)
		}
		out += fmt.Sprintf("previous=%v: %v; ", previous, err)
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

func isClaimSpec(name string) bool {
	return strings.HasPrefix(name, strings.TrimSuffix(dra.SpecFile(""), ".json"))
}

// simTopology is the simulated node's model (the simulator's GET /state).
func simTopology(t *testing.T, a *agentdeploy.Agent) *topology.Node {
	t.Helper()
	var n topology.Node
	if err := getJSON(a.Control.Base+"/state", &n); err != nil {
		t.Fatalf("simulator state: %v", err)
	}
	return &n
}

func getJSON(url string, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// expectedDRADevices are the device names the driver must publish for n:
// whole GPUs (not in MIG mode), the MIG devices of the current layout,
// the RDMA NICs, named as package dra names them.
func expectedDRADevices(n *topology.Node) []string {
	var out []string
	for _, g := range n.GPUs {
		if !g.MIGEnabled {
			out = append(out, dra.GPUName(g.Index))
			continue
		}
		for _, m := range g.MIG {
			out = append(out, dra.MIGName(g.Index, m))
		}
	}
	for _, nic := range n.NICs {
		out = append(out, dra.NICName(nic.Name))
	}
	sort.Strings(out)
	return out
}

// sameDevices says how devs differs from the wanted names, and whether a
// device other than tainted carries a taint of the agent (tainted ""
// wants none).
func sameDevices(devs map[string]resourcev1.Device, want []string, tainted string) error {
	got := slices.Sorted(maps.Keys(devs))
	if !slices.Equal(got, want) {
		return fmt.Errorf("devices %v, want %v", got, want)
	}
	for name, d := range devs {
		has := agentTaint(d) != nil
		if has != (name == tainted) {
			return fmt.Errorf("device %s taints %+v (want the agent's taint only on %q)", name, d.Taints, tainted)
		}
	}
	return nil
}

// agentTaint is the device's taint with the agent's key, nil if none.
func agentTaint(d resourcev1.Device) *resourcev1.DeviceTaint {
	for i := range d.Taints {
		if d.Taints[i].Key == dra.TaintKey {
			return &d.Taints[i]
		}
	}
	return nil
}

// sliceSelector selects this node's slices of the agent's driver.
func sliceSelector() metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + shared.NodeName + "," +
		resourcev1.ResourceSliceSelectorDriver + "=" + dra.DriverName}
}

func listSlices(ctx context.Context) ([]resourcev1.ResourceSlice, error) {
	l, err := shared.Client.ResourceV1().ResourceSlices().List(ctx, sliceSelector())
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// sliceDevices are the devices of the newest generation of the node's
// pool, by name, as the scheduler reads them.
func sliceDevices(list []resourcev1.ResourceSlice) (map[string]resourcev1.Device, error) {
	var gen int64 = -1
	for _, s := range list {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	out := map[string]resourcev1.Device{}
	for _, s := range list {
		if s.Spec.Pool.Generation != gen {
			continue
		}
		if s.Spec.Pool.Name != shared.NodeName {
			return nil, fmt.Errorf("slice %s in pool %q, want the node's name %q", s.Name, s.Spec.Pool.Name, shared.NodeName)
		}
		for _, d := range s.Spec.Devices {
			if _, dup := out[d.Name]; dup {
				return nil, fmt.Errorf("device %s published twice", d.Name)
			}
			out[d.Name] = d
		}
	}
	return out, nil
}

// waitSliceDevices waits until the node's slices pass check and returns
// their devices; after names what led there, for the failure message.
func waitSliceDevices(ctx context.Context, t *testing.T, after string, check func(map[string]resourcev1.Device) error) map[string]resourcev1.Device {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var devs map[string]resourcev1.Device
	last := errors.New("no slice listed yet")
	err := poll(wctx, func(ctx context.Context) (bool, error) {
		list, err := listSlices(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		if devs, err = sliceDevices(list); err != nil {
			last = err
			return false, nil
		}
		last = check(devs)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("ResourceSlices after %s: %v (%v)", after, last, err)
	}
	return devs
}

// logDevice logs one published device, abridged to its attributes,
// capacities and taints.
func logDevice(t *testing.T, devs map[string]resourcev1.Device, name string) {
	t.Helper()
	d, ok := devs[name]
	if !ok {
		t.Errorf("device %s not published", name)
		return
	}
	var attrs []string
	for k, v := range d.Attributes {
		var s string
		switch {
		case v.StringValue != nil:
			s = strconv.Quote(*v.StringValue)
		case v.IntValue != nil:
			s = strconv.FormatInt(*v.IntValue, 10)
		case v.BoolValue != nil:
			s = strconv.FormatBool(*v.BoolValue)
		case v.VersionValue != nil:
			s = "v" + *v.VersionValue
		}
		attrs = append(attrs, string(k)+"="+s)
	}
	sort.Strings(attrs)
	var caps []string
	for k, v := range d.Capacity {
		caps = append(caps, string(k)+"="+v.Value.String())
	}
	sort.Strings(caps)
	t.Logf("device %s: %s; capacity %s; taints %v", name, strings.Join(attrs, " "), strings.Join(caps, " "), d.Taints)
}

// attr is a device's string attribute (by fully qualified or driver-local
// name), "" when absent.
func attr(d resourcev1.Device, name string) string {
	v, ok := d.Attributes[resourcev1.QualifiedName(name)]
	if !ok {
		v, ok = d.Attributes[resourcev1.QualifiedName(strings.TrimPrefix(name, dra.DriverName+"/"))]
	}
	if !ok || v.StringValue == nil {
		return ""
	}
	return *v.StringValue
}

// sliceVersions names the node's ResourceSlices of the driver with their
// resourceVersions: any write to one (create, update, delete) changes it.
func sliceVersions(ctx context.Context, t *testing.T) string {
	t.Helper()
	l, err := listSlices(ctx)
	if err != nil {
		t.Fatalf("list ResourceSlices: %v", err)
	}
	out := make([]string, 0, len(l))
	for _, s := range l {
		out = append(out, s.Name+"@"+s.ResourceVersion)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// createClaim creates a ResourceClaim in the test namespace; the test's
// cleanup deletes it (after the pods using it, registered later).
func createClaim(ctx context.Context, t *testing.T, name string, spec resourcev1.DeviceClaim) *resourcev1.ResourceClaim {
	t.Helper()
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec:       resourcev1.ResourceClaimSpec{Devices: spec},
	}
	created, err := shared.Client.ResourceV1().ResourceClaims(testNamespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s: %v", name, err)
	}
	t.Cleanup(func() { deleteClaim(t, name) })
	return created
}

func deleteClaim(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claims := shared.Client.ResourceV1().ResourceClaims(testNamespace)
	if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete claim %s: %v", name, err)
		return
	}
	// The claim controller removes its finalizer once it is deallocated.
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := claims.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("claim %s not gone: %v", name, err)
	}
}

// draPod is a workload pod whose container uses the named ResourceClaims
// (pod claim name = claim name). It tolerates the agent's Node taint, so
// the node-wide taint a GPU fault also brings does not hide what the
// device taint alone does.
func draPod(ctx context.Context, t *testing.T, name string, claims ...string) {
	t.Helper()
	if err := workloadOnce(); err != nil {
		t.Fatalf("load workload image: %v", err)
	}
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Tolerations:                   []corev1.Toleration{{Key: unhealthyTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           cluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	for _, c := range claims {
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: &c})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c})
	}
	if _, err := shared.Client.CoreV1().Pods(testNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
}

// allocation is a claim's allocated devices of the agent's driver on this
// node, by request.
func allocation(t *testing.T, claim *resourcev1.ResourceClaim) map[string][]string {
	t.Helper()
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated", claim.Name)
	}
	out := map[string][]string{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != dra.DriverName || r.Pool != shared.NodeName {
			t.Errorf("claim %s: result %+v is not of driver %s, pool %s", claim.Name, r, dra.DriverName, shared.NodeName)
			continue
		}
		out[r.Request] = append(out[r.Request], r.Device)
	}
	for _, devs := range out {
		sort.Strings(devs)
	}
	return out
}

func getClaim(ctx context.Context, t *testing.T, name string) *resourcev1.ResourceClaim {
	t.Helper()
	c, err := shared.Client.ResourceV1().ResourceClaims(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get claim %s: %v", name, err)
	}
	return c
}

// gpuByName resolves a published GPU name (gpu-<index>) in the model.
func gpuByName(t *testing.T, n *topology.Node, name string) *topology.GPU {
	t.Helper()
	for i := range n.GPUs {
		if dra.GPUName(n.GPUs[i].Index) == name && !n.GPUs[i].MIGEnabled {
			return &n.GPUs[i]
		}
	}
	t.Fatalf("%s is not a whole GPU of the simulated node", name)
	return nil
}

func nicByName(t *testing.T, n *topology.Node, name string) *topology.NIC {
	t.Helper()
	for i := range n.NICs {
		if dra.NICName(n.NICs[i].Name) == name {
			return &n.NICs[i]
		}
	}
	t.Fatalf("%s is not a NIC of the simulated node", name)
	return nil
}

// rootComplex is the PCIe root complex ("pci0000:20") of a device's PCI
// path in the model, as sysfs names it: /sys/devices/pci<domain>:<bus>/...
func rootComplex(path []string) string {
	if len(path) == 0 || len(path[0]) < 7 {
		return ""
	}
	return "pci" + path[0][:7]
}

// cdiSpec is the part of a CDI spec file the checks read.
type cdiSpec struct {
	Kind    string `json:"kind"`
	Devices []struct {
		Name           string `json:"name"`
		ContainerEdits struct {
			Env         []string `json:"env"`
			DeviceNodes []struct {
				Path     string `json:"path"`
				HostPath string `json:"hostPath"`
			} `json:"deviceNodes"`
		} `json:"containerEdits"`
	} `json:"devices"`
}

// claimSpec reads the CDI spec the agent wrote for a claim: device nodes
// (container path → host path) of each published device, and the env of
// each request.
func claimSpec(t *testing.T, claim *resourcev1.ResourceClaim) (nodes map[string]map[string]string, env map[string]map[string]string) {
	t.Helper()
	path := filepath.Join(cluster.CDIDir, dra.SpecFile(string(claim.UID)))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("claim %s: CDI spec: %v", claim.Name, err)
	}
	var spec cdiSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("claim %s: CDI spec %s: %v", claim.Name, path, err)
	}
	if spec.Kind != dra.CDIVendor+"/"+dra.CDIClass {
		t.Errorf("CDI spec %s kind %q, want %s/%s", path, spec.Kind, dra.CDIVendor, dra.CDIClass)
	}
	nodes, env = map[string]map[string]string{}, map[string]map[string]string{}
	prefix := string(claim.UID) + "-"
	for _, d := range spec.Devices {
		name, ok := strings.CutPrefix(d.Name, prefix)
		if !ok {
			t.Errorf("CDI spec %s: device %q is not of claim %s", path, d.Name, claim.UID)
			continue
		}
		if req, ok := strings.CutPrefix(name, "request-"); ok {
			env[req] = map[string]string{}
			for _, kv := range d.ContainerEdits.Env {
				k, v, _ := strings.Cut(kv, "=")
				env[req][k] = v
			}
			continue
		}
		nodes[name] = map[string]string{}
		for _, n := range d.ContainerEdits.DeviceNodes {
			hp := n.HostPath
			if hp == "" {
				hp = n.Path
			}
			nodes[name][n.Path] = hp
		}
	}
	return nodes, env
}

// hostNode describes a host file as the workload prints a container's
// device nodes: "char MAJOR:MINOR PERM".
func hostNode(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Errorf("device node %s the CDI spec names on the host: %v", path, err)
		return "missing"
	}
	kind := "other"
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		kind = "char"
	case unix.S_IFREG:
		kind = "file"
	}
	return fmt.Sprintf("%s %d:%d %o", kind, unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mode&0o777)
}

// gpuNodes are the device nodes a container of a whole GPU needs, as the
// device plugin's device specs list them: the GPU's /dev/nvidia<minor>
// and the control nodes the (simulated) host has.
func gpuNodes(g *topology.GPU) []string {
	out := []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)}
	for _, n := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if _, err := os.Stat(filepath.Join(agentdeploy.SimHostRoot(shared), n)); err == nil {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// checkContainerDevices: the pod's container has exactly the device nodes
// of the CDI spec's devices, each the node the spec names on the host.
func checkContainerDevices(t *testing.T, pod string, nodes map[string]map[string]string) {
	t.Helper()
	want := map[string]string{}
	for _, dn := range nodes {
		for p, hp := range dn {
			want[p] = hostNode(t, hp)
		}
	}
	got := podDevices(t, pod)
	if !maps.Equal(got, want) {
		t.Errorf("pod %s: container's device nodes:\n%s\nwant the claim's CDI spec's, as on the host:\n%s", pod, formatDevs(got), formatDevs(want))
	}
}

// runGPUNICClaim: (a) a claim for 1 GPU + 1 NIC with matchAttribute
// pcieRoot; its pod runs with exactly those devices, which share a PCIe
// root complex in the model. Returns the claim's name, its GPU name and
// the pod.
func runGPUNICClaim(ctx context.Context, t *testing.T, node *topology.Node, devs map[string]resourcev1.Device) gpuPod {
	const name = "dra-gpu-nic"
	root := resourcev1.FullyQualifiedName(pcieRootAttr)
	createClaim(ctx, t, name, resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{
			{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gpuClass}},
			{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: nicClass}},
		},
		Constraints: []resourcev1.DeviceConstraint{{Requests: []string{"gpu", "nic"}, MatchAttribute: &root}},
	})
	draPod(ctx, t, name, name)
	pod := waitPodRunning(t, name, 2*time.Minute)
	claim := getClaim(ctx, t, name)
	alloc := allocation(t, claim)
	if len(alloc["gpu"]) != 1 || len(alloc["nic"]) != 1 || len(alloc) != 2 {
		t.Fatalf("claim %s allocated %v, want one GPU and one NIC", name, alloc)
	}
	gName, nName := alloc["gpu"][0], alloc["nic"][0]
	g, nic := gpuByName(t, node, gName), nicByName(t, node, nName)

	// The pair shares a root complex in the simulated topology, not only
	// in the slice: the model's PCI paths and its GPU-NIC PCIe level.
	if rg, rn := rootComplex(g.PCIPath), rootComplex(nic.PCIPath); rg == "" || rg != rn {
		t.Errorf("%s (%v) and %s (%v) are on root complexes %q and %q in the model", gName, g.PCIPath, nName, nic.PCIPath, rg, rn)
	}
	var level topology.PCIeLevel
	for _, l := range nic.GPUs {
		if l.GPU == g.Index {
			level = l.PCIe
		}
	}
	if !slices.Contains([]topology.PCIeLevel{topology.PCIeSingleSwitch, topology.PCIeMultiSwitch, topology.PCIeHostBridge}, level) {
		t.Errorf("model says %s-%s PCIe level %q, want one under a host bridge", gName, nName, level)
	}
	if rg, rn := attr(devs[gName], pcieRootAttr), attr(devs[nName], pcieRootAttr); rg == "" || rg != rn || rg != rootComplex(g.PCIPath) {
		t.Errorf("published pcieRoot %s=%q %s=%q, want both %q", gName, rg, nName, rn, rootComplex(g.PCIPath))
	}

	// Exactly those devices: env and device nodes from the claim's CDI spec.
	env := podEnv(t, name)
	if env["NVIDIA_VISIBLE_DEVICES"] != g.UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %s's UUID %s", env["NVIDIA_VISIBLE_DEVICES"], gName, g.UUID)
	}
	if want := "=" + nic.Name + ":1"; env["NCCL_IB_HCA"] != want {
		t.Errorf("NCCL_IB_HCA %q, want %q (port 1 of %s, exact match)", env["NCCL_IB_HCA"], want, nic.Name)
	}
	if env["RDMA_DEVICES"] != nic.Name {
		t.Errorf("RDMA_DEVICES %q, want %s", env["RDMA_DEVICES"], nic.Name)
	}
	nodes, specEnv := claimSpec(t, claim)
	if got := slices.Sorted(maps.Keys(nodes)); !slices.Equal(got, []string{gName, nName}) {
		t.Errorf("CDI spec devices %v, want %s and %s", got, gName, nName)
	}
	if got := slices.Sorted(maps.Keys(nodes[gName])); !slices.Equal(got, gpuNodes(g)) {
		t.Errorf("CDI spec's %s device nodes %v, want %v", gName, got, gpuNodes(g))
	}
	wantNIC := map[string]bool{"/dev/infiniband/rdma_cm": true}
	for p := range simCharDevs(t, nic.Name) {
		wantNIC[p] = true
	}
	if got := slices.Sorted(maps.Keys(nodes[nName])); !slices.Equal(got, slices.Sorted(maps.Keys(wantNIC))) {
		t.Errorf("CDI spec's %s device nodes %v, want %v", nName, got, slices.Sorted(maps.Keys(wantNIC)))
	}
	if specEnv["gpu"]["NVIDIA_VISIBLE_DEVICES"] != g.UUID || specEnv["nic"]["NCCL_IB_HCA"] != env["NCCL_IB_HCA"] {
		t.Errorf("CDI spec env %v does not name %s and %s", specEnv, g.UUID, nic.Name)
	}
	checkContainerDevices(t, name, nodes)
	checkDeviceMetadata(t, name, map[string]string{"gpu": gName, "nic": nName}, map[string]string{gName: g.UUID})
	t.Logf("claim %s: %s (%s) + %s on %s (model level %s); env NVIDIA_VISIBLE_DEVICES=%s NCCL_IB_HCA=%s; devices:\n%s",
		name, gName, g.UUID, nName, rootComplex(g.PCIPath), level, env["NVIDIA_VISIBLE_DEVICES"], env["NCCL_IB_HCA"], formatDevs(podDevices(t, name)))
	return gpuPod{claim: name, pod: pod, gpu: gName, index: g.Index, uuid: g.UUID, nic: nName}
}

// gpuPod is a running pod of a claim and what it holds.
type gpuPod struct {
	claim string
	pod   *corev1.Pod
	// gpu is the first GPU's device name, index its NVML index, uuid its
	// UUID; nic the NIC's device name, if any.
	gpu   string
	index int
	uuid  string
	nic   string
}

// runTwoGPUClaim: (b) a claim for 2 GPUs with matchAttribute nvlinkIsland
// gets two GPUs the model links by NVLink, and its pod sees both.
// runExtendedResourcePod runs a pod that asks for nvidia.com/gpu: 2 and
// rdma/ib: 1 as it would on a device-plugin node. The node's allocatable
// no longer carries either, so the scheduler serves both through the
// DeviceClasses naming them (KEP-5004): it creates a claim of its own for
// the pod, the agent prepares it like any claim, and the kubelet gives the
// container that claim's CDI devices. The pod is deleted at the end and
// its claim must go with it, so that the scenario's restore finds nothing
// allocated.
func runExtendedResourcePod(ctx context.Context, t *testing.T, a *agentdeploy.Agent, node *topology.Node) {
	const name = "dra-extended-gpus"
	start := time.Now()
	workloadPod(t, name, map[string]int64{"nvidia.com/gpu": 2, "rdma/ib": 1})
	pod := waitPodRunning(t, name, 2*time.Minute)
	running := time.Since(start)
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil || st.ResourceClaimName == "" {
		t.Fatalf("pod %s runs without an extended-resource claim (status %+v): served by something other than DRA", name, st)
	}
	claim := getClaim(ctx, t, st.ResourceClaimName)
	if claim.Annotations[resourcev1.ExtendedResourceClaimAnnotation] != "true" {
		t.Errorf("claim %s lacks %s=true: %v", claim.Name, resourcev1.ExtendedResourceClaimAnnotation, claim.Annotations)
	}
	alloc := allocation(t, claim)
	byResource := map[string][]string{}
	for _, m := range st.RequestMappings {
		byResource[m.ResourceName] = alloc[m.RequestName]
	}
	gpus, nics := byResource["nvidia.com/gpu"], byResource["rdma/ib"]
	if len(alloc) != 2 || len(gpus) != 2 || len(nics) != 1 {
		t.Fatalf("claim %s allocated %v for mappings %+v, want two GPUs for nvidia.com/gpu and a NIC for rdma/ib", claim.Name, alloc, st.RequestMappings)
	}
	var uuids []string
	for _, d := range gpus {
		if dra.TypeOf(d) != dra.TypeGPU {
			t.Errorf("claim %s: %s is not a whole GPU", claim.Name, d)
		}
		uuids = append(uuids, gpuByName(t, node, d).UUID)
	}
	nic := nicByName(t, node, nics[0])
	sort.Strings(uuids)
	env := podEnv(t, name)
	got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",")
	sort.Strings(got)
	if !slices.Equal(got, uuids) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %v, want %v", got, uuids)
	}
	if hca := env["NCCL_IB_HCA"]; !strings.Contains(hca, nic.Name) {
		t.Errorf("NCCL_IB_HCA %q, want the allocated NIC %s", hca, nic.Name)
	}
	nodes, _ := claimSpec(t, claim)
	if gn := slices.Sorted(maps.Keys(nodes)); !slices.Equal(gn, slices.Sorted(slices.Values(append(slices.Clone(gpus), nics...)))) {
		t.Errorf("CDI spec devices %v, want %v and %v", gn, gpus, nics)
	}
	checkContainerDevices(t, name, nodes)
	checkPodAttribution(t, a, pod, uuids)
	checkClaimLabels(t, a, claim, gpus, node)
	t.Logf("pod %s (nvidia.com/gpu: 2, rdma/ib: 1, no claim of its own) Running after %s on %v and %s through the scheduler's claim %s; NVIDIA_VISIBLE_DEVICES, NCCL_IB_HCA=%s, the metrics' pod labels and dcgm-exporter's DRA claim labels follow",
		name, running.Round(time.Millisecond), gpus, nics[0], claim.Name, env["NCCL_IB_HCA"])

	deletePod(t, name)
	gctx, gcancel := context.WithTimeout(ctx, time.Minute)
	defer gcancel()
	err := poll(gctx, func(ctx context.Context) (bool, error) {
		_, err := shared.Client.ResourceV1().ResourceClaims(testNamespace).Get(ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("claim %s of the deleted pod %s still exists: %v", claim.Name, name, err)
	}
}

func runTwoGPUClaim(ctx context.Context, t *testing.T, node *topology.Node, devs map[string]resourcev1.Device) gpuPod {
	const name = "dra-two-gpus"
	island := resourcev1.FullyQualifiedName(nvlinkIsland)
	createClaim(ctx, t, name, resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{
			{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gpuClass, Count: 2}},
		},
		Constraints: []resourcev1.DeviceConstraint{{Requests: []string{"gpus"}, MatchAttribute: &island}},
	})
	draPod(ctx, t, name, name)
	pod := waitPodRunning(t, name, 2*time.Minute)
	claim := getClaim(ctx, t, name)
	alloc := allocation(t, claim)
	if len(alloc["gpus"]) != 2 || len(alloc) != 1 {
		t.Fatalf("claim %s allocated %v, want two GPUs", name, alloc)
	}
	g0, g1 := gpuByName(t, node, alloc["gpus"][0]), gpuByName(t, node, alloc["gpus"][1])
	links := 0
	for _, l := range node.Links {
		if (l.A == g0.Index && l.B == g1.Index) || (l.A == g1.Index && l.B == g0.Index) {
			links = l.NVLinks
		}
	}
	if links == 0 {
		t.Errorf("%v: the model has no NVLink between GPUs %d and %d", alloc["gpus"], g0.Index, g1.Index)
	}
	i0, i1 := attr(devs[alloc["gpus"][0]], nvlinkIsland), attr(devs[alloc["gpus"][1]], nvlinkIsland)
	if i0 == "" || i0 != i1 {
		t.Errorf("published nvlinkIsland %q and %q, want one island", i0, i1)
	}
	env := podEnv(t, name)
	got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",")
	sort.Strings(got)
	want := []string{g0.UUID, g1.UUID}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %v", env["NVIDIA_VISIBLE_DEVICES"], want)
	}
	nodes, _ := claimSpec(t, claim)
	if gn := slices.Sorted(maps.Keys(nodes)); !slices.Equal(gn, alloc["gpus"]) {
		t.Errorf("CDI spec devices %v, want %v", gn, alloc["gpus"])
	}
	checkContainerDevices(t, name, nodes)
	t.Logf("claim %s: %v on island %s (%d NVLinks between them); NVIDIA_VISIBLE_DEVICES=%s", name, alloc["gpus"], i0, links, env["NVIDIA_VISIBLE_DEVICES"])
	return gpuPod{claim: name, pod: pod, gpu: alloc["gpus"][0], index: g0.Index, uuid: g0.UUID}
}

// checkpointPath finds the agent's prepared-claims checkpoint in the
// simulated host root (its state dir there).
func checkpointPath(t *testing.T) string {
	t.Helper()
	var found string
	_ = filepath.WalkDir(agentdeploy.SimHostRoot(shared), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() && (d.Name() == "sys" || d.Name() == "dev" || d.Name() == "proc") && filepath.Dir(p) == agentdeploy.SimHostRoot(shared) {
			return fs.SkipDir
		}
		if d.Name() == dra.CheckpointFileName {
			found = p
			return fs.SkipAll
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no %s under %s", dra.CheckpointFileName, agentdeploy.SimHostRoot(shared))
	}
	return found
}

// checkpointed says whether the checkpoint holds the claim's UID.
func checkpointed(t *testing.T, path, uid string) bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	var cp struct {
		Claims map[string]json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		t.Fatalf("checkpoint %s: %v", path, err)
	}
	_, ok := cp.Claims[uid]
	return ok
}

// containerOf is the pod's workload container's ID and restart count.
func containerOf(ctx context.Context, t *testing.T, name string) (id string, restarts int32, running bool) {
	t.Helper()
	pod, err := shared.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "workload" {
			return cs.ContainerID, cs.RestartCount, cs.State.Running != nil
		}
	}
	t.Fatalf("pod %s has no workload container status: %s", name, podSummary(pod))
	return "", 0, false
}

// agentRestartWhilePrepared: (d) the agent's pod is deleted while p's
// claim is prepared; the DaemonSet's new agent comes up, p keeps running
// in the same container, the new agent republishes no slice, and after p
// is deleted the new agent unprepares the claim: its CDI spec and
// checkpoint entry go, and the claim is deallocated.
func agentRestartWhilePrepared(ctx context.Context, t *testing.T, a *agentdeploy.Agent, p gpuPod, want []string) {
	claim := getClaim(ctx, t, p.claim)
	uid := string(claim.UID)
	spec := filepath.Join(cluster.CDIDir, dra.SpecFile(uid))
	cp := checkpointPath(t)
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("claim %s prepared, but its CDI spec: %v", p.claim, err)
	}
	if !checkpointed(t, cp, uid) {
		t.Fatalf("claim %s prepared, but %s does not hold %s", p.claim, cp, uid)
	}
	containerID, restarts, _ := containerOf(ctx, t, p.pod.Name)
	versions := sliceVersions(ctx, t)

	old, err := a.Pod(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := shared.Client.CoreV1().Pods(a.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh, err := a.WaitReplaced(ctx, shared, old.UID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent pod %s deleted while claim %s was prepared; %s Ready after %s", old.Name, p.claim, fresh.Name, time.Since(start).Round(time.Millisecond))
	waitSliceDevices(ctx, t, "the agent's restart", func(devs map[string]resourcev1.Device) error {
		return sameDevices(devs, want, "")
	})
	// Two health polls after Ready: a restart with nothing changed
	// rewrites no slice.
	time.Sleep(2*e2ePollInterval + time.Second)
	if v := sliceVersions(ctx, t); v != versions {
		t.Errorf("the restarted agent wrote ResourceSlices with no device or health change: %s, before %s", v, versions)
	}
	id, r, running := containerOf(ctx, t, p.pod.Name)
	if !running || id != containerID || r != restarts {
		t.Errorf("pod %s across the agent's restart: container %s (running %v, restarts %d), before %s (restarts %d)", p.pod.Name, id, running, r, containerID, restarts)
	}
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("claim %s's CDI spec lost across the agent's restart: %v", p.claim, err)
	}

	start = time.Now()
	deletePod(t, p.pod.Name)
	var state string
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, serr := os.Stat(spec)
		c, err := shared.Client.ResourceV1().ResourceClaims(testNamespace).Get(ctx, p.claim, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		inCP := checkpointed(t, cp, uid)
		state = fmt.Sprintf("spec present %v, checkpointed %v, allocated %v, reserved for %v", serr == nil, inCP, c.Status.Allocation != nil, c.Status.ReservedFor)
		return errors.Is(serr, fs.ErrNotExist) && !inCP && c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0, nil
	})
	if err != nil {
		t.Fatalf("claim %s after its pod's deletion (agent restarted meanwhile): %s; want unprepared and deallocated: %v", p.claim, state, err)
	}
	t.Logf("pod %s deleted: claim %s unprepared by the restarted agent (CDI spec and checkpoint entry gone) and deallocated after %s", p.pod.Name, p.claim, time.Since(start).Round(time.Millisecond))
}

// gpuHealth is the pod's allocatedResourcesStatus entry for the CDI
// device of the GPU named gpu, nil if there is none.
func gpuHealth(pod *corev1.Pod, claim, gpu string) *corev1.ResourceHealth {
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name != corev1.ResourceName("claim:"+claim) {
				continue
			}
			for i := range rs.Resources {
				// The kubelet names a DRA device by its first CDI device
				// ID, <vendor>/<class>=<claim UID>-<device>.
				if strings.HasSuffix(string(rs.Resources[i].ResourceID), "-"+gpu) {
					return &rs.Resources[i]
				}
			}
		}
	}
	return nil
}

// waitGPUHealth waits until the running pod's allocatedResourcesStatus
// reports the GPU with health want, and returns the entry.
func waitGPUHealth(ctx context.Context, t *testing.T, p gpuPod, want corev1.ResourceHealthStatus) *corev1.ResourceHealth {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var h *corev1.ResourceHealth
	var statuses any
	err := poll(wctx, func(ctx context.Context) (bool, error) {
		pod, err := shared.Client.CoreV1().Pods(testNamespace).Get(ctx, p.pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var all []corev1.ResourceStatus
		for _, cs := range pod.Status.ContainerStatuses {
			all = append(all, cs.AllocatedResourcesStatus...)
		}
		statuses = all
		h = gpuHealth(pod, p.claim, p.gpu)
		return h != nil && h.Health == want, nil
	})
	if err != nil {
		t.Fatalf("pod %s allocatedResourcesStatus %+v: no %s entry for %s of claim %s", p.pod.Name, statuses, want, p.gpu, p.claim)
	}
	return h
}

// watchTaint returns a channel that receives the time the node's slices
// first show want (the agent's taint on device present, or absent). It
// lists them every 100 ms from the call on (one node's slices: a few
// objects), so the time is the API server's state to within that.
func watchTaint(ctx context.Context, t *testing.T, device string, present bool) <-chan time.Time {
	t.Helper()
	out := make(chan time.Time, 1)
	go func() {
		for {
			if list, err := listSlices(ctx); err == nil {
				for _, s := range list {
					for _, d := range s.Spec.Devices {
						if d.Name == device && (agentTaint(d) != nil) == present {
							out <- time.Now()
							return
						}
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return out
}

// faultOnAllocatedGPU: (c) an XID 79 on p's GPU, allocated to a running
// pod: the device is tainted in its slice (time from the injection
// measured), the pod's allocatedResourcesStatus says Unhealthy, a new
// claim for exactly that GPU is not allocated while one tolerating the
// taint is; a GPU reset then clears the taint.
func faultOnAllocatedGPU(ctx context.Context, t *testing.T, a *agentdeploy.Agent, node *topology.Node, p gpuPod) {
	// ResourceHealthStatus (KEP-4680, pod allocatedResourcesStatus) is
	// beta and on by default since 1.36 (k8s.io/kubernetes v1.37.2
	// pkg/features/kube_features.go: {1.36, Default: true, Beta}), and so
	// is ResourceHealthStatusMessage; the cluster sets no feature gate.
	healthy := waitGPUHealth(ctx, t, p, corev1.ResourceHealthStatusHealthy)
	t.Logf("pod %s allocatedResourcesStatus before the fault: %s %s", p.pod.Name, healthy.ResourceID, healthy.Health)
	versions := sliceVersions(ctx, t)
	want := expectedDRADevices(node)

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tainted := watchTaint(wctx, t, p.gpu, true)
	fault := agentproc.Fault{Kind: "xid", GPU: p.index, XID: 79}
	injected := time.Now()
	if err := a.Control.InjectFault(ctx, fault); err != nil {
		t.Fatal(err)
	}
	// XID 79 holds the GPU unhealthy until reset evidence, across agent
	// restarts: reset it before anything else runs, also on failure.
	resetDone := false
	t.Cleanup(func() {
		if !resetDone {
			resetGPU(t, a, p.index)
		}
	})
	select {
	case at := <-tainted:
		t.Logf("XID 79 on GPU %d (%s) → device taint %s on the API server after %s", p.index, p.gpu, dra.TaintKey, at.Sub(injected).Round(time.Millisecond))
	case <-time.After(2 * time.Minute):
		t.Fatalf("no taint %s on %s two minutes after XID 79; %s", dra.TaintKey, p.gpu, draDiagnostics(ctx, a))
	}
	devs := waitSliceDevices(ctx, t, "XID 79 on "+p.gpu, func(devs map[string]resourcev1.Device) error {
		return sameDevices(devs, want, p.gpu)
	})
	taint := agentTaint(devs[p.gpu])
	if taint.Effect != resourcev1.DeviceTaintEffectNoSchedule || !strings.Contains(taint.Value, "79") {
		t.Errorf("taint %+v on %s, want effect NoSchedule and a value naming XID 79", *taint, p.gpu)
	}
	if v := sliceVersions(ctx, t); v == versions {
		t.Errorf("ResourceSlices %s unchanged after the taint", v)
	} else {
		t.Logf("ResourceSlices for the taint: %s, before %s", v, versions)
	}

	h := waitGPUHealth(ctx, t, p, corev1.ResourceHealthStatusUnhealthy)
	inStatus := time.Since(injected)
	msg := ""
	if h.Message != nil {
		msg = *h.Message
	}
	if !strings.Contains(msg, "79") {
		t.Errorf("allocatedResourcesStatus of %s: message %q does not name XID 79", p.gpu, msg)
	}
	t.Logf("XID 79 on GPU %d → pod %s allocatedResourcesStatus %s %s %q after %s (polled every 250 ms)", p.index, p.pod.Name, h.ResourceID, h.Health, msg, inStatus.Round(time.Millisecond))
	if _, _, running := containerOf(ctx, t, p.pod.Name); !running {
		t.Errorf("pod %s stopped running after a NoSchedule device taint", p.pod.Name)
	}

	// The GPU is free once the pod is gone; only the taint keeps new
	// claims off it.
	deletePod(t, p.pod.Name)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		return getClaim(ctx, t, p.claim).Status.Allocation == nil, nil
	}); err != nil {
		t.Fatalf("claim %s not deallocated after its pod's deletion: %v", p.claim, err)
	}
	uuidSel := []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes[%q].%s == %q`, dra.DriverName, dra.AttrUUID, p.uuid)}}}
	const blocked = "dra-tainted-gpu"
	createClaim(ctx, t, blocked, resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gpuClass, Selectors: uuidSel}},
	}})
	draPod(ctx, t, blocked, blocked)
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if pod, err = shared.Client.CoreV1().Pods(testNamespace).Get(ctx, blocked, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s with a claim for the tainted %s not reported unschedulable: %s", blocked, p.gpu, podSummary(pod))
	}
	if c := getClaim(ctx, t, blocked); c.Status.Allocation != nil || pod.Spec.NodeName != "" {
		t.Errorf("claim %s for the tainted %s allocated %+v, pod on node %q", blocked, p.gpu, c.Status.Allocation, pod.Spec.NodeName)
	}
	t.Logf("claim %s for the tainted %s: not allocated, pod %s", blocked, p.gpu, podSummary(pod))
	deletePod(t, blocked)
	deleteClaim(t, blocked)

	// The control: the same claim tolerating the taint gets that GPU, so
	// the taint alone kept the first one off it.
	const tolerating = "dra-tolerating-gpu"
	createClaim(ctx, t, tolerating, resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gpuClass, Selectors: uuidSel,
			Tolerations: []resourcev1.DeviceToleration{{Key: dra.TaintKey, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule}}}},
	}})
	draPod(ctx, t, tolerating, tolerating)
	var alloc map[string][]string
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		c := getClaim(ctx, t, tolerating)
		if c.Status.Allocation == nil {
			return false, nil
		}
		alloc = allocation(t, c)
		return true, nil
	})
	if err != nil || !slices.Equal(alloc["gpu"], []string{p.gpu}) {
		t.Errorf("claim %s tolerating the taint: allocation %v (%v), want %s", tolerating, alloc, err, p.gpu)
	}
	deletePod(t, tolerating)
	deleteClaim(t, tolerating)

	// A GPU reset is the evidence that releases an XID 79 hold; after the
	// recovery period (10 s here) the taint goes.
	untainted := watchTaint(wctx, t, p.gpu, false)
	reset := time.Now()
	if err := a.Control.InjectFault(ctx, agentproc.Fault{Kind: "gpu-reset", GPU: p.index}); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-untainted:
		t.Logf("GPU %d reset → taint removed from %s after %s (recovery period 10s)", p.index, p.gpu, at.Sub(reset).Round(time.Millisecond))
	case <-time.After(2 * time.Minute):
		t.Fatalf("taint still on %s two minutes after a GPU reset", p.gpu)
	}
	resetDone = true
	waitSliceDevices(ctx, t, "the GPU reset", func(devs map[string]resourcev1.Device) error {
		return sameDevices(devs, want, "")
	})
	waitNodeHealth(ctx, t, true, "the GPU reset")
}

// resetGPU resets a simulated GPU after a failed fault scenario and waits
// until the node is healthy again, so the held fault does not outlive the
// test (a restarted agent's fresh simulator would show no reset evidence);
// if the reset is not enough it asks the agent to clear every fault
// (annotation gpu-node-agent.io/clear-faults).
func resetGPU(t *testing.T, a *agentdeploy.Agent, gpu int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := a.Control.InjectFault(ctx, agentproc.Fault{Kind: "gpu-reset", GPU: gpu}); err != nil {
		t.Logf("cleanup: reset GPU %d: %v", gpu, err)
	}
	healthy := func(d time.Duration) bool {
		wctx, wcancel := context.WithTimeout(ctx, d)
		defer wcancel()
		return poll(wctx, func(ctx context.Context) (bool, error) {
			taint, cond, err := nodeHealth(ctx)
			return err == nil && taint == nil && cond != nil && cond.Status == corev1.ConditionTrue, nil
		}) == nil
	}
	if healthy(time.Minute) {
		return
	}
	patch := []byte(`{"metadata":{"annotations":{"gpu-node-agent.io/clear-faults":"all"}}}`)
	if _, err := shared.Client.CoreV1().Nodes().Patch(ctx, shared.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("cleanup: clear faults: %v", err)
	}
	if !healthy(time.Minute) {
		t.Errorf("cleanup: node still unhealthy after resetting GPU %d and clearing faults", gpu)
	}
}

// draDiagnostics is what explains a DRA failure: the agent's DRA log
// lines and slice metrics, and the taints in the node's slices.
func draDiagnostics(ctx context.Context, a *agentdeploy.Agent) string {
	var b strings.Builder
	if body, ok := scrapeAgent(ctx, a); ok {
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "gpu_node_agent_dra_") || strings.HasPrefix(line, "gpu_node_agent_device_healthy") {
				fmt.Fprintf(&b, "\n  metric %s", line)
			}
		}
	}
	if list, err := listSlices(ctx); err == nil {
		for _, s := range list {
			for _, d := range s.Spec.Devices {
				if len(d.Taints) > 0 {
					fmt.Fprintf(&b, "\n  slice %s device %s taints %+v", s.Name, d.Name, d.Taints)
				}
			}
		}
	}
	if logs, err := a.Logs(ctx, shared); err == nil {
		lines := strings.Split(logs, "\n")
		for _, l := range lines[max(0, len(lines)-80):] {
			fmt.Fprintf(&b, "\n  log %s", l)
		}
	}
	return b.String()
}

// checkDeviceMetadata checks the device metadata files the container of
// pod name (whose claim has the same name) was given: one per request at
// the path the KEP gives, naming the request's device with the
// attributes of its ResourceSlice (uuids: a device's uuid attribute).
func checkDeviceMetadata(t *testing.T, name string, devices, uuids map[string]string) {
	t.Helper()
	files := map[string]string{}
	for _, line := range strings.Split(podLog(t, name), "\n") {
		if strings.HasPrefix(line, "METADATA-ERROR ") {
			t.Errorf("pod %s: %s", name, line)
		}
		if f := strings.SplitN(line, " ", 3); len(f) == 3 && f[0] == "METADATA" {
			files[f[1]] = f[2]
		}
	}
	for req, dev := range devices {
		path := "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/" + name + "/" + req + "/" + dra.DriverName + "-metadata.json"
		content, ok := files[path]
		if !ok {
			t.Errorf("pod %s has no device metadata file %s; it has %v", name, path, slices.Sorted(maps.Keys(files)))
			continue
		}
		var meta struct {
			Requests []struct {
				Name    string `json:"name"`
				Devices []struct {
					Driver     string                                `json:"driver"`
					Name       string                                `json:"name"`
					Attributes map[string]resourcev1.DeviceAttribute `json:"attributes"`
				} `json:"devices"`
			} `json:"requests"`
		}
		if err := json.Unmarshal([]byte(content), &meta); err != nil {
			t.Errorf("pod %s: %s: %v: %s", name, path, err, content)
			continue
		}
		if len(meta.Requests) != 1 || meta.Requests[0].Name != req || len(meta.Requests[0].Devices) != 1 ||
			meta.Requests[0].Devices[0].Name != dev || meta.Requests[0].Devices[0].Driver != dra.DriverName {
			t.Errorf("pod %s: %s says %s, want request %s with device %s", name, path, content, req, dev)
			continue
		}
		attrs := meta.Requests[0].Devices[0].Attributes
		if want, ok := uuids[dev]; ok {
			if got := attrs["uuid"].StringValue; got == nil || *got != want {
				t.Errorf("pod %s: %s: uuid %v, want %s", name, path, got, want)
			}
		}
		t.Logf("pod %s: %s names %s with %d attributes", name, path, dev, len(attrs))
	}
}

// checkClaimLabels: the DCGM series of each GPU the claim holds (devices,
// by their names in the pool) carry dcgm-exporter's DRA labels naming the
// claim, our driver, this node's pool and the device, as the kubelet's
// pod-resources API reports the allocation.
func checkClaimLabels(t *testing.T, a *agentdeploy.Agent, claim *resourcev1.ResourceClaim, devices []string, node *topology.Node) {
	t.Helper()
	want := map[string][]string{}
	for _, d := range devices {
		want[gpuByName(t, node, d).UUID] = []string{
			`dra_claim_name="` + claim.Name + `"`, `dra_claim_namespace="` + claim.Namespace + `"`,
			`dra_driver_name="` + dra.DriverName + `"`, `dra_pool_name="` + shared.NodeName + `"`, `dra_device_name="` + d + `"`,
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var missing []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		body, ok := scrapeAgent(ctx, a)
		if !ok {
			return false, nil
		}
		missing = missing[:0]
		for uuid, labels := range want {
			found := slices.ContainsFunc(strings.Split(body, "\n"), func(line string) bool {
				if !strings.HasPrefix(line, "DCGM_FI_DEV_FB_USED{") || !strings.Contains(line, `UUID="`+uuid+`"`) {
					return false
				}
				for _, l := range labels {
					if !strings.Contains(line, l) {
						return false
					}
				}
				return true
			})
			if !found {
				missing = append(missing, uuid)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("no DCGM_FI_DEV_FB_USED series of GPUs %v with the DRA labels of claim %s/%s: %v", missing, claim.Namespace, claim.Name, err)
	}
}

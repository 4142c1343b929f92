package agent

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi/kubeapitest"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// draTestConfig is a simulated DGX H100 agent with a node name and a fake
// API server, serving kinds through DRA; the kubelet directory is dir
// (device plugins in dir/device-plugins).
func draTestConfig(t *testing.T, dir string, client *fake.Clientset, kinds ...string) testConfig {
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = filepath.Join(dir, "device-plugins")
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.NodeName = "gpu-node-1"
	cfg.NodeLabels = false
	cfg.PodAttribution = false
	cfg.Health.RecoveryPeriod = time.Second
	cfg.Health.DCGMMode = "off"
	cfg.Health.DisabledChecks = []string{health.CheckGPUProcesses}
	cfg.DRA = DRAConfig{Kinds: kinds, CDIDir: filepath.Join(dir, "cdi")}
	cfg.KubeRetry = 50 * time.Millisecond
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	return cfg
}

// publishedDevices are the devices of the node's slices, by name.
func publishedDevices(t *testing.T, client *fake.Clientset) map[string]resourceapi.Device {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourceapi.Device{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// TestAgentServesDRA runs the agent with every kind on DRA: the node's
// GPUs and NICs are published in its ResourceSlices and nothing through
// the device plugin; the kubelet plugin's sockets are up; a claim for a
// GPU and a NIC prepares against the served inventory; an XID taints the
// GPU's device and the reset removes the taint; the kinds are recorded.
func TestAgentServesDRA(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})
	kubeapitest.GenerateNames(client)
	cfg := draTestConfig(t, dir, client, "gpu", "mig", "nic")
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.dra == nil {
		t.Fatal("no DRA server with dra.devices set")
	}
	ctx, _ := startAgent(t, a)

	var devs map[string]resourceapi.Device
	testutil.WaitFor(t, "16 devices in the ResourceSlices", func() bool {
		devs = publishedDevices(t, client)
		return len(devs) == 16
	})
	for i := range 8 {
		for _, name := range []string{dra.GPUName(i), dra.NICName("mlx5_" + string(rune('0'+i)))} {
			d, ok := devs[name]
			if !ok {
				t.Fatalf("%s not published: %v", name, slices.Sorted(maps.Keys(devs)))
			}
			if len(d.Taints) != 0 {
				t.Errorf("%s tainted on a healthy node: %v", name, d.Taints)
			}
		}
	}
	if l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 1 {
		t.Fatalf("slices: %d, %v; want 1", len(l.Items), err)
	}
	if n := sliceWrites(client, "create"); n != 1 {
		t.Errorf("slice creates = %v, want 1", n)
	}
	if rs := a.rec.current().resources; len(rs) != 0 {
		t.Errorf("device plugin serves %d resources with every kind on DRA", len(rs))
	}
	for _, s := range []string{dra.DRASocket(dir), dra.RegistrationSocket(dir)} {
		if _, err := os.Stat(s); err != nil {
			t.Errorf("kubelet plugin socket: %v", err)
		}
	}
	if got, err := readServed(filepath.Join(a.cfg.Health.StateDir, ServedFileName)); err != nil || len(got) != 3 {
		t.Errorf("served record = %v, %v", got, err)
	}
	node := a.rec.current().node
	if off := a.offered(); !off[node.GPUs[2].UUID] || !off["mlx5_2"] {
		t.Errorf("offered() lacks DRA devices: %v", off)
	}

	// A claim allocated gpu-1 and nic-mlx5-1 prepares against the served
	// inventory: its CDI spec names the GPU's UUID.
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pair", UID: "claim-uid-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: dra.DriverName, Pool: "gpu-node-1", Device: "gpu-1"},
				{Request: "nic", Driver: dra.DriverName, Pool: "gpu-node-1", Device: "nic-mlx5-1"},
			}}}},
	}
	if _, err := client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := a.dra.prep.Prepare([]*resourceapi.ResourceClaim{claim})
	if r := res["claim-uid-1"]; r.Err != nil || len(r.Devices) != 2 {
		t.Fatalf("prepare: %+v", r)
	}
	if got, _ := preparedHolders(a.dra.prep)(dra.TypeGPU); !slices.Equal(got, []string{"claim default/pair: gpu-1"}) {
		t.Errorf("prepared gpu holders = %q", got)
	}
	spec, err := os.ReadFile(filepath.Join(cfg.DRA.CDIDir, dra.SpecFile("claim-uid-1")))
	if err != nil || !strings.Contains(string(spec), node.GPUs[1].UUID) || !strings.Contains(string(spec), "mlx5_1") {
		t.Fatalf("cdi spec %s (%v) lacks the GPU's UUID or the NIC", spec, err)
	}

	testutil.WaitFor(t, "the health monitor listening for XIDs", a.mon.Listening)
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"xid","gpu":2,"xid":79}`)
	taint := func() []resourceapi.DeviceTaint { return publishedDevices(t, client)[dra.GPUName(2)].Taints }
	testutil.WaitFor(t, "gpu-2 tainted after XID 79", func() bool { return len(taint()) == 1 })
	if tn := taint()[0]; tn.Key != dra.TaintKey || !strings.Contains(tn.Value, "xid-79") || tn.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("taint = %+v, want %s=...xid-79...:NoSchedule (the driver may ask for a reset too: recovery-action)", tn, dra.TaintKey)
	}
	if d := publishedDevices(t, client)[dra.GPUName(3)]; len(d.Taints) != 0 {
		t.Errorf("gpu-3 tainted too: %v", d.Taints)
	}
	if a.offered()[node.GPUs[2].UUID] {
		t.Error("the tainted GPU is still offered")
	}
	waitResetRequested(t, a.mon, node.GPUs[2].UUID)
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"gpu-reset","gpu":2}`)
	testutil.WaitFor(t, "gpu-2 untainted after the reset and recovery", func() bool { return len(taint()) == 0 })
}

// TestAgentDRAKindsOnly: with only NICs on DRA, the device plugin keeps
// the GPUs and the slices hold only NICs; a claim for a GPU is refused by
// the kubelet plugin, the GPUs being the device plugin's.
func TestAgentDRAKindsOnly(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})
	kubeapitest.GenerateNames(client)
	cfg := draTestConfig(t, dir, client, "nic")
	cfg.RDMA.Resources = []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}}
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := startAgent(t, a)
	var devs map[string]resourceapi.Device
	testutil.WaitFor(t, "8 NICs in the ResourceSlices", func() bool {
		devs = publishedDevices(t, client)
		return len(devs) == 8
	})
	for name, d := range devs {
		if dra.TypeOf(name) != dra.TypeNIC {
			t.Errorf("%s published with only nic on DRA", name)
		}
		// Each NIC stands for the rdma/ib its ports would be served as.
		if r := d.Attributes[dra.AttrRDMAResource].StringValue; r == nil || *r != "rdma/ib" {
			t.Errorf("%s: rdmaResource %v, want rdma/ib", name, r)
		}
	}
	testutil.WaitFor(t, "nvidia.com/gpu served by the device plugin", func() bool {
		return slices.ContainsFunc(a.rec.current().resources, func(r plugin.Resource) bool { return r.Name() == "nvidia.com/gpu" })
	})
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gpu", UID: "claim-uid-2"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: "gpu-node-1", Device: "gpu-0"}}}}},
	}
	if _, err := client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := a.dra.prep.Prepare([]*resourceapi.ResourceClaim{claim})
	if r := res["claim-uid-2"]; r.Err == nil || !strings.Contains(r.Err.Error(), "device gpu-0 is a gpu, which this node serves through the device plugin, not DRA") {
		t.Fatalf("prepare of a device-plugin GPU: %+v", r)
	}
}

// TestAgentWithoutDRA: no dra section and no record of one: nothing of DRA
// is built and the kinds stay with the device plugin.
func TestAgentWithoutDRA(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	client := fake.NewClientset()
	cfg := draTestConfig(t, dir, client)
	a, err := openAgent(cfg, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.dra != nil || a.split.active() {
		t.Fatal("DRA built without dra.devices")
	}
	if _, err := os.Stat(filepath.Join(a.cfg.Health.StateDir, ServedFileName)); !os.IsNotExist(err) {
		t.Errorf("served record written without DRA: %v", err)
	}
}

// TestAgentCorruptDRACheckpointFailsTheStart: the prepared-claims
// checkpoint cannot be read, so the agent does not start (fail closed).
func TestAgentCorruptDRACheckpointFailsTheStart(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := draTestConfig(t, dir, fake.NewClientset(), "nic")
	cfg.Health.StateDir = filepath.Join(dir, "state")
	if err := os.MkdirAll(cfg.Health.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Health.StateDir, dra.CheckpointFileName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := openAgent(cfg, slog.New(slog.DiscardHandler), io.Discard)
	if err == nil || !strings.Contains(err.Error(), dra.CheckpointFileName) {
		t.Fatalf("open error = %v, want one naming the checkpoint", err)
	}
}

// sliceWrites is how many verb requests on ResourceSlices client got.
func sliceWrites(client *fake.Clientset, verb string) int {
	n := 0
	for _, act := range client.Actions() {
		if act.GetVerb() == verb && act.GetResource().Resource == "resourceslices" {
			n++
		}
	}
	return n
}

// TestAgentDRASharing: with dra.sharing, the GPU the time-slicing section
// shares is published shared with its replicas as shares, and two claims
// holding shares of it both prepare, each with its share ID; without
// dra.sharing the same section leaves every device exclusive.
func TestAgentDRASharing(t *testing.T) {
	ts := &gpu.TimeSlicing{Resources: []gpu.SharedResource{{Name: gpu.ResourceGPU, Replicas: 3, Devices: gpu.SharedDevices{Count: 1}}}}
	for _, sharing := range []bool{true, false} {
		t.Run(fmt.Sprintf("sharing %v", sharing), func(t *testing.T) {
			dir := testutil.ShortTempDir(t)
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})
			kubeapitest.GenerateNames(client)
			cfg := draTestConfig(t, dir, client, "gpu", "mig", "nic")
			cfg.DRA.Sharing = sharing
			cfg.GPU.TimeSlicing = ts
			a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			startAgent(t, a)
			var devs map[string]resourceapi.Device
			testutil.WaitFor(t, "the GPUs in the ResourceSlices", func() bool {
				devs = publishedDevices(t, client)
				return len(devs) > 0 && devs["gpu-0"].Name != ""
			})
			for name, d := range devs {
				isShared := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
				if want := sharing && name == "gpu-0"; isShared != want {
					t.Errorf("%s published shared: %v, want %v", name, isShared, want)
				}
			}
			if !sharing {
				return
			}
			if n := devs["gpu-0"].Capacity[dra.CapShares]; n.Value.Value() != 3 {
				t.Errorf("gpu-0 has %s shares, want 3", n.Value.String())
			}
			var claims []*resourceapi.ResourceClaim
			for i, share := range []types.UID{"share-a", "share-b"} {
				claims = append(claims, &resourceapi.ResourceClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("c%d", i), UID: types.UID(fmt.Sprintf("claim-uid-%d", i))},
					Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
						Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: "gpu-node-1", Device: "gpu-0", ShareID: &share}}}}},
				})
			}
			res := a.dra.prep.Prepare(claims)
			for i, c := range claims {
				r := res[string(c.UID)]
				if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].ShareID != string(*c.Status.Allocation.Devices.Results[0].ShareID) {
					t.Errorf("claim %d: %+v", i, r)
				}
			}
		})
	}
}

// TestAgentDRAMIGOnDemand runs the agent with dra.migOnDemand on a DGX
// H100 whose GPU 0 an operator puts in MIG mode while it runs: the GPU's
// placements and counter set are published instead of the whole GPU; a
// claim for a placement makes its MIG device, which discovery then finds
// and which stays published as its placement (not as a device of its
// own) and out of the node's labels; unpreparing destroys it.
func TestAgentDRAMIGOnDemand(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})
	kubeapitest.GenerateNames(client)
	cfg := draTestConfig(t, dir, client, "gpu", "mig", "nic")
	cfg.DRA.MIGOnDemand = true
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, a)
	testutil.WaitFor(t, "gpu-0 published whole", func() bool { return publishedDevices(t, client)["gpu-0"].Name != "" })
	node := a.hw.(interface{ Node() *sim.Node }).Node()
	if err := node.EnableMIG(0); err != nil {
		t.Fatal(err)
	}
	place := dra.PlacementName(0, "4g.40gb", 0)
	testutil.WaitFor(t, "GPU 0's placements instead of the GPU", func() bool {
		devs := publishedDevices(t, client)
		_, whole := devs["gpu-0"]
		return devs[place].Name != "" && !whole
	})
	testutil.WaitFor(t, "GPU 0's counter set, alone", func() bool {
		list, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var sets []string
		for _, s := range list.Items {
			for _, c := range s.Spec.SharedCounters {
				sets = append(sets, c.Name)
			}
		}
		return slices.Equal(sets, []string{dra.CounterSetName(0)})
	})

	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mig", UID: "claim-uid-mig"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "mig", Driver: dra.DriverName, Pool: "gpu-node-1", Device: place}}}}},
	}
	r := a.dra.prep.Prepare([]*resourceapi.ResourceClaim{claim})[string(claim.UID)]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	made := node.Spec().GPUs[0].MIG
	if len(made) != 1 || made[0].Profile != "4g.40gb" {
		t.Fatalf("GPU 0 MIG devices %+v, want the made 4g.40gb", made)
	}
	testutil.WaitFor(t, "discovery to find the made device", func() bool {
		n := a.rec.current().node
		return n != nil && len(n.GPUs[0].MIG) == 1
	})
	if n := a.dra.withoutMade(a.rec.current().node); len(n.GPUs[0].MIG) != 0 {
		t.Errorf("the node's labels would count the made device: %+v", n.GPUs[0].MIG)
	}
	// What the agent publishes from the node it now serves: the made
	// device stands as its placement, never as a device of its own.
	res, err := dra.Build(a.rec.current().node, dra.Options{OnDemandMIG: true, Made: a.dra.prep.Made()})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, d := range res.Devices {
		names[d.Name] = true
	}
	if names[dra.MIGName(0, made[0])] || !names[place] {
		t.Errorf("made device published under its own name %v, placement published %v", names[dra.MIGName(0, made[0])], names[place])
	}
	testutil.WaitFor(t, "the slices to show the placement and not the made device's own name", func() bool {
		devs := publishedDevices(t, client)
		_, own := devs[dra.MIGName(0, made[0])]
		return devs[place].Name != "" && !own
	})
	if err := a.dra.prep.Unprepare([]dra.ClaimRef{{Namespace: "default", Name: "mig", UID: string(claim.UID)}})[string(claim.UID)]; err != nil {
		t.Fatal(err)
	}
	if left := node.Spec().GPUs[0].MIG; len(left) != 0 {
		t.Errorf("after unprepare GPU 0 has %+v", left)
	}
}

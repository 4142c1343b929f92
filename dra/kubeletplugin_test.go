package dra

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const testNode = "node-1"

// fakeClaims is the API server's claims: client-go's fake clientset,
// which the library's helper reads each claim from before a prepare.
type fakeClaims struct {
	cs *fake.Clientset
}

func newFakeClaims() *fakeClaims { return &fakeClaims{cs: fake.NewClientset()} }

func (f *fakeClaims) put(c *resourceapi.ResourceClaim) {
	claims := f.cs.ResourceV1().ResourceClaims(c.Namespace)
	if _, err := claims.Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		if _, err := claims.Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
			panic(err)
		}
	}
}

// result is one allocation result: request, driver, pool, device.
type result struct{ req, driver, pool, dev string }

func ours(req, dev string) result { return result{req, DriverName, testNode, dev} }

func allocated(ns, name, uid string, results ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, r := range results {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: r.req, Driver: r.driver, Pool: r.pool, Device: r.dev})
	}
	return c
}

// testEnv is a simulated node with the plugin serving on real unix
// sockets under a temporary kubelet directory.
type testEnv struct {
	t                               *testing.T
	node                            *topology.Node
	nics                            []rdma.Device
	root, kubeletDir, cdiDir, state string
	claims                          *fakeClaims
	plugin                          *KubeletPlugin
	// mig makes MIG devices for placement devices (nil: none is made).
	mig MIGMaker
}

func newEnv(t *testing.T, profile string, opts ...sim.ProfileOption) *testEnv {
	t.Helper()
	node, root := simNode(t, profile, opts...)
	nics, err := rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: root, HostDevPrefix: root})
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are limited to 108 bytes; t.TempDir can be long.
	kd, err := os.MkdirTemp("", "kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(kd) })
	e := &testEnv{t: t, node: node, nics: nics, root: root, kubeletDir: kd,
		cdiDir: filepath.Join(t.TempDir(), "cdi"), state: filepath.Join(t.TempDir(), "state"),
		claims: newFakeClaims()}
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *testEnv) start() error {
	prep, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: e.root, CDIDir: e.cdiDir, StateDir: e.state,
		Inventory: func() Inventory { return Inventory{Node: e.node, RDMA: e.nics, OnDemandMIG: e.mig != nil} },
		MIG:       e.mig})
	if err != nil {
		return err
	}
	e.plugin = NewKubeletPlugin(prep, PluginConfig{KubeletDir: e.kubeletDir, NodeName: testNode})
	if err := e.plugin.Start(context.Background(), e.claims.cs); err != nil {
		return err
	}
	e.t.Cleanup(e.plugin.Stop)
	return nil
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// kubelet does what the kubelet's plugin watcher does with a new
// registration socket: GetInfo, then NotifyRegistrationStatus, and
// returns a DRA v1 client on the endpoint GetInfo named.
func (e *testEnv) kubelet() drapbv1.DRAPluginClient {
	t := e.t
	t.Helper()
	reg := registerapi.NewRegistrationClient(dial(t, RegistrationSocket(e.kubeletDir)))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	return drapbv1.NewDRAPluginClient(dial(t, info.Endpoint))
}

func claimReq(ns, name, uid string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: ns, Name: name, Uid: uid}
}

func prepare(t *testing.T, c drapbv1.DRAPluginClient, claims ...*drapbv1.Claim) map[string]*drapbv1.NodePrepareResourceResponse {
	t.Helper()
	resp, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	if len(resp.Claims) != len(claims) {
		t.Fatalf("answers for %d claims, asked for %d", len(resp.Claims), len(claims))
	}
	return resp.Claims
}

func unprepare(t *testing.T, c drapbv1.DRAPluginClient, claims ...*drapbv1.Claim) map[string]*drapbv1.NodeUnprepareResourceResponse {
	t.Helper()
	resp, err := c.NodeUnprepareResources(context.Background(), &drapbv1.NodeUnprepareResourcesRequest{Claims: claims})
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp.Claims
}

func specFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// specModTime is the modification time of claim uid's CDI spec.
func specModTime(t *testing.T, dir, uid string) time.Time {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, SpecFile(uid)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.ModTime()
}

func gpuUUID(t *testing.T, n *topology.Node, index int) string {
	t.Helper()
	for _, g := range n.GPUs {
		if g.Index == index {
			return g.UUID
		}
	}
	t.Fatalf("no gpu %d", index)
	return ""
}

// containerEdits reads the claim specs in cdiDir with the CDI library's
// own reader (which validates them as a runtime would) and returns the env
// and device node paths the devices ids add to a container. The library's
// InjectDevices cannot be used: it stats each host device node, and the
// simulator's are regular files.
func containerEdits(t *testing.T, cdiDir string, ids []string) (env map[string]string, nodes []string) {
	t.Helper()
	env = map[string]string{}
	for _, id := range ids {
		vendor, class, name, err := parser.ParseQualifiedName(id)
		if err != nil {
			t.Fatalf("cdi id %q: %v", id, err)
		}
		if vendor+"/"+class != CDIVendor+"/"+CDIClass {
			t.Fatalf("cdi id %q of kind %s/%s", id, vendor, class)
		}
		var dev *cdi.Device
		for _, f := range specFiles(t, cdiDir) {
			spec, err := cdi.ReadSpec(filepath.Join(cdiDir, f), 0)
			if err != nil {
				t.Fatalf("read spec %s: %v", f, err)
			}
			if d := spec.GetDevice(name); d != nil {
				dev = d
			}
		}
		if dev == nil {
			t.Fatalf("no spec in %s defines %s", cdiDir, id)
		}
		for _, kv := range dev.ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			if old, dup := env[k]; dup && old != v {
				t.Errorf("%s set twice: %q and %q", k, old, v)
			}
			env[k] = v
		}
		for _, n := range dev.ContainerEdits.DeviceNodes {
			if !slices.Contains(nodes, n.Path) {
				nodes = append(nodes, n.Path)
			}
		}
	}
	return env, nodes
}

func TestRegistration(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	reg := registerapi.NewRegistrationClient(dial(t, RegistrationSocket(e.kubeletDir)))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != DriverName || info.Endpoint != DRASocket(e.kubeletDir) {
		t.Errorf("GetInfo = %v", info)
	}
	if !slices.Equal(info.SupportedVersions, []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}) {
		t.Errorf("supported versions %v", info.SupportedVersions)
	}
	if ok, _ := e.plugin.Registered(); ok {
		t.Error("registered before the kubelet said so")
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version mismatch"}); err == nil {
		t.Error("a refused registration was acknowledged")
	}
	if ok, msg := e.plugin.Registered(); ok || msg != "version mismatch" {
		t.Errorf("after refusal Registered() = %v, %q", ok, msg)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := e.plugin.Registered(); !ok {
		t.Error("not registered after the kubelet said so")
	}

	// Both sockets go with Stop, and a stale one does not stop a restart.
	e.plugin.Stop()
	for _, s := range []string{RegistrationSocket(e.kubeletDir), DRASocket(e.kubeletDir)} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Stop: %v", s, err)
		}
	}
	if err := os.WriteFile(DRASocket(e.kubeletDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.start(); err != nil {
		t.Fatalf("restart over a stale socket: %v", err)
	}
	e.kubelet()
}

func TestPrepareGPUAndNIC(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	claim := allocated("ns", "aligned", "uid-1", ours("gpu", "gpu-0"), ours("nic", "nic-mlx5-0"))
	e.claims.put(claim)

	first := prepare(t, c, claimReq("ns", "aligned", "uid-1"))["uid-1"]
	if first.Error != "" {
		t.Fatalf("prepare: %s", first.Error)
	}
	want := []*drapbv1.Device{
		{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-0",
			CdiDeviceIds: []string{"gpu-node-agent.io/claim=uid-1-gpu-0", "gpu-node-agent.io/claim=uid-1-request-gpu"}},
		{RequestNames: []string{"nic"}, PoolName: testNode, DeviceName: "nic-mlx5-0",
			CdiDeviceIds: []string{"gpu-node-agent.io/claim=uid-1-nic-mlx5-0", "gpu-node-agent.io/claim=uid-1-request-nic"}},
	}
	checkDevices(t, first.Devices, want)

	// What a container using both requests gets.
	var ids []string
	for _, d := range first.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	env, nodes := containerEdits(t, e.cdiDir, ids)
	if got := env["NVIDIA_VISIBLE_DEVICES"]; got != gpuUUID(t, e.node, 0) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want gpu 0's UUID", got)
	}
	if got := env["NCCL_IB_HCA"]; got != "=mlx5_0:1" {
		t.Errorf("NCCL_IB_HCA = %q", got)
	}
	for _, p := range []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/infiniband/uverbs0"} {
		if !slices.Contains(nodes, p) {
			t.Errorf("device node %s missing from %v", p, nodes)
		}
	}
	for _, p := range nodes {
		if strings.HasPrefix(p, "/dev/nvidia") && p != "/dev/nvidia0" && !slices.Contains([]string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}, p) {
			t.Errorf("container gets %s, a GPU it was not allocated", p)
		}
		if strings.HasPrefix(p, "/dev/infiniband/uverbs") && p != "/dev/infiniband/uverbs0" {
			t.Errorf("container gets %s, a NIC it was not allocated", p)
		}
	}

	// Prepare again: the same answer from the checkpoint (the spec is not
	// written again), still one spec file.
	before := specModTime(t, e.cdiDir, "uid-1")
	again := prepare(t, c, claimReq("ns", "aligned", "uid-1"))["uid-1"]
	checkDevices(t, again.Devices, want)
	if after := specModTime(t, e.cdiDir, "uid-1"); !after.Equal(before) {
		t.Error("a prepared claim's spec was written again")
	}
	if files := specFiles(t, e.cdiDir); !slices.Equal(files, []string{SpecFile("uid-1")}) {
		t.Errorf("cdi dir holds %v", files)
	}

	// Unprepare twice: both succeed, the spec and the checkpoint entry go.
	for i := range 2 {
		if r := unprepare(t, c, claimReq("ns", "aligned", "uid-1"))["uid-1"]; r == nil || r.Error != "" {
			t.Fatalf("unprepare %d: %v", i, r)
		}
	}
	if files := specFiles(t, e.cdiDir); len(files) != 0 {
		t.Errorf("cdi dir holds %v after unprepare", files)
	}
	if p := e.plugin.prep.Prepared(); len(p) != 0 {
		t.Errorf("checkpoint still holds %v", p)
	}
}

func checkDevices(t *testing.T, got []*drapbv1.Device, want []*drapbv1.Device) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if !slices.Equal(g.RequestNames, w.RequestNames) || g.PoolName != w.PoolName || g.DeviceName != w.DeviceName || !slices.Equal(g.CdiDeviceIds, w.CdiDeviceIds) {
			t.Errorf("device %d = %v, want %v", i, g, w)
		}
	}
}

func TestPrepareTwoGPUsOneRequest(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	e.claims.put(allocated("ns", "pair", "uid-2", ours("gpus", "gpu-2"), ours("gpus", "gpu-3")))
	r := prepare(t, c, claimReq("ns", "pair", "uid-2"))["uid-2"]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	// The request's environment rides on its first device only.
	if len(r.Devices) != 2 || len(r.Devices[0].CdiDeviceIds) != 2 || len(r.Devices[1].CdiDeviceIds) != 1 {
		t.Fatalf("devices %v", r.Devices)
	}
	env, nodes := containerEdits(t, e.cdiDir, append(r.Devices[0].CdiDeviceIds, r.Devices[1].CdiDeviceIds...))
	want := gpuUUID(t, e.node, 2) + "," + gpuUUID(t, e.node, 3)
	if env["NVIDIA_VISIBLE_DEVICES"] != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q", env["NVIDIA_VISIBLE_DEVICES"], want)
	}
	if _, ok := env["NCCL_IB_HCA"]; ok {
		t.Error("NCCL_IB_HCA set without a NIC")
	}
	for _, p := range []string{"/dev/nvidia2", "/dev/nvidia3"} {
		if !slices.Contains(nodes, p) {
			t.Errorf("%s missing from %v", p, nodes)
		}
	}
}

func TestPrepareMIG(t *testing.T) {
	e := newEnv(t, "dgx-a100", sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb"))
	c := e.kubelet()
	var mig topology.MIGDevice
	for _, g := range e.node.GPUs {
		if g.Index == 1 {
			mig = g.MIG[0]
		}
	}
	name := MIGName(1, mig)
	e.claims.put(allocated("ns", "mig", "uid-m", ours("mig", name)))
	r := prepare(t, c, claimReq("ns", "mig", "uid-m"))["uid-m"]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	env, nodes := containerEdits(t, e.cdiDir, r.Devices[0].CdiDeviceIds)
	if env["NVIDIA_VISIBLE_DEVICES"] != mig.UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %s", env["NVIDIA_VISIBLE_DEVICES"], mig.UUID)
	}
	caps := 0
	for _, p := range nodes {
		if strings.HasPrefix(p, "/dev/nvidia-caps/nvidia-cap") {
			caps++
		}
	}
	if caps != 2 || !slices.Contains(nodes, "/dev/nvidia1") {
		t.Errorf("MIG device nodes %v: want /dev/nvidia1 and the GI and CI access caps", nodes)
	}
}

func TestPrepareErrorsPerClaim(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	e.claims.put(allocated("ns", "good", "uid-good", ours("gpu", "gpu-1")))
	e.claims.put(allocated("ns", "replaced", "uid-new", ours("gpu", "gpu-2")))
	e.claims.put(allocated("ns", "gone-device", "uid-gone", ours("gpu", "gpu-1"), ours("gpu", "gpu-9")))
	e.claims.put(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "unallocated", UID: "uid-un"}})
	// A GPU whose device node is gone from the host cannot be handed out.
	if err := os.Remove(filepath.Join(e.root, "dev", "nvidia7")); err != nil {
		t.Fatal(err)
	}
	e.claims.put(allocated("ns", "no-node", "uid-nonode", ours("gpu", "gpu-7")))

	// Claims the library's helper reads and finds wrong (replaced, not
	// allocated, missing) fail the whole call before the driver sees it,
	// with a gRPC error naming the claim; the kubelet retries.
	for _, tc := range []struct {
		claim *drapbv1.Claim
		want  string
	}{
		{claimReq("ns", "replaced", "uid-old"), "replaced"},
		{claimReq("ns", "unallocated", "uid-un"), "not allocated"},
		{claimReq("ns", "missing", "uid-missing"), "not found"},
	} {
		_, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{
			Claims: []*drapbv1.Claim{claimReq("ns", "good", "uid-good"), tc.claim}})
		if err == nil || !strings.Contains(err.Error(), tc.claim.Name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("claim %s: error %v, want one naming it and containing %q", tc.claim.Name, err, tc.want)
		}
	}
	// Claims the driver cannot prepare fail one by one.
	got := prepare(t, c,
		claimReq("ns", "good", "uid-good"),
		claimReq("ns", "gone-device", "uid-gone"),
		claimReq("ns", "no-node", "uid-nonode"),
	)
	if got["uid-good"].Error != "" || len(got["uid-good"].Devices) != 1 {
		t.Errorf("good claim: %v", got["uid-good"])
	}
	for uid, want := range map[string]string{
		"uid-gone":   "gpu-9 is not on this node",
		"uid-nonode": "/dev/nvidia7",
	} {
		if r := got[uid]; !strings.Contains(r.Error, want) || len(r.Devices) != 0 {
			t.Errorf("claim %s: error %q, devices %v; want an error containing %q", uid, r.Error, r.Devices, want)
		}
	}
	if files := specFiles(t, e.cdiDir); !slices.Equal(files, []string{SpecFile("uid-good")}) {
		t.Errorf("cdi dir holds %v: only the good claim's spec belongs there", files)
	}
	if p := e.plugin.prep.Prepared(); !slices.Equal(p, []string{"uid-good"}) {
		t.Errorf("checkpoint holds %v", p)
	}
}

func TestPrepareIgnoresOtherDriversAndPools(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	e.claims.put(allocated("ns", "mixed", "uid-x",
		result{"gpu", "gpu.nvidia.com", testNode, "gpu-0"},
		result{"gpu", DriverName, "node-2", "gpu-0"},
		ours("nic", "nic-mlx5-3"),
	))
	e.claims.put(allocated("ns", "foreign", "uid-f", result{"gpu", "gpu.nvidia.com", testNode, "gpu-0"}))
	got := prepare(t, c, claimReq("ns", "mixed", "uid-x"), claimReq("ns", "foreign", "uid-f"))
	if r := got["uid-x"]; r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "nic-mlx5-3" {
		t.Errorf("mixed claim: %v; want only nic-mlx5-3", r)
	}
	if r := got["uid-f"]; r.Error != "" || len(r.Devices) != 0 {
		t.Errorf("foreign claim: %v; want nothing", r)
	}
	if files := specFiles(t, e.cdiDir); !slices.Equal(files, []string{SpecFile("uid-x")}) {
		t.Errorf("cdi dir holds %v", files)
	}
}

func TestRestartKeepsPreparedClaims(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	e.claims.put(allocated("ns", "kept", "uid-k", ours("gpu", "gpu-5")))
	before := prepare(t, c, claimReq("ns", "kept", "uid-k"))["uid-k"]
	if before.Error != "" {
		t.Fatal(before.Error)
	}

	// The agent restarts; the kubelet asks again (the same answer, from
	// the checkpoint), then the claim is deleted on the API server (the pod
	// is gone): only the checkpoint knows it, and unprepare works from it.
	e.plugin.Stop()
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	if p := e.plugin.prep.Prepared(); !slices.Equal(p, []string{"uid-k"}) {
		t.Fatalf("after restart the checkpoint holds %v", p)
	}
	c = e.kubelet()
	after := prepare(t, c, claimReq("ns", "kept", "uid-k"))["uid-k"]
	if after.Error != "" {
		t.Fatal(after.Error)
	}
	checkDevices(t, after.Devices, before.Devices)
	if err := e.claims.cs.ResourceV1().ResourceClaims("ns").Delete(context.Background(), "kept", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := unprepare(t, c, claimReq("ns", "kept", "uid-k"))["uid-k"]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if files := specFiles(t, e.cdiDir); len(files) != 0 {
		t.Errorf("cdi dir holds %v", files)
	}
}

func TestCorruptCheckpointFailsClosed(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":       "{not json",
		"truncated":     `{"version":1,"claims":{"uid":{"namespace":"ns"`,
		"other version": `{"version":2,"claims":{}}`,
		"no claims":     `{"version":1}`,
		"claim no name": `{"version":1,"claims":{"uid":{"namespace":"ns","name":"","devices":[]}}}`,
		"device no ids": `{"version":1,"claims":{"uid":{"namespace":"ns","name":"c","devices":[{"pool":"p","device":"gpu-0"}]}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, CheckpointFileName)
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewPreparer(PreparerConfig{NodeName: testNode, StateDir: dir, CDIDir: t.TempDir(),
				Inventory: func() Inventory { return Inventory{} }})
			if !errors.Is(err, ErrCheckpointCorrupt) || !strings.Contains(err.Error(), path) {
				t.Errorf("NewPreparer = %v; want ErrCheckpointCorrupt naming %s", err, path)
			}
			if b, _ := os.ReadFile(path); string(b) != content {
				t.Error("the corrupt checkpoint was changed")
			}
		})
	}
}

func TestV1beta1Service(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	e.kubelet()
	e.claims.put(allocated("ns", "old-kubelet", "uid-b", ours("gpu", "gpu-4")))
	c := drapbv1beta1.NewDRAPluginClient(dial(t, DRASocket(e.kubeletDir)))
	resp, err := c.NodePrepareResources(context.Background(), &drapbv1beta1.NodePrepareResourcesRequest{
		Claims: []*drapbv1beta1.Claim{{Namespace: "ns", Name: "old-kubelet", Uid: "uid-b"}}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims["uid-b"]
	if r == nil || r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-4" {
		t.Fatalf("v1beta1 prepare: %v", r)
	}
	u, err := c.NodeUnprepareResources(context.Background(), &drapbv1beta1.NodeUnprepareResourcesRequest{
		Claims: []*drapbv1beta1.Claim{{Namespace: "ns", Name: "old-kubelet", Uid: "uid-b"}}})
	if err != nil || u.Claims["uid-b"] == nil || u.Claims["uid-b"].Error != "" {
		t.Fatalf("v1beta1 unprepare: %v, %v", u, err)
	}
}

// TestPrepareRewritesLostSpec: a checkpointed claim whose spec is gone
// (the CDI dir is a tmpfs and the node rebooted) is prepared again.
func TestPrepareRewritesLostSpec(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	c := e.kubelet()
	e.claims.put(allocated("ns", "c", "uid-l", ours("gpu", "gpu-1")))
	first := prepare(t, c, claimReq("ns", "c", "uid-l"))["uid-l"]
	if first.Error != "" {
		t.Fatal(first.Error)
	}
	if err := os.Remove(filepath.Join(e.cdiDir, SpecFile("uid-l"))); err != nil {
		t.Fatal(err)
	}
	again := prepare(t, c, claimReq("ns", "c", "uid-l"))["uid-l"]
	if again.Error != "" {
		t.Fatal(again.Error)
	}
	checkDevices(t, again.Devices, first.Devices)
	if files := specFiles(t, e.cdiDir); !slices.Equal(files, []string{SpecFile("uid-l")}) {
		t.Errorf("cdi dir holds %v", files)
	}
}

// TestRollingUpdate: two instances of the plugin on one node, as a
// DaemonSet rollout runs them (each with its pod's UID), serve at once on
// sockets of their own; a claim prepared through the old one is known to
// the new one, which unprepares it.
func TestRollingUpdate(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	e.plugin.Stop()
	start := func(uid types.UID) *KubeletPlugin {
		t.Helper()
		prep, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: e.root, CDIDir: e.cdiDir, StateDir: e.state,
			Inventory: func() Inventory { return Inventory{Node: e.node, RDMA: e.nics} }})
		if err != nil {
			t.Fatal(err)
		}
		p := NewKubeletPlugin(prep, PluginConfig{KubeletDir: e.kubeletDir, NodeName: testNode, PodUID: uid})
		if err := p.Start(context.Background(), e.claims.cs); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		return p
	}
	kubelet := func(uid types.UID) drapbv1.DRAPluginClient {
		t.Helper()
		reg := registerapi.NewRegistrationClient(dial(t, filepath.Join(RegistryDir(e.kubeletDir), kubeletplugin.RollingUpdateRegistrarSocketFile(RegistryDir(e.kubeletDir), DriverName, uid))))
		info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(filepath.Base(info.Endpoint), string(uid)) {
			t.Errorf("instance %s serves DRA on %s, not a socket of its own", uid, info.Endpoint)
		}
		return drapbv1.NewDRAPluginClient(dial(t, info.Endpoint))
	}
	start("pod-old")
	oldC := kubelet("pod-old")
	newP := start("pod-new")
	newC := kubelet("pod-new")

	e.claims.put(allocated("ns", "c", "uid-r", ours("gpu", "gpu-3")))
	if r := prepare(t, oldC, claimReq("ns", "c", "uid-r"))["uid-r"]; r.Error != "" {
		t.Fatalf("prepare through the old instance: %s", r.Error)
	}
	// The new instance answers from the shared checkpoint.
	if r := prepare(t, newC, claimReq("ns", "c", "uid-r"))["uid-r"]; r.Error != "" || len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-3" {
		t.Fatalf("prepare again through the new instance: %v", r)
	}
	if r := unprepare(t, newC, claimReq("ns", "c", "uid-r"))["uid-r"]; r == nil || r.Error != "" {
		t.Fatalf("unprepare through the new instance: %v", r)
	}
	if files := specFiles(t, e.cdiDir); len(files) != 0 {
		t.Errorf("cdi dir holds %v after unprepare", files)
	}
	if p := newP.prep.Prepared(); len(p) != 0 {
		t.Errorf("checkpoint still holds %v", p)
	}
}

// TestDeviceMetadata: with device metadata on, a prepared request also
// gets the library's CDI device that mounts a JSON file describing its
// devices with the attributes the ResourceSlice publishes; unprepare
// removes both.
func TestDeviceMetadata(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	e.plugin.Stop()
	prep, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: e.root, CDIDir: e.cdiDir, StateDir: e.state,
		Inventory: func() Inventory { return Inventory{Node: e.node, RDMA: e.nics} }})
	if err != nil {
		t.Fatal(err)
	}
	p := NewKubeletPlugin(prep, PluginConfig{KubeletDir: e.kubeletDir, NodeName: testNode, DeviceMetadata: true, CDIDir: e.cdiDir})
	built, err := Build(e.node, Options{PCIeRoot: SysfsPCIeRoot(e.root)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetDevices(built.Devices, built.CounterSets)
	if err := p.Start(context.Background(), e.claims.cs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	c := e.kubelet()

	e.claims.put(allocated("ns", "meta", "uid-m", ours("gpu", "gpu-0")))
	r := prepare(t, c, claimReq("ns", "meta", "uid-m"))["uid-m"]
	if r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare: %v", r)
	}
	metaID := DriverName + "/metadata=uid-m_gpu"
	if !slices.Contains(r.Devices[0].CdiDeviceIds, metaID) {
		t.Fatalf("CDI devices %v lack the metadata device %s", r.Devices[0].CdiDeviceIds, metaID)
	}
	// The CDI spec mounts the file read-only where the KEP puts it.
	spec, err := os.ReadFile(filepath.Join(e.cdiDir, DriverName+"_metadata_uid-m_gpu.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cdiSpec struct {
		Devices []struct {
			ContainerEdits struct {
				Mounts []struct{ HostPath, ContainerPath string }
			}
		}
	}
	if err := json.Unmarshal(spec, &cdiSpec); err != nil || len(cdiSpec.Devices) != 1 || len(cdiSpec.Devices[0].ContainerEdits.Mounts) != 1 {
		t.Fatalf("metadata CDI spec %s (%v)", spec, err)
	}
	m := cdiSpec.Devices[0].ContainerEdits.Mounts[0]
	if want := "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/meta/gpu/" + DriverName + "-metadata.json"; m.ContainerPath != want {
		t.Errorf("metadata mounted at %s, want %s", m.ContainerPath, want)
	}
	data, err := os.ReadFile(m.HostPath)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Requests   []struct {
			Name    string `json:"name"`
			Devices []struct {
				Driver, Pool, Name string
				Attributes         map[string]resourceapi.DeviceAttribute
			} `json:"devices"`
		} `json:"requests"`
	}
	if err := json.NewDecoder(strings.NewReader(string(data))).Decode(&meta); err != nil {
		t.Fatalf("metadata file %s: %v", data, err)
	}
	if len(meta.Requests) != 1 || meta.Requests[0].Name != "gpu" || len(meta.Requests[0].Devices) != 1 {
		t.Fatalf("metadata %s: want request gpu with one device", data)
	}
	d := meta.Requests[0].Devices[0]
	if d.Driver != DriverName || d.Pool != testNode || d.Name != "gpu-0" {
		t.Errorf("metadata device %s/%s/%s, want %s/%s/gpu-0", d.Driver, d.Pool, d.Name, DriverName, testNode)
	}
	// The same attributes as the published device.
	var gpu0 resourceapi.Device
	for _, dev := range built.Devices {
		if dev.Name == "gpu-0" {
			gpu0 = dev
		}
	}
	if len(d.Attributes) != len(gpu0.Attributes) {
		t.Errorf("metadata has %d attributes, the slice %d", len(d.Attributes), len(gpu0.Attributes))
	}
	if got := d.Attributes[string(AttrUUID)].StringValue; got == nil || *got != gpuUUID(t, e.node, 0) {
		t.Errorf("metadata uuid %v, want gpu 0's", got)
	}

	if r := unprepare(t, c, claimReq("ns", "meta", "uid-m"))["uid-m"]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %v", r)
	}
	for _, p := range []string{m.HostPath, filepath.Join(e.cdiDir, DriverName+"_metadata_uid-m_gpu.json")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after unprepare: %v, want it removed", p, err)
		}
	}
}

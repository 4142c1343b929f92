package apiserver

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// slicesPath is the ResourceSlice collection's URL path.
const slicesPath = "/apis/resource.k8s.io/v1/resourceslices"

// otherDriver is a DRA driver that is not the agent's.
const otherDriver = "gpu.nvidia.com"

// draCluster is a real kube-apiserver with the chart's service account,
// RBAC, admission policy and DeviceClasses (every form: the API server
// validates them) rendered with dra.enabled=true,
// nodes A and B, and the agent's credential for node A.
type draCluster struct {
	c          *cluster.Cluster
	admin      kubernetes.Interface
	sa         *corev1.ServiceAccount
	policyName string
	nodeA      *corev1.Node
	// agentCfg authenticates as the agent's pod on node A (a token bound
	// to it carries A's name as the node-name extra); unboundCfg as the
	// same service account without a node.
	agentCfg, unboundCfg *rest.Config
}

const draNodeA, draNodeB = "gpu-a", "gpu-b"

// startDRACluster starts the API server and applies the chart's objects,
// returning once the policy and RBAC are in effect for ResourceSlices.
func startDRACluster(t *testing.T) *draCluster {
	t.Helper()
	c := cluster.Start(t, cluster.Options{})
	ctx := t.Context()
	d := &draCluster{c: c, admin: c.Client}

	// Every DeviceClass the chart can render, so that the API server
	// validates each form (CEL of the shared and RDMA classes, the
	// extended resource names): sharing on and an RDMA resource.
	rendered, err := agentdeploy.Render("gpu-node-agent", agentNamespace, map[string]any{
		"dra": map[string]any{"enabled": true, "sharing": map[string]any{"enabled": true}},
		"config": map[string]any{"rdma": map[string]any{"resources": []any{
			map[string]any{"name": "ib", "selectors": map[string]any{"linkTypes": []any{"infiniband"}}},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	var classes []*resourcev1.DeviceClass
	for _, u := range rendered {
		switch u.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DeviceClass":
		default:
			continue
		}
		obj, err := scheme.Scheme.New(u.GroupVersionKind())
		if err != nil {
			t.Fatalf("%s: %v", u.GroupVersionKind(), err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			t.Fatalf("convert %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			d.sa = o
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			d.policyName = o.Name
		case *resourcev1.DeviceClass:
			classes = append(classes, o)
			continue
		}
		objs = append(objs, obj)
	}
	names := map[string]bool{}
	for _, dc := range classes {
		names[dc.Name] = true
	}
	for _, want := range []string{"gpu", "mig", "nic", "gpu-shared", "mig-shared", "rdma-ib", "mig-1g.10gb", "mig-1g.10gb.me"} {
		if !names[want+"."+dra.DriverName] {
			t.Errorf("chart with dra.enabled lacks DeviceClass %s.%s (has %d)", want, dra.DriverName, len(classes))
		}
	}
	if d.sa == nil || d.sa.Namespace != agentNamespace || d.policyName == "" {
		t.Fatalf("chart with dra.enabled lacks the service account in %s or the policy", agentNamespace)
	}
	apply(t, d.admin, objs)
	for _, dc := range classes {
		if _, err := d.admin.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create DeviceClass %s: %v", dc.Name, err)
		}
	}
	for _, name := range []string{draNodeA, draNodeB} {
		n, err := d.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		if name == draNodeA {
			d.nodeA = n
		}
	}
	pod, err := d.admin.CoreV1().Pods(d.sa.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-agent-a"},
		Spec: corev1.PodSpec{
			NodeName: draNodeA, ServiceAccountName: d.sa.Name,
			Containers: []corev1.Container{{Name: "agent", Image: "gpu-node-agent:test"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create agent pod: %v", err)
	}
	d.agentCfg = tokenConfig(t, c, d.sa, pod)
	d.unboundCfg = tokenConfig(t, c, d.sa, nil)

	// The policy, its binding and the RBAC objects take effect when the
	// API server's informers see them: probe with dry-run creates until
	// node B's slice is refused by the policy and node A's allowed.
	agent := d.client(t, d.agentCfg)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	inEffect := func() bool {
		_, errB := agent.ResourceV1().ResourceSlices().Create(ctx, testSlice("probe-b", draNodeB, dra.DriverName), dryRun)
		_, errA := agent.ResourceV1().ResourceSlices().Create(ctx, testSlice("probe-a", draNodeA, dra.DriverName), dryRun)
		return d.deniedByPolicy(errB) && errA == nil
	}
	for deadline := time.Now().Add(30 * time.Second); !inEffect(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy and RBAC for ResourceSlices not in effect after 30s")
		}
	}
	return d
}

func (d *draCluster) client(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cl, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func (d *draCluster) deniedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+d.policyName+"'")
}

// nodeSlices lists node's ResourceSlices of driver, by name.
func (d *draCluster) nodeSlices(t *testing.T, node, driver string) []resourcev1.ResourceSlice {
	t.Helper()
	list, err := d.admin.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{FieldSelector: fields.Set{
		resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: driver,
	}.AsSelector().String()})
	if err != nil {
		t.Fatalf("list slices: %v", err)
	}
	out := list.Items
	slices.SortFunc(out, func(a, b resourcev1.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// testSlice is a one-device slice of node's pool of driver.
func testSlice(name, node, driver string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, NodeName: new(node),
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}},
		},
	}
}

// sliceRequests counts the completed method requests on ResourceSlices.
func (c *apiCounter) sliceRequests(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.requests {
		m, path, _ := strings.Cut(k, " ")
		if m == method && strings.HasPrefix(path, slicesPath) {
			n += v
		}
	}
	return n
}

// sliceWrites are the ResourceSlice creates, updates and deletes counted.
func (c *apiCounter) sliceWrites() (creates, updates, deletes int) {
	return c.sliceRequests(http.MethodPost), c.sliceRequests(http.MethodPut), c.sliceRequests(http.MethodDelete)
}

// runPublisher runs the agent's DRA kubelet plugin of node A on clients
// (its sockets in a kubelet directory of its own, no kubelet) until the
// returned stop is called (or the test ends); its SetDevices publishes
// through k8s.io/dynamic-resource-allocation's ResourceSlice controller.
func runPublisher(t *testing.T, clients kubeapi.Clients) (*dra.KubeletPlugin, func()) {
	t.Helper()
	prep, err := dra.NewPreparer(dra.PreparerConfig{NodeName: draNodeA, StateDir: t.TempDir(), CDIDir: t.TempDir(),
		Inventory: func() dra.Inventory { return dra.Inventory{} }})
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are limited to 108 bytes; t.TempDir can be long.
	kd, err := os.MkdirTemp("", "kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(kd) })
	p := dra.NewKubeletPlugin(prep, dra.PluginConfig{KubeletDir: kd, NodeName: draNodeA, Log: discard()})
	if err := p.Start(context.Background(), clients.Core); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(p.Stop) }
	t.Cleanup(stop)
	return p, stop
}

// publish sets devs and waits until the API server stores them (in
// dra.Split's slices, taints compared without the server's TimeAdded).
func (d *draCluster) publish(t *testing.T, p *dra.KubeletPlugin, devs []resourcev1.Device) {
	t.Helper()
	p.SetDevices(devs, nil)
	parts := dra.Split(devs)
	testutil.WaitForWithin(t, time.Minute, "the devices to reach the API server", func() bool {
		stored := d.nodeSlices(t, draNodeA, dra.DriverName)
		if len(stored) != len(parts) {
			return false
		}
		for i, s := range stored {
			if !apiequality.Semantic.DeepEqual(withoutTimeAdded(s.Spec.Devices), parts[i]) {
				return false
			}
		}
		return true
	})
}

// withoutTimeAdded is a copy of devs with the taints' TimeAdded cleared.
func withoutTimeAdded(devs []resourcev1.Device) []resourcev1.Device {
	out := make([]resourcev1.Device, len(devs))
	for i := range devs {
		devs[i].DeepCopyInto(&out[i])
		for k := range out[i].Taints {
			out[i].Taints[k].TimeAdded = nil
		}
	}
	return out
}

// TestResourceSlicesRealAPIServer runs the agent's DRA kubelet plugin
// (the library's helper and ResourceSlice controller) as the agent on
// node A (the chart's RBAC and admission policy, a pod-bound
// token) against a real kube-apiserver, publishing dra.Build's devices of
// a simulated DGX A100 with every GPU in seven MIG devices (56 MIG
// devices and 10 NICs: two slices). Every ResourceSlice request is
// counted at the transport: the first publish creates the two slices;
// repeated equal Sets write nothing; a device taint appearing and going
// updates exactly the slice holding the device; a new publisher (an agent
// restart) over the stored slices writes nothing; and what the API server
// stores reads back semantically equal to what dra.Build produced.
func TestResourceSlicesRealAPIServer(t *testing.T) {
	t.Parallel()
	d := startDRACluster(t)

	var opts []sim.ProfileOption
	for i := range 8 {
		opts = append(opts, sim.WithMIG(i, slices.Repeat([]string{"1g.5gb"}, 7)...))
	}
	spec, err := sim.Profile("dgx-a100", opts...)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	node, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	model := node.Spec()
	build := func(unhealthy map[string]dra.Fault) []resourcev1.Device {
		t.Helper()
		res, err := dra.Build(model, dra.Options{PCIeRoot: dra.SysfsPCIeRoot(root), Unhealthy: unhealthy})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Unread) > 0 {
			t.Fatalf("unread attributes on a simulated node: %v", res.Unread)
		}
		return res.Devices
	}
	healthy := build(nil)
	if len(healthy) != 66 || len(dra.Split(healthy)) != 2 {
		t.Fatalf("%d devices in %d slices, want 66 in 2", len(healthy), len(dra.Split(healthy)))
	}

	counter := newAPICounter()
	p, stop := runPublisher(t, countedClients(t, d.agentCfg, counter))
	expectWrites := func(step string, creates, updates, deletes int) {
		t.Helper()
		counter.settle(t)
		c, u, del := counter.sliceWrites()
		writes, _, summary := counter.counts()
		t.Logf("%s: %d creates, %d updates, %d deletes of ResourceSlices (%s)", step, c, u, del, summary)
		if c != creates || u != updates || del != deletes || writes != c+u+del {
			t.Errorf("%s: %d creates, %d updates, %d deletes of ResourceSlices and %d writes in all; want %d, %d, %d and nothing else",
				step, c, u, del, writes, creates, updates, deletes)
		}
		if n := counter.statusCount(http.StatusForbidden); n != 0 {
			t.Errorf("%s: %d requests refused (403) for the agent's identity", step, n)
		}
	}
	// readBack checks the stored slices against want: two slices of one
	// complete pool of generation gen, owned by node A, holding want's
	// devices in order; taints compared without TimeAdded, which the API
	// server set. It returns the slices.
	readBack := func(step string, want []resourcev1.Device, gen int64) []resourcev1.ResourceSlice {
		t.Helper()
		stored := d.nodeSlices(t, draNodeA, dra.DriverName)
		parts := dra.Split(want)
		if len(stored) != len(parts) {
			t.Fatalf("%s: %d slices stored, want %d", step, len(stored), len(parts))
		}
		for i, s := range stored {
			if s.Spec.Pool.Name != draNodeA || s.Spec.Pool.Generation != gen || s.Spec.Pool.ResourceSliceCount != int64(len(parts)) {
				t.Errorf("%s: slice %s pool %+v, want %s generation %d of %d slices", step, s.Name, s.Spec.Pool, draNodeA, gen, len(parts))
			}
			if s.Spec.NodeName == nil || *s.Spec.NodeName != draNodeA || s.Spec.Driver != dra.DriverName {
				t.Errorf("%s: slice %s node %v driver %s", step, s.Name, s.Spec.NodeName, s.Spec.Driver)
			}
			if refs := s.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].Name != draNodeA ||
				refs[0].UID != d.nodeA.UID || refs[0].Controller == nil || !*refs[0].Controller {
				t.Errorf("%s: slice %s owner references %+v, want node %s (%s) as controller", step, s.Name, refs, draNodeA, d.nodeA.UID)
			}
			got := make([]resourcev1.Device, len(s.Spec.Devices))
			for j := range s.Spec.Devices {
				s.Spec.Devices[j].DeepCopyInto(&got[j])
				for k := range got[j].Taints {
					if got[j].Taints[k].TimeAdded == nil {
						t.Errorf("%s: device %s taint %s without the server's TimeAdded", step, got[j].Name, got[j].Taints[k].Key)
					}
					got[j].Taints[k].TimeAdded = nil
				}
			}
			if !apiequality.Semantic.DeepEqual(got, parts[i]) {
				t.Errorf("%s: slice %d (%s) stores devices other than dra.Build's", step, i, s.Name)
				for j := range min(len(got), len(parts[i])) {
					if !apiequality.Semantic.DeepEqual(got[j], parts[i][j]) {
						t.Logf("first differing device:\nstored %+v\nbuilt  %+v", got[j], parts[i][j])
						break
					}
				}
			}
		}
		return stored
	}

	// First publish: two creates, generation 1.
	d.publish(t, p, healthy)
	expectWrites("first publish", 2, 0, 0)
	first := readBack("first publish", healthy, 1)

	// Equal Sets, each waited for, write nothing.
	counter.reset()
	const equalSets = 20
	for range equalSets {
		d.publish(t, p, build(nil))
	}
	expectWrites("20 equal Sets", 0, 0, 0)

	// A NIC of the second slice (the first holds 64 devices: the 56 MIG
	// devices and 8 NICs) goes unhealthy: one update of that slice, the
	// generation kept, the other slice untouched.
	victim := healthy[len(healthy)-1]
	var victimID string
	for _, nic := range model.NICs {
		if dra.NICName(nic.Name) == victim.Name {
			victimID = nic.Name
		}
	}
	if victimID == "" {
		t.Fatalf("no NIC named %s in the model", victim.Name)
	}
	tainted := build(map[string]dra.Fault{victimID: {Cause: "xid-79"}})
	counter.reset()
	d.publish(t, p, tainted)
	expectWrites("taint added", 0, 1, 0)
	if n := counter.requestCount(http.MethodPut, slicesPath+"/"+first[1].Name); n != 1 {
		t.Errorf("taint added: %d updates of slice %s, which holds %s; want 1", n, first[1].Name, victim.Name)
	}
	second := readBack("taint added", tainted, 1)
	if second[0].ResourceVersion != first[0].ResourceVersion || second[0].Name != first[0].Name || second[1].Name != first[1].Name {
		t.Errorf("taint added: slice %s rewritten (resourceVersion %s -> %s) or slices renamed", first[0].Name, first[0].ResourceVersion, second[0].ResourceVersion)
	}
	var taint *resourcev1.DeviceTaint
	for _, dev := range second[1].Spec.Devices {
		if dev.Name == victim.Name && len(dev.Taints) == 1 {
			taint = &dev.Taints[0]
		}
	}
	if taint == nil || taint.Key != dra.TaintKey || taint.Value != "xid-79" || taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
		t.Errorf("device %s taint %+v, want %s=xid-79:NoSchedule", victim.Name, taint, dra.TaintKey)
	}

	// The same fault again writes nothing, though the stored taint has a
	// TimeAdded the built one lacks.
	counter.reset()
	for range 5 {
		d.publish(t, p, build(map[string]dra.Fault{victimID: {Cause: "xid-79"}}))
	}
	expectWrites("same fault again", 0, 0, 0)

	// Recovery: one update of the same slice.
	counter.reset()
	d.publish(t, p, healthy)
	expectWrites("taint removed", 0, 1, 0)
	if n := counter.requestCount(http.MethodPut, slicesPath+"/"+first[1].Name); n != 1 {
		t.Errorf("taint removed: %d updates of slice %s; want 1", n, first[1].Name)
	}
	before := readBack("taint removed", healthy, 1)

	// Restart: a new publisher with a new client over identical slices
	// adopts them and writes nothing.
	stop()
	counter2 := newAPICounter()
	p2, _ := runPublisher(t, countedClients(t, d.agentCfg, counter2))
	d.publish(t, p2, build(nil))
	counter = counter2
	expectWrites("restart over identical slices", 0, 0, 0)
	after := readBack("restart", healthy, 1)
	for i := range after {
		if after[i].Name != before[i].Name || after[i].ResourceVersion != before[i].ResourceVersion {
			t.Errorf("restart: slice %s (resourceVersion %s) is now %s (%s)", before[i].Name, before[i].ResourceVersion, after[i].Name, after[i].ResourceVersion)
		}
	}
}

// TestAdmissionPolicyResourceSlices applies the chart (dra.enabled) to a
// real kube-apiserver and acts with the agent's credential for node A:
// it may create, update and delete node A's slices of its own driver; the
// admission policy refuses a slice of node B, one of another driver (on
// create, update and delete), one for all nodes, and any slice write with
// a token that names no node. RBAC lets it get a ResourceClaim but not
// list, update or delete claims.
func TestAdmissionPolicyResourceSlices(t *testing.T) {
	t.Parallel()
	d := startDRACluster(t)
	ctx := t.Context()
	agent := d.client(t, d.agentCfg)
	unbound := d.client(t, d.unboundCfg)
	admin := d.admin

	// Slices others own, created by the administrator.
	for _, s := range []*resourcev1.ResourceSlice{
		testSlice("b-ours", draNodeB, dra.DriverName),
		testSlice("a-other-driver", draNodeA, otherDriver),
		testSlice("a-ours-kept", draNodeA, dra.DriverName),
	} {
		if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create slice %s: %v", s.Name, err)
		}
	}

	create := func(s *resourcev1.ResourceSlice) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			_, err := cl.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
			return err
		}
	}
	// update re-reads name as the administrator and writes it back with
	// change applied.
	update := func(name string, change func(*resourcev1.ResourceSlice)) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			s, err := admin.ResourceV1().ResourceSlices().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(s)
			_, err = cl.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{})
			return err
		}
	}
	del := func(name string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			return cl.ResourceV1().ResourceSlices().Delete(ctx, name, metav1.DeleteOptions{})
		}
	}
	addDevice := func(s *resourcev1.ResourceSlice) {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "gpu-1"})
	}
	allNodes := testSlice("a-all-nodes", draNodeA, dra.DriverName)
	allNodes.Spec.NodeName, allNodes.Spec.AllNodes = nil, new(true)

	const sliceDeny = "may only create, update or delete ResourceSlices of driver " + dra.DriverName + " for that node"
	tests := []struct {
		name   string
		client kubernetes.Interface
		do     func(kubernetes.Interface) error
		// deny is empty when the request must be allowed, else a part of
		// the policy's message refusing it.
		deny string
	}{
		{"create own node's slice", agent, create(testSlice("a-ours", draNodeA, dra.DriverName)), ""},
		{"update own node's slice", agent, update("a-ours", addDevice), ""},
		{"delete own node's slice", agent, del("a-ours"), ""},
		{"create node B's slice", agent, create(testSlice("b-new", draNodeB, dra.DriverName)), sliceDeny},
		{"update node B's slice", agent, update("b-ours", addDevice), sliceDeny},
		{"delete node B's slice", agent, del("b-ours"), sliceDeny},
		{"create another driver's slice on own node", agent, create(testSlice("a-other-new", draNodeA, otherDriver)), sliceDeny},
		{"update another driver's slice on own node", agent, update("a-other-driver", addDevice), sliceDeny},
		{"delete another driver's slice on own node", agent, del("a-other-driver"), sliceDeny},
		{"create a slice for all nodes", agent, create(allNodes), sliceDeny},
		{"token without node binding", unbound, create(testSlice("a-unbound", draNodeA, dra.DriverName)), "this credential names no node"},
		{"admin unaffected", admin, update("a-other-driver", addDevice), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do(tt.client)
			switch {
			case tt.deny == "" && err != nil:
				t.Errorf("refused, want allowed: %v", err)
			case tt.deny != "" && err == nil:
				t.Errorf("allowed, want refused by the policy (%q)", tt.deny)
			case tt.deny != "" && (!d.deniedByPolicy(err) || !strings.Contains(err.Error(), tt.deny)):
				t.Errorf("err %v, want Forbidden by %s with %q", err, d.policyName, tt.deny)
			}
		})
	}

	// Moving a slice to another node is refused before the policy runs:
	// the API server's validation makes spec.nodeName immutable.
	err := update("a-ours-kept", func(s *resourcev1.ResourceSlice) { s.Spec.NodeName = new(draNodeB) })(agent)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.nodeName") {
		t.Errorf("moving own slice to node B: %v, want Invalid (spec.nodeName immutable)", err)
	}

	// What was refused did not land.
	if got := d.nodeSlices(t, draNodeB, dra.DriverName); len(got) != 1 || got[0].Name != "b-ours" || len(got[0].Spec.Devices) != 1 {
		t.Errorf("node B's slices changed: %+v", got)
	}
	if got := d.nodeSlices(t, draNodeA, dra.DriverName); len(got) != 1 || got[0].Name != "a-ours-kept" {
		t.Errorf("node A's slices of %s: %+v, want a-ours-kept only", dra.DriverName, got)
	}
	if got := d.nodeSlices(t, draNodeA, otherDriver); len(got) != 1 || len(got[0].Spec.Devices) != 2 {
		t.Errorf("node A's slices of %s: %+v, want a-other-driver with the admin's second device only", otherDriver, got)
	}

	// RBAC on ResourceClaims: get only.
	claim, err := admin.ResourceV1().ResourceClaims("default").Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu." + dra.DriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim: %v", err)
	}
	got, err := agent.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || got.UID != claim.UID {
		t.Errorf("agent get claim: %v", err)
	}
	// The agent's own client reads claims the same way.
	if got, err := clientsFor(t, d.agentCfg).Core.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{}); err != nil || got.UID != claim.UID {
		t.Errorf("kubeapi get claim: %v", err)
	}
	rbacDenied := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) || d.deniedByPolicy(err) {
			t.Errorf("agent %s: %v, want Forbidden by RBAC", what, err)
		}
	}
	_, err = agent.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	rbacDenied("list claims", err)
	_, err = agent.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	rbacDenied("list claims in all namespaces", err)
	_, err = agent.ResourceV1().ResourceClaims("default").Update(ctx, claim, metav1.UpdateOptions{})
	rbacDenied("update claim", err)
	_, err = agent.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	rbacDenied("update claim status", err)
	rbacDenied("delete claim", agent.ResourceV1().ResourceClaims("default").Delete(ctx, claim.Name, metav1.DeleteOptions{}))
	rbacDenied("delete every slice", agent.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	_, err = agent.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, metav1.CreateOptions{})
	rbacDenied("create DeviceClass", err)

}

// TestOnDemandSlicesRealAPIServer publishes, as the agent on node A,
// dra.Build's partitionable devices of a simulated DGX H100 with every GPU
// in MIG mode and no MIG device (dra.migOnDemand: a counter set per GPU,
// a device per placement consuming it): the real API server's validation
// (and the chart's admission policy) accepts the counter slice and the
// device slices and stores them as built, one create each.
func TestOnDemandSlicesRealAPIServer(t *testing.T) {
	t.Parallel()
	d := startDRACluster(t)
	var opts []sim.ProfileOption
	for i := range 8 {
		opts = append(opts, sim.WithMIG(i))
	}
	spec, err := sim.Profile("dgx-h100", opts...)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	node, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := nvmlowner.New(node.NVML(), nvmlowner.Config{}, nil)
	if err := o.Init(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Shutdown(context.Background()) })
	x := nvmlowner.NewDiscoverer(o, root, nil)
	x.SetOptions(nvmlowner.DiscoverOptions{MIGProfiles: true})
	model, err := x.Discover(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := dra.Build(model, dra.Options{PCIeRoot: dra.SysfsPCIeRoot(root), OnDemandMIG: true})
	if err != nil {
		t.Fatal(err)
	}
	parts := dra.Split(res.Devices)
	if len(res.CounterSets) != 8 || len(parts) < 2 {
		t.Fatalf("%d counter sets and %d device slices, want 8 sets and the placements in several slices", len(res.CounterSets), len(parts))
	}
	counter := newAPICounter()
	p, _ := runPublisher(t, countedClients(t, d.agentCfg, counter))
	p.SetDevices(res.Devices, res.CounterSets)
	var stored []resourcev1.ResourceSlice
	testutil.WaitForWithin(t, time.Minute, "the counter and device slices to reach the API server", func() bool {
		stored = d.nodeSlices(t, draNodeA, dra.DriverName)
		return len(stored) == 1+len(parts)
	})
	var sets []resourcev1.CounterSet
	var devs []resourcev1.Device
	for _, s := range stored {
		if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
			t.Errorf("slice %s holds counters and devices", s.Name)
		}
		sets = append(sets, s.Spec.SharedCounters...)
		devs = append(devs, s.Spec.Devices...)
	}
	slices.SortFunc(sets, func(a, b resourcev1.CounterSet) int { return strings.Compare(a.Name, b.Name) })
	want := slices.Clone(res.CounterSets)
	slices.SortFunc(want, func(a, b resourcev1.CounterSet) int { return strings.Compare(a.Name, b.Name) })
	if !apiequality.Semantic.DeepEqual(sets, want) {
		t.Errorf("stored counter sets differ from dra.Build's:\nstored %+v\nbuilt  %+v", sets, want)
	}
	byName := map[string]resourcev1.Device{}
	for _, dev := range devs {
		byName[dev.Name] = dev
	}
	for _, dev := range res.Devices {
		if got, ok := byName[dev.Name]; !ok || !apiequality.Semantic.DeepEqual(got, dev) {
			t.Errorf("device %s stored as %+v, built as %+v", dev.Name, got, dev)
			break
		}
	}
	counter.settle(t)
	c, u, del := counter.sliceWrites()
	t.Logf("%d counter sets and %d placement devices in %d slices: %d creates, %d updates, %d deletes", len(sets), len(devs), len(stored), c, u, del)
	if c != 1+len(parts) || u != 0 || del != 0 {
		t.Errorf("first publish: %d creates, %d updates, %d deletes; want %d creates", c, u, del, 1+len(parts))
	}
}

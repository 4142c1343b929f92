package apiserver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// manifestsDir holds the static manifests rendered from the Helm chart
// (`make manifests`); the admission test applies what ships.
const manifestsDir = "../../deploy/manifests"

// Names the rendered manifests and the agent's defaults use.
const (
	agentNamespace  = "kube-system"
	conditionType   = "GPUHealthy"
	eventNamespace  = "default"
	slotLeasePrefix = "gpu-node-agent-taint-slot-"
	agentTaintKey   = "gpu-node-agent.io/unhealthy"
	preflightKey    = "gpu-node-agent.io/preflight"
	preflightType   = "GPUPreflight"
	nodeNameExtra   = "authentication.kubernetes.io/node-name"
)

// readManifests decodes every object in the named files of deploy/manifests.
// goldenMixed is the agent's label set on a simulated DGX H100 with the
// demo MIG layout under mig-strategy mixed (the most labels of any
// golden file), from the root module's label tests.
const goldenMixed = "../../nvmlowner/testdata/labels/dgx-h100-mig-mixed.labels"

// goldenLabels reads a golden label file ("key=value" lines, "#"
// comments) as key, value pairs.
func goldenLabels(t *testing.T, path string) []string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kv []string
	for _, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not key=value", path, line)
		}
		kv = append(kv, k, v)
	}
	if len(kv) < 2*50 {
		t.Fatalf("%s: %d labels, want the full mixed-strategy set", path, len(kv)/2)
	}
	return kv
}

func readManifests(t *testing.T, files ...string) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(manifestsDir, f))
		if err != nil {
			t.Fatalf("read manifest: %v", err)
		}
		for _, doc := range strings.Split(string(text), "\n---\n") {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("decode %s: %v\n%s", f, err, doc)
			}
			out = append(out, obj)
		}
	}
	return out
}

// apply creates the manifests' objects as an administrator would.
func apply(t *testing.T, c kubernetes.Interface, objs []runtime.Object) {
	t.Helper()
	ctx := t.Context()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected manifest object %T", o)
		}
		if err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

// tokenClient returns a client authenticating with a token of the service
// account sa, bound to pod when pod is not nil.
func tokenClient(t *testing.T, c *cluster.Cluster, sa *corev1.ServiceAccount, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	client, err := kubernetes.NewForConfig(tokenConfig(t, c, sa, pod))
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// tokenConfig is tokenClient's client configuration (for the agent's own
// kubeapi clients).
func tokenConfig(t *testing.T, c *cluster.Cluster, sa *corev1.ServiceAccount, pod *corev1.Pod) *rest.Config {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := c.Client.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(t.Context(), sa.Name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request: %v", err)
	}
	cfg := rest.AnonymousClientConfig(c.RESTConfig)
	cfg.BearerToken = tok.Status.Token
	return cfg
}

// whoAmI returns the user info the API server authenticates client as.
func whoAmI(t *testing.T, client kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("self subject review: %v", err)
	}
	return r.Status.UserInfo
}

func mergePatch(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAdmissionPolicyNodeScoped applies the chart's rendered service
// account, RBAC and ValidatingAdmissionPolicy to a real kube-apiserver and
// acts with the agent's credential for node A: a service-account token
// bound to a Pod on A, which carries A's name as the node-name extra. Its
// writes to its own taints (health and preflight), conditions (the same),
// labels, annotations, Events and slot Leases are allowed; anything else
// on A, anything on node B, and any write with a token that names no node
// is refused by the policy. Other users are unaffected.
func TestAdmissionPolicyNodeScoped(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	ctx := t.Context()
	admin := c.Client

	objs := readManifests(t, "serviceaccount.yaml", "rbac.yaml", "validatingadmissionpolicy.yaml")
	var sa *corev1.ServiceAccount
	var policyName string
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			policyName = o.Name
		}
	}
	if sa == nil || sa.Namespace != agentNamespace || policyName == "" {
		t.Fatalf("manifests lack the service account in %s or the policy", agentNamespace)
	}
	apply(t, admin, objs)
	// The chart grants core Events only; grant events.k8s.io too, as a
	// wider role might, to see the policy still hold for them.
	widened := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "widened-events"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}}}}
	apply(t, admin, []runtime.Object{widened, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: widened.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: widened.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}})

	const nodeA, nodeB = "gpu-a", "gpu-b"
	otherTaint := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	for _, name := range []string{nodeA, nodeB} {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels:      map[string]string{"example.com/team": "ml", "nvidia.com/gpu.present": "true"},
				Annotations: map[string]string{"example.com/note": "rack 7", "gpu-node-agent.io/clear-faults": "all"},
			},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{otherTaint}},
		}
		n, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		// A kubelet's status: a Ready condition and capacity.
		n.Status = corev1.NodeStatus{
			Capacity:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("node %s status: %v", name, err)
		}
	}
	pod, err := admin.CoreV1().Pods(sa.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-agent-a"},
		Spec: corev1.PodSpec{
			NodeName: nodeA, ServiceAccountName: sa.Name,
			Containers: []corev1.Container{{Name: "agent", Image: "gpu-node-agent:test"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create agent pod: %v", err)
	}
	for _, l := range []*coordinationv1.Lease{
		{ObjectMeta: metav1.ObjectMeta{Name: slotLeasePrefix + "mine"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: new(nodeA)}},
		{ObjectMeta: metav1.ObjectMeta{Name: slotLeasePrefix + "b"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: new(nodeB)}},
	} {
		if _, err := admin.CoordinationV1().Leases(sa.Namespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create lease %s: %v", l.Name, err)
		}
	}

	agent := tokenClient(t, c, sa, pod)
	unbound := tokenClient(t, c, sa, nil)
	username := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	if u := whoAmI(t, agent); u.Username != username || len(u.Extra[nodeNameExtra]) != 1 || u.Extra[nodeNameExtra][0] != nodeA {
		t.Fatalf("pod-bound token authenticates as %+v; want %s with %s=[%s] (ServiceAccountTokenPodNodeInfo)", u, username, nodeNameExtra, nodeA)
	}
	if u := whoAmI(t, unbound); u.Username != username || len(u.Extra[nodeNameExtra]) != 0 {
		t.Fatalf("unbound token authenticates as %+v; want %s without %s", u, username, nodeNameExtra)
	}

	denied := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policyName+"'")
	}
	// The policy, its binding and the RBAC objects take effect when the
	// API server's informers see them: probe with dry-run writes (admitted
	// like real ones, never persisted) until the agent is refused node B
	// by the policy and allowed its own labels, slot Lease and Events.
	dryRun := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	probeLabel := mergePatch(t, map[string]any{"metadata": map[string]any{"labels": map[string]any{"gpu-node-agent.io/probe": "x"}}})
	inEffect := func() bool {
		_, errB := agent.CoreV1().Nodes().Patch(ctx, nodeB, types.MergePatchType, probeLabel, dryRun)
		_, errA := agent.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, probeLabel, dryRun)
		_, errL := agent.CoordinationV1().Leases(sa.Namespace).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: slotLeasePrefix + "probe"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: new(nodeA)},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		_, errE := agent.EventsV1().Events(eventNamespace).Create(ctx, &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: nodeA + ".probe"},
			EventTime:  metav1.NowMicro(), ReportingController: "gpu-node-agent.io/health", ReportingInstance: nodeA,
			Action: "Probe", Reason: "Probe", Type: corev1.EventTypeNormal,
			Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeA},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return denied(errB) && errA == nil && errL == nil && errE == nil
	}
	for deadline := time.Now().Add(30 * time.Second); !inEffect(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy and RBAC not in effect after 30s")
		}
	}

	// taints patches node's taints as the tainter does: the whole list,
	// with the taints others put there (the test's, and the API server's
	// node.kubernetes.io/not-ready) kept, less drop's.
	taints := func(node, drop string, add ...corev1.Taint) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("test setup: %w", err)
			}
			var want []corev1.Taint
			for _, tn := range n.Spec.Taints {
				if tn.Key != drop {
					want = append(want, tn)
				}
			}
			body := mergePatch(t, map[string]any{
				"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
				"spec":     map[string]any{"taints": append(want, add...)},
			})
			_, err = cl.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}
	}
	ours := corev1.Taint{Key: agentTaintKey, Effect: corev1.TaintEffectNoSchedule}
	preflight := corev1.Taint{Key: preflightKey, Value: "pending", Effect: corev1.TaintEffectNoSchedule}
	labels := func(kv ...string) []byte {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return mergePatch(t, map[string]any{"metadata": map[string]any{"labels": m}})
	}
	annotations := func(k string, v any) []byte {
		return mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}})
	}
	condition := func(typ corev1.NodeConditionType) []byte {
		// The tainter's strategic merge patch on nodes/status.
		return mergePatch(t, map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
			Type: typ, Status: corev1.ConditionTrue, Reason: "AllGPUsHealthy", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}}})
	}
	patchNode := func(node string, pt types.PatchType, body []byte, sub ...string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			_, err := cl.CoreV1().Nodes().Patch(ctx, node, pt, body, metav1.PatchOptions{}, sub...)
			return err
		}
	}
	// event posts a Node event as the tainter does (core v1, the
	// kubelet's style, which must be in namespace default).
	event := func(node string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			now := metav1.Now()
			_, err := cl.CoreV1().Events(eventNamespace).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", node, now.UnixNano())},
				InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
				Reason:         "GPUUnhealthy", Message: "GPU 0 lost", Type: corev1.EventTypeWarning,
				Source:         corev1.EventSource{Component: "gpu-node-agent", Host: node},
				FirstTimestamp: now, LastTimestamp: now, Count: 1,
			}, metav1.CreateOptions{})
			return err
		}
	}
	// eventsV1 posts a Node event through events.k8s.io/v1, which may be
	// in any namespace: the policy sees it converted to core v1.
	eventsV1 := func(ns, node string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			now := metav1.NowMicro()
			_, err := cl.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", node, now.UnixNano())},
				EventTime:  now, ReportingController: "gpu-node-agent.io/health", ReportingInstance: node,
				Action: "Taint", Reason: "GPUUnhealthy", Note: "GPU 0 lost", Type: corev1.EventTypeWarning,
				Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
			}, metav1.CreateOptions{})
			return err
		}
	}
	createLease := func(name, holder string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			_, err := cl.CoordinationV1().Leases(sa.Namespace).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: new(holder), LeaseDurationSeconds: new(int32(60)), AcquireTime: new(metav1.NewMicroTime(time.Now()))},
			}, metav1.CreateOptions{})
			return err
		}
	}
	renewLease := func(name, holder string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			l, err := admin.CoordinationV1().Leases(sa.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("test setup: %w", err)
			}
			l.Spec.HolderIdentity, l.Spec.RenewTime = new(holder), new(metav1.NewMicroTime(time.Now()))
			_, err = cl.CoordinationV1().Leases(sa.Namespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		}
	}
	deleteLease := func(name string) func(kubernetes.Interface) error {
		return func(cl kubernetes.Interface) error {
			return cl.CoordinationV1().Leases(sa.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		}
	}

	tests := []struct {
		name   string
		client kubernetes.Interface
		do     func(kubernetes.Interface) error
		// deny is empty when the request must be allowed, else a part of
		// the policy's message refusing it.
		deny string
	}{
		{"own taint", agent, taints(nodeA, "", ours), ""},
		{"own preflight taint", agent, taints(nodeA, "", preflight), ""},
		{"node B's preflight taint", agent, taints(nodeB, "", preflight), "may only update its own Node, not UPDATE Node gpu-b"},
		{"remove own preflight taint", agent, taints(nodeA, preflightKey), ""},
		{"node B's taint", agent, taints(nodeB, "", ours), "may only update its own Node, not UPDATE Node gpu-b"},
		{"own node, other taint key", agent, taints(nodeA, "", corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoSchedule}), "may only change taints with key " + agentTaintKey + " or " + preflightKey},
		{"own node, remove another's taint", agent, taints(nodeA, otherTaint.Key), "may only change taints with key"},
		{"own node, unschedulable", agent, patchNode(nodeA, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`)), "may change no Node spec field"},
		{"own node, unrelated label", agent, patchNode(nodeA, types.MergePatchType, labels("example.com/team", "infra")), "labels it does not own: example.com/team"},
		{"own node, GFD presence label", agent, patchNode(nodeA, types.MergePatchType, labels("nvidia.com/gpu.present", "false")), "labels it does not own: nvidia.com/gpu.present"},
		{"own GFD and agent labels", agent, patchNode(nodeA, types.MergePatchType, labels(
			"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count", "8", "nvidia.com/mig-1g.10gb.count", "7",
			"gpu-node-agent.io/nvlink", "true", "gpu-node-agent.io/owned-labels", "x")), ""},
		{"every label the agent writes on a DGX H100 with MIG (golden file)", agent, patchNode(nodeA, types.MergePatchType, labels(goldenLabels(t, goldenMixed)...)), ""},
		{"own multi-node NVLink clique label", agent, patchNode(nodeA, types.MergePatchType, labels("nvidia.com/gpu.clique", "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90.7")), ""},
		{"own node, GPU operator's deploy label", agent, patchNode(nodeA, types.MergePatchType, labels("nvidia.com/gpu.deploy.driver", "false")), "labels it does not own: nvidia.com/gpu.deploy.driver"},
		{"node B's GFD label", agent, patchNode(nodeB, types.MergePatchType, labels("nvidia.com/gpu.product", "x")), "may only update its own Node"},
		{"own annotation", agent, patchNode(nodeA, types.MergePatchType, annotations("gpu-node-agent.io/nics", `{"mlx5_0":{"numaNode":0}}`)), ""},
		{"own node, unrelated annotation", agent, patchNode(nodeA, types.MergePatchType, annotations("example.com/note", nil)), "annotations it does not own: example.com/note"},
		{"own move advice", agent, patchNode(nodeA, types.MergePatchType, annotations("gpu-node-agent.io/move-advice",
			`{"blockNow":6,"blockIfMoved":8,"wholeNode":true,"gpus":[0,1,2,3,4,5,6,7],"pods":[{"namespace":"ml","name":"a","priority":0,"ownerKind":"Job","gpus":[3]}]}`)), ""},
		{"node B's move advice", agent, patchNode(nodeB, types.MergePatchType, annotations("gpu-node-agent.io/move-advice", `{}`)), "may only update its own Node"},
		{"read a pod the move advice names", agent, func(cl kubernetes.Interface) error {
			_, err := cl.CoreV1().Pods(sa.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return err
		}, ""},
		{"remove clear-faults", agent, patchNode(nodeA, types.JSONPatchType, []byte(`[{"op":"test","path":"/metadata/annotations/gpu-node-agent.io~1clear-faults","value":"all"},{"op":"remove","path":"/metadata/annotations/gpu-node-agent.io~1clear-faults"}]`)), ""},
		{"own condition", agent, patchNode(nodeA, types.StrategicMergePatchType, condition(conditionType), "status"), ""},
		{"own preflight condition", agent, patchNode(nodeA, types.StrategicMergePatchType, condition(preflightType), "status"), ""},
		{"own node, another condition", agent, patchNode(nodeA, types.StrategicMergePatchType, condition(corev1.NodeReady), "status"), "may only change the Node conditions " + conditionType + " and " + preflightType},
		{"node B's preflight condition", agent, patchNode(nodeB, types.StrategicMergePatchType, condition(preflightType), "status"), "may only update its own Node"},
		{"own node, capacity", agent, patchNode(nodeA, types.MergePatchType, []byte(`{"status":{"capacity":{"cpu":"16"}}}`), "status"), "may change no Node status field"},
		{"node B's condition", agent, patchNode(nodeB, types.StrategicMergePatchType, condition(conditionType), "status"), "may only update its own Node"},
		{"event for own node", agent, event(nodeA), ""},
		{"event for node B", agent, event(nodeB), "may only create or update Events about that Node"},
		{"events.k8s.io event for node B", agent, eventsV1(eventNamespace, nodeB), "may only create or update Events about that Node"},
		{"events.k8s.io event for own node elsewhere", agent, eventsV1(sa.Namespace, nodeA), "may only create or update Events about that Node in namespace " + eventNamespace},
		{"slot lease held by self", agent, createLease(slotLeasePrefix+"0", nodeA), ""},
		{"slot lease held by B", agent, createLease(slotLeasePrefix+"1", nodeB), "Leases in namespace kube-system held by itself"},
		{"lease outside the slot prefix", agent, createLease("other-lease", nodeA), "may only create, update or delete gpu-node-agent-taint-slot-* Leases"},
		{"renew own slot lease", agent, renewLease(slotLeasePrefix+"mine", nodeA), ""},
		{"hand own slot lease to B", agent, renewLease(slotLeasePrefix+"mine", nodeB), "held by itself"},
		{"delete B's slot lease", agent, deleteLease(slotLeasePrefix + "b"), "held by itself"},
		{"delete own slot lease", agent, deleteLease(slotLeasePrefix + "mine"), ""},
		{"token without node binding", unbound, taints(nodeA, agentTaintKey, ours), "this credential names no node"},
		{"token without node binding, event", unbound, event(nodeA), "this credential names no node"},
		{"admin unaffected", admin, patchNode(nodeA, types.MergePatchType, labels("example.com/team", "infra")), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do(tt.client)
			switch {
			case tt.deny == "" && err != nil:
				t.Errorf("refused, want allowed: %v", err)
			case tt.deny != "" && err == nil:
				t.Errorf("allowed, want refused by the policy (%q)", tt.deny)
			case tt.deny != "" && (!denied(err) || !strings.Contains(err.Error(), tt.deny)):
				t.Errorf("err %v, want Forbidden by %s with %q", err, policyName, tt.deny)
			}
		})
	}

	// What was allowed landed; what was refused did not.
	a, err := admin.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.Spec.Taints); n != 3 || a.Spec.Taints[0] != otherTaint || a.Spec.Taints[n-1] != ours {
		t.Errorf("node A taints %+v, want %s and not-ready kept and %s added", a.Spec.Taints, otherTaint.Key, agentTaintKey)
	}
	if a.Labels["nvidia.com/gpu.present"] != "true" || a.Annotations["example.com/note"] != "rack 7" || a.Annotations["gpu-node-agent.io/clear-faults"] != "" ||
		!strings.Contains(a.Annotations["gpu-node-agent.io/move-advice"], `"blockIfMoved":8`) {
		t.Errorf("node A metadata %v %v", a.Labels, a.Annotations)
	}
	conds := map[corev1.NodeConditionType]string{}
	for _, cond := range a.Status.Conditions {
		conds[cond.Type] = cond.Reason
	}
	if len(conds) != 3 || conds[corev1.NodeReady] != "KubeletReady" || conds[conditionType] != "AllGPUsHealthy" || conds[preflightType] != "AllGPUsHealthy" {
		t.Errorf("node A conditions %+v, want Ready untouched and %s and %s added", a.Status.Conditions, conditionType, preflightType)
	}
	b, err := admin.CoreV1().Nodes().Get(ctx, nodeB, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Spec.Taints) != 2 || len(b.Status.Conditions) != 1 || b.Labels["nvidia.com/gpu.product"] != "" || b.Annotations["gpu-node-agent.io/move-advice"] != "" {
		t.Errorf("node B changed: taints %+v conditions %+v labels %v", b.Spec.Taints, b.Status.Conditions, b.Labels)
	}
}

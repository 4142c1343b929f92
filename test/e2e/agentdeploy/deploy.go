// Package agentdeploy installs the agent's Helm chart (deploy/chart) on an
// e2e cluster in simulate mode, rendered with the helm Go library and
// applied with server-side apply, and exposes what tests need to drive it.
package agentdeploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// DemoNode is the simulated node the e2e cluster runs: a DGX H100 with MIG
// on GPUs 0 (3g.40gb+2g.20gb+2x 1g.10gb) and 1 (7x 1g.10gb).
const DemoNode = "dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"

// DemoResources are the resources and device counts DemoNode serves with
// the mixed MIG strategy.
var DemoResources = map[string]int64{
	"nvidia.com/gpu":         6,
	"nvidia.com/mig-3g.40gb": 1,
	"nvidia.com/mig-2g.20gb": 1,
	"nvidia.com/mig-1g.10gb": 9,
}

// DemoRDMA are the RDMA resources Install configures and DemoNode serves:
// its eight ConnectX-7 InfiniBand ports as rdma/ib, one device per port.
var DemoRDMA = map[string]int64{"rdma/ib": 8}

// demoRDMAConfig is the agent's rdma config section that serves DemoRDMA.
var demoRDMAConfig = map[string]any{
	"resources": []any{map[string]any{
		"name":      "ib",
		"mode":      "exclusive",
		"selectors": map[string]any{"linkTypes": []any{"infiniband"}},
	}},
}

// Options customise the install.
type Options struct {
	// Namespace is the release namespace (default "gpu-node-agent").
	Namespace string
	// Release is the release name (default "gna").
	Release string
	// Simulate is the --simulate value (default DemoNode).
	Simulate string
	// Values are merged over the ones Install sets.
	Values map[string]any
	// DRA lists the device kinds ("gpu", "mig", "nic") the agent serves
	// through its DRA driver (chart values dra.enabled, dra.devices): the
	// chart's DeviceClasses, RBAC, config section and kubelet plugin and
	// CDI mounts. Nil: DRA not installed, everything through the device
	// plugin. Empty but not nil: installed with no kind, the step before
	// uninstalling it in which the agent hands its kinds back.
	DRA []string
	// MetricsPort and ControlPort are the agent's metrics port and the
	// simulator's control port on the node; 0 picks a free one.
	MetricsPort, ControlPort int
}

// Agent is an installed agent.
type Agent struct {
	Namespace string
	Release   string
	// DaemonSet is the rendered DaemonSet's name.
	DaemonSet string
	// MetricsPort is the agent's metrics port on the node (host network).
	MetricsPort int
	// Control reaches the simulator's control endpoint on the node.
	Control agentproc.SimControl
	// Objects are the applied objects, "Kind/name".
	Objects []string
	// Options are the options of the install, with the defaults and the
	// ports filled in: a copy changed and passed to Reinstall keeps the
	// rest.
	Options Options

	applied []appliedObject
}

// appliedObject is an object Install applied, enough to delete it.
type appliedObject struct {
	ref       string // "Kind/name"
	gvr       schema.GroupVersionResource
	namespace string
	name      string
}

// Install renders the chart with simulate values and applies it. The agent
// image must already be loaded (Cluster.ImportAgentImage).
func Install(ctx context.Context, c *cluster.Cluster, opts Options) (*Agent, error) {
	if opts.Namespace == "" {
		opts.Namespace = "gpu-node-agent"
	}
	if opts.Release == "" {
		opts.Release = "gna"
	}
	if opts.Simulate == "" {
		opts.Simulate = DemoNode
	}
	var err error
	if opts.MetricsPort == 0 {
		if opts.MetricsPort, err = freeport.Get(); err != nil {
			return nil, err
		}
	}
	if opts.ControlPort == 0 {
		if opts.ControlPort, err = freeport.Get(); err != nil {
			return nil, err
		}
	}
	metricsPort, ctlPort := opts.MetricsPort, opts.ControlPort
	repo, tag, _ := strings.Cut(cluster.AgentImage, ":")
	values := map[string]any{
		"simulate": opts.Simulate,
		// The simulated node's tree lives in the cluster's directory, so
		// it is removed with the cluster.
		"simulateHostRoot": SimHostRoot(c),
		"config":           map[string]any{"rdma": demoRDMAConfig},
		// The test kubelet's pod log directory (its podLogsDir): the GPU
		// process check reads the running pods' UIDs from its names.
		"podLogsDir": filepath.Join(c.Dir, "pod-logs"),
		"image":      map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"metrics":    map[string]any{"port": metricsPort},
		"extraArgs": []any{
			"--sim-control-address=127.0.0.1:" + strconv.Itoa(ctlPort),
		},
		// No kube-proxy runs, so the kubernetes Service's ClusterIP leads
		// nowhere; with host networking the API server is on loopback. The
		// container's own env overrides the service variables.
		"extraEnv": []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": strconv.Itoa(c.APIServerPort)},
		},
	}
	if opts.DRA != nil {
		devices := make([]any, len(opts.DRA))
		for i, k := range opts.DRA {
			devices[i] = k
		}
		values["dra"] = map[string]any{"enabled": true, "devices": devices}
	}
	// CoalesceTables changes its first argument: the caller's Values stay
	// as they were, so Options can be installed again.
	values = chartutil.CoalesceTables(copyValues(opts.Values), values)
	docs, err := Render(opts.Release, opts.Namespace, values)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		Namespace:   opts.Namespace,
		Release:     opts.Release,
		MetricsPort: metricsPort,
		Control:     agentproc.SimControl{Base: "http://127.0.0.1:" + strconv.Itoa(ctlPort)},
		Options:     opts,
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.Namespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", opts.Namespace, err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	// Apply in helm's install order, so the DaemonSet's pods find their
	// ServiceAccount and ConfigMap.
	sort.SliceStable(docs, func(i, j int) bool { return kindOrder(docs[i].GetKind()) < kindOrder(docs[j].GetKind()) })
	for _, obj := range docs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, fmt.Errorf("map %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			if obj.GetNamespace() == "" {
				obj.SetNamespace(opts.Namespace)
			}
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "gna-e2e", Force: &force}); err != nil {
			return nil, fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		a.Objects = append(a.Objects, gvk.Kind+"/"+obj.GetName())
		a.applied = append(a.applied, appliedObject{ref: gvk.Kind + "/" + obj.GetName(), gvr: m.Resource, namespace: obj.GetNamespace(), name: obj.GetName()})
		if gvk.Kind == "DaemonSet" {
			a.DaemonSet = obj.GetName()
		}
	}
	if a.DaemonSet == "" {
		return nil, fmt.Errorf("chart rendered no DaemonSet (objects: %v)", a.Objects)
	}
	return a, nil
}

// copyValues deep-copies a values tree of maps (lists and scalars are
// shared: CoalesceTables replaces them, it does not change them).
func copyValues(v map[string]any) map[string]any {
	if v == nil {
		return map[string]any{}
	}
	out := make(map[string]any, len(v))
	for k, x := range v {
		if m, ok := x.(map[string]any); ok {
			x = copyValues(m)
		}
		out[k] = x
	}
	return out
}

// Reinstall applies the chart again with opts in place of the agent's
// install (its namespace, release and ports are kept, so its Control and
// MetricsPort stay valid), deletes the objects the new render no longer
// has (e.g. the DeviceClasses when DRA is turned off), and, when the
// DaemonSet's pod template changed, waits until its pod was replaced and
// the new one is Ready, which it returns.
func (a *Agent) Reinstall(ctx context.Context, c *cluster.Cluster, opts Options) (*corev1.Pod, error) {
	opts.Namespace, opts.Release = a.Namespace, a.Release
	opts.MetricsPort, opts.ControlPort = a.Options.MetricsPort, a.Options.ControlPort
	old, err := a.Pod(ctx, c)
	if err != nil {
		return nil, err
	}
	before, err := c.Client.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get daemonset: %w", err)
	}
	fresh, err := Install(ctx, c, opts)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	kept := map[string]bool{}
	for _, o := range fresh.applied {
		kept[o.ref] = true
	}
	for _, o := range a.applied {
		if kept[o.ref] {
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(o.gvr)
		if o.namespace != "" {
			ri = dyn.Resource(o.gvr).Namespace(o.namespace)
		}
		if err := ri.Delete(ctx, o.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete %s no longer rendered: %w", o.ref, err)
		}
	}
	*a = *fresh
	after, err := c.Client.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get daemonset: %w", err)
	}
	if after.Generation == before.Generation {
		return a.WaitReady(ctx, c)
	}
	return a.WaitReplaced(ctx, c, old.UID)
}

// WaitReplaced waits until the DaemonSet's only pod is a Ready one other
// than the pod with UID old, and returns it.
func (a *Agent) WaitReplaced(ctx context.Context, c *cluster.Cluster, old types.UID) (*corev1.Pod, error) {
	var last string
	for {
		pod, err := a.WaitReady(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("replacing agent pod %s: %w (last: %s)", old, err, last)
		}
		n, err := a.podCount(ctx, c)
		if err == nil && pod.UID != old && n == 1 {
			return pod, nil
		}
		last = fmt.Sprintf("newest pod %s (uid %s), %d pods, err %v", pod.Name, pod.UID, n, err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agent pod %s not replaced: %w; last: %s", old, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// podCount is the number of the DaemonSet's pods, terminating ones
// included.
func (a *Agent) podCount(ctx context.Context, c *cluster.Cluster) (int, error) {
	ds, err := c.Client.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("get daemonset: %w", err)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return 0, fmt.Errorf("daemonset selector: %w", err)
	}
	pods, err := c.Client.CoreV1().Pods(a.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return 0, fmt.Errorf("list agent pods: %w", err)
	}
	return len(pods.Items), nil
}

// SimHostRoot is the host directory the simulated node writes its sysfs
// and /dev tree to (the chart's simulateHostRoot).
func SimHostRoot(c *cluster.Cluster) string {
	return filepath.Join(c.Dir, "sim-host")
}

// kindOrder ranks kinds as helm installs them (unknown kinds last).
func kindOrder(kind string) int {
	order := []string{"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
		"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
		"PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
		"ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
		"RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
		"ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob"}
	for i, k := range order {
		if k == kind {
			return i
		}
	}
	return len(order)
}

// ChartDir is the chart in the repository.
func ChartDir() string {
	return filepath.Join(cluster.RepoRoot(), "deploy", "chart", "gpu-node-agent")
}

// Render renders the chart with values and returns its objects, in file
// order (NOTES.txt and empty documents left out).
func Render(release, namespace string, values map[string]any) ([]*unstructured.Unstructured, error) {
	ch, err := loader.Load(ChartDir())
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render chart: %w", err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, name := range names {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(files[name])), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decode %s: %w", name, err)
			}
			if len(m) == 0 {
				continue
			}
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out, nil
}

// WaitReady waits until the DaemonSet's pod on the node is Ready and
// returns it.
func (a *Agent) WaitReady(ctx context.Context, c *cluster.Cluster) (*corev1.Pod, error) {
	var last string
	for {
		pod, err := a.Pod(ctx, c)
		if err == nil {
			last = podState(pod)
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && pod.DeletionTimestamp == nil {
					return pod, nil
				}
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agent pod not ready: %w; last: %s", ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Pod returns the DaemonSet's (newest) pod.
func (a *Agent) Pod(ctx context.Context, c *cluster.Cluster) (*corev1.Pod, error) {
	ds, err := c.Client.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.DaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get daemonset: %w", err)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("daemonset selector: %w", err)
	}
	pods, err := c.Client.CoreV1().Pods(a.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list agent pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return nil, fmt.Errorf("daemonset %s has no pod (desired %d, events: %s)", a.DaemonSet, ds.Status.DesiredNumberScheduled, events(ctx, c, a.Namespace))
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		return pods.Items[i].CreationTimestamp.After(pods.Items[j].CreationTimestamp.Time)
	})
	return &pods.Items[0], nil
}

// Logs returns the agent container's log.
func (a *Agent) Logs(ctx context.Context, c *cluster.Cluster) (string, error) {
	pod, err := a.Pod(ctx, c)
	if err != nil {
		return "", err
	}
	raw, err := c.Client.CoreV1().Pods(a.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	return string(raw), err
}

func podState(pod *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s phase=%s", pod.Name, pod.Status.Phase)
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, " %s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, " %s terminated (%s, exit %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		default:
			fmt.Fprintf(&b, " %s running ready=%v restarts=%d", cs.Name, cs.Ready, cs.RestartCount)
		}
	}
	return b.String()
}

func events(ctx context.Context, c *cluster.Cluster, ns string) string {
	evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
	}
	return strings.Join(out, "; ")
}

package chart

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/lint/support"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// root is the repository root (this module lives in test/chart).
const root = "../.."

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := Load(filepath.Join(root, ChartDir))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func render(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	files, err := Render(loadChart(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func decode[T any](t *testing.T, files map[string]string, name string) *T {
	t.Helper()
	text, ok := files[name]
	if !ok {
		t.Fatalf("%s not rendered (have %v)", name, keys(files))
	}
	var v T
	if err := yaml.UnmarshalStrict([]byte(text), &v); err != nil {
		t.Fatalf("decode %s: %v\n%s", name, err, text)
	}
	return &v
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// docs splits a multi-document YAML file.
func docs(text string) []string {
	var out []string
	for _, d := range strings.Split(text, "\n---\n") {
		if strings.TrimSpace(d) != "" {
			out = append(out, d)
		}
	}
	return out
}

func TestLint(t *testing.T) {
	for _, tt := range []struct {
		name string
		vals map[string]any
	}{
		{"defaults", nil},
		{"simulate with monitoring", map[string]any{
			"simulate": "dgx-h100,mig=0:1g.10gb+1g.10gb",
			"metrics": map[string]any{
				"serviceMonitor": map[string]any{"enabled": true},
				"prometheusRule": map[string]any{"enabled": true},
			},
		}},
		{"dra", map[string]any{"dra": map[string]any{"enabled": true}}},
		{"dra simulate", map[string]any{"simulate": "dgx-h100", "dra": map[string]any{"enabled": true, "devices": []any{"gpu", "nic"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			res := lint.Run([]string{filepath.Join(root, ChartDir)}, tt.vals)
			for _, err := range res.Errors {
				t.Errorf("lint error: %v", err)
			}
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				}
			}
		})
	}
}

func TestRBACIsLeastPrivilege(t *testing.T) {
	files := render(t, nil)
	d := docs(files["rbac.yaml"])
	if len(d) != 4 {
		t.Fatalf("rbac.yaml: %d documents, want ClusterRole, ClusterRoleBinding, Role and RoleBinding", len(d))
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(d[0]), &role); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, r := range role.Rules {
		if len(r.APIGroups) != 1 || r.APIGroups[0] != "" {
			t.Errorf("rule on API groups %v; only the core group is needed", r.APIGroups)
		}
		if len(r.ResourceNames) != 0 || len(r.NonResourceURLs) != 0 {
			t.Errorf("unexpected rule shape: %+v", r)
		}
		for _, res := range r.Resources {
			got[res] = append(got[res], r.Verbs...)
		}
	}
	want := map[string][]string{
		"nodes":        {"get", "list", "watch", "patch"},
		"nodes/status": {"patch"},
		"events":       {"create", "patch"},
		// placement.moveAdvice (on by default) reads the pods it names.
		"pods": {"get"},
	}
	if len(got) != len(want) {
		t.Errorf("resources %v, want exactly %v", got, want)
	}
	for res, verbs := range want {
		g := slices.Clone(got[res])
		slices.Sort(g)
		w := slices.Clone(verbs)
		slices.Sort(w)
		if !slices.Equal(g, w) {
			t.Errorf("%s verbs %v, want exactly %v", res, got[res], verbs)
		}
	}
	var binding rbacv1.ClusterRoleBinding
	if err := yaml.UnmarshalStrict([]byte(d[1]), &binding); err != nil {
		t.Fatal(err)
	}
	sa := decode[corev1.ServiceAccount](t, files, "serviceaccount.yaml")
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != ReleaseNamespace {
		t.Errorf("binding %+v does not bind role %s to service account %s/%s", binding, role.Name, ReleaseNamespace, sa.Name)
	}

	// The safeguard's slot Leases: only in the release namespace; watch
	// for a refused node's bucket, patch for the full-bucket hint.
	var leases rbacv1.Role
	if err := yaml.UnmarshalStrict([]byte(d[2]), &leases); err != nil {
		t.Fatal(err)
	}
	wantRule := rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}
	if leases.Namespace != ReleaseNamespace || len(leases.Rules) != 1 || !reflect.DeepEqual(leases.Rules[0], wantRule) {
		t.Errorf("lease Role %+v, want %+v in %s", leases, wantRule, ReleaseNamespace)
	}
	var leaseBinding rbacv1.RoleBinding
	if err := yaml.UnmarshalStrict([]byte(d[3]), &leaseBinding); err != nil {
		t.Fatal(err)
	}
	if leaseBinding.Namespace != ReleaseNamespace || leaseBinding.RoleRef.Kind != "Role" || leaseBinding.RoleRef.Name != leases.Name ||
		len(leaseBinding.Subjects) != 1 || leaseBinding.Subjects[0].Name != sa.Name || leaseBinding.Subjects[0].Namespace != ReleaseNamespace {
		t.Errorf("lease RoleBinding %+v does not bind Role %s to service account %s/%s", leaseBinding, leases.Name, ReleaseNamespace, sa.Name)
	}
}

// TestAdmissionPolicy asserts the ValidatingAdmissionPolicy's key fields:
// it matches only the agent's service account, fails closed, is bound with
// Deny, and follows the taint keys and condition types the agent is
// configured with (the health taint's and the preflight's). Its rules run
// against a real kube-apiserver in test/apiserver
// (TestAdmissionPolicyNodeScoped).
func TestAdmissionPolicy(t *testing.T) {
	files := render(t, map[string]any{
		"taintKey":  "example.com/gpu-unfit",
		"preflight": map[string]any{"taintKey": "example.com/gpu-unproven"},
		"config": map[string]any{
			"taint":     map[string]any{"conditionType": "GPUFit"},
			"preflight": map[string]any{"conditionType": "GPUProven"},
		},
	})
	d := docs(files["validatingadmissionpolicy.yaml"])
	if len(d) != 2 {
		t.Fatalf("validatingadmissionpolicy.yaml: %d documents, want the policy and its binding", len(d))
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict([]byte(d[0]), &policy); err != nil {
		t.Fatal(err)
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := yaml.UnmarshalStrict([]byte(d[1]), &binding); err != nil {
		t.Fatal(err)
	}
	sa := decode[corev1.ServiceAccount](t, files, "serviceaccount.yaml")
	spec := policy.Spec
	if spec.FailurePolicy == nil || *spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", spec.FailurePolicy)
	}
	wantUser := "request.userInfo.username == 'system:serviceaccount:" + ReleaseNamespace + ":" + sa.Name + "'"
	if len(spec.MatchConditions) != 1 || spec.MatchConditions[0].Expression != wantUser {
		t.Errorf("matchConditions %+v, want only %q", spec.MatchConditions, wantUser)
	}
	vars := map[string]string{}
	for _, v := range spec.Variables {
		vars[v.Name] = v.Expression
	}
	for name, want := range map[string]string{
		"taintKey": "'example.com/gpu-unfit'", "conditionType": "'GPUFit'",
		"preflightTaintKey": "'example.com/gpu-unproven'", "preflightConditionType": "'GPUProven'",
		"eventNamespace": "'default'", "leaseNamespace": "'" + ReleaseNamespace + "'",
	} {
		if vars[name] != want {
			t.Errorf("variable %s = %q, want %q", name, vars[name], want)
		}
	}
	// The validations that confine taints and conditions let the agent
	// change the preflight's as well as its own.
	var taints, conditions bool
	for _, v := range spec.Validations {
		taints = taints || strings.Contains(v.Expression, "t.key in [variables.taintKey, variables.preflightTaintKey]")
		conditions = conditions || strings.Contains(v.Expression, "c.type in [variables.conditionType, variables.preflightConditionType, variables.rebootConditionType]")
	}
	if !taints || !conditions {
		t.Errorf("validations %+v: want the taint check to except both taint keys (%v) and the condition check both types (%v)", spec.Validations, taints, conditions)
	}
	// Without the values: the agent's defaults.
	var defaults admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict([]byte(docs(render(t, nil)["validatingadmissionpolicy.yaml"])[0]), &defaults); err != nil {
		t.Fatal(err)
	}
	vars = map[string]string{}
	for _, v := range defaults.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	for name, want := range map[string]string{
		"taintKey": "'gpu-node-agent.io/unhealthy'", "conditionType": "'GPUHealthy'",
		"preflightTaintKey": "'gpu-node-agent.io/preflight'", "preflightConditionType": "'GPUPreflight'",
	} {
		if vars[name] != want {
			t.Errorf("default variable %s = %q, want %q", name, vars[name], want)
		}
	}
	if !strings.Contains(vars["nodeName"], "authentication.kubernetes.io/node-name") {
		t.Errorf("nodeName variable %q does not read the token's node-name extra", vars["nodeName"])
	}
	if len(spec.Validations) == 0 || spec.Validations[0].Expression != "variables.nodeName != ''" {
		t.Errorf("first validation %+v, want a credential without a node refused", spec.Validations)
	}
	if binding.Spec.PolicyName != policy.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding %+v, want policy %s with Deny", binding.Spec, policy.Name)
	}

	if _, ok := render(t, map[string]any{"admissionPolicy": map[string]any{"enabled": false}})["validatingadmissionpolicy.yaml"]; ok {
		t.Error("admissionPolicy.enabled=false still renders the policy")
	}
}

// TestPreflightTaintKeyTolerated: the DaemonSet tolerates the preflight
// taint key the policy lets the agent write, so the agent runs on a node
// registered with that taint and can remove it.
func TestPreflightTaintKeyTolerated(t *testing.T) {
	files := render(t, map[string]any{"preflight": map[string]any{"taintKey": "example.com/gpu-unproven"}})
	ds := decode[appsv1.DaemonSet](t, files, "daemonset.yaml")
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "example.com/gpu-unproven" && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
	}) {
		t.Errorf("tolerations %+v lack preflight.taintKey example.com/gpu-unproven", ds.Spec.Template.Spec.Tolerations)
	}
}

func hostPaths(spec *corev1.PodSpec) map[string]string {
	out := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

func mounts(c *corev1.Container) map[string]corev1.VolumeMount {
	out := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		out[m.Name] = m
	}
	return out
}

func TestDaemonSet(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container)
	}{
		{
			name: "real GPUs",
			check: func(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container) {
				spec := &ds.Spec.Template.Spec
				wantPaths := map[string]string{
					"device-plugins": "/var/lib/kubelet/device-plugins",
					"pod-resources":  "/var/lib/kubelet/pod-resources",
					"host-sys":       "/sys",
					"host-dev":       "/dev",
					"state":          "/var/lib/gpu-node-agent",
					"host-proc":      "/proc",
					"pod-logs":       "/var/log/pods",
				}
				if got := hostPaths(spec); !maps.Equal(got, wantPaths) {
					t.Errorf("hostPaths %v, want %v", got, wantPaths)
				}
				m := mounts(c)
				for name, path := range map[string]string{
					"host-sys": "/host/sys", "host-dev": "/host/dev",
					"pod-resources":  "/host/var/lib/kubelet/pod-resources",
					"device-plugins": "/var/lib/kubelet/device-plugins",
					"state":          "/var/lib/gpu-node-agent",
					"host-proc":      "/host/proc",
					"pod-logs":       "/host/var/log/pods",
				} {
					if m[name].MountPath != path {
						t.Errorf("volume %s mounted at %q, want %q", name, m[name].MountPath, path)
					}
				}
				if !m["host-sys"].ReadOnly || !m["host-dev"].ReadOnly || !m["host-proc"].ReadOnly || !m["pod-logs"].ReadOnly {
					t.Error("host /sys, /dev, /proc and the pod log directories must be mounted read-only")
				}
				// The GPU process check (on by default) names processes by
				// the host's PIDs.
				if !spec.HostPID {
					t.Error("hostPID off with the GPU process check on")
				}
				// The persisted health state is written: read-write, and the
				// directory is created on a fresh node.
				if m["state"].ReadOnly || !slices.Contains(c.Args, "--state-dir=/var/lib/gpu-node-agent") {
					t.Errorf("state dir mount %+v, args %v: want read-write and --state-dir", m["state"], c.Args)
				}
				for _, v := range spec.Volumes {
					if v.Name == "state" && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
						t.Errorf("state volume %+v, want DirectoryOrCreate", v.HostPath)
					}
				}
				if spec.HostNetwork {
					t.Error("hostNetwork on real GPUs; only simulate needs it")
				}
				if a := spec.Affinity; a == nil || a.NodeAffinity == nil ||
					len(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 2 {
					t.Errorf("GPU node affinity missing: %+v", spec.Affinity)
				}
				if !slices.Contains(c.Args, "--host-root=/host") || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--simulate") }) {
					t.Errorf("args %v", c.Args)
				}
				// A rollout at fleet size: a percentage, never one pod at a
				// time; no surge by default (kubelets before 1.37 drop the
				// new pod's device plugin when the old one stops).
				if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge != nil ||
					ru.MaxUnavailable.Type != intstr.String || !strings.HasSuffix(ru.MaxUnavailable.StrVal, "%") {
					t.Errorf("updateStrategy %+v, want rollingUpdate.maxUnavailable as a percentage and no surge", ds.Spec.UpdateStrategy)
				}
				var podUID bool
				for _, e := range c.Env {
					podUID = podUID || (e.Name == "POD_UID" && e.ValueFrom != nil &&
						e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid")
				}
				if !podUID {
					t.Errorf("env %+v: want POD_UID from metadata.uid (the two pods of a surge need their own sockets)", c.Env)
				}
				var podNamespace bool
				for _, e := range c.Env {
					podNamespace = podNamespace || (e.Name == "POD_NAMESPACE" && e.ValueFrom != nil &&
						e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace")
				}
				if !podNamespace {
					t.Errorf("env %+v: want POD_NAMESPACE from metadata.namespace (the safeguard's slot Leases)", c.Env)
				}
			},
		},
		{
			name: "simulate",
			vals: map[string]any{"simulate": "dgx-h100,mig=0:1g.10gb+1g.10gb"},
			check: func(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container) {
				spec := &ds.Spec.Template.Spec
				if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
					t.Errorf("simulate: hostNetwork %v dnsPolicy %q, want host networking", spec.HostNetwork, spec.DNSPolicy)
				}
				const simRoot = "/run/gpu-node-agent/sim"
				wantPaths := map[string]string{
					"device-plugins": "/var/lib/kubelet/device-plugins",
					"pod-resources":  "/var/lib/kubelet/pod-resources",
					"host-root":      simRoot,
					"pod-logs":       "/var/log/pods",
				}
				if got := hostPaths(spec); !maps.Equal(got, wantPaths) {
					t.Errorf("simulate hostPaths %v, want the kubelet's and the simulator's root %v", got, wantPaths)
				}
				// The simulator's GPU processes are its own: no host PIDs.
				if spec.HostPID {
					t.Error("simulate: hostPID on")
				}
				if got := mounts(c)["pod-logs"]; got.MountPath != simRoot+"/var/log/pods" || !got.ReadOnly {
					t.Errorf("simulate pod-logs mount %+v, want read-only under the simulator's root", got)
				}
				// The simulator's root is at the same path inside and out,
				// so device paths handed to the kubelet are valid on the host.
				m := mounts(c)
				if m["host-root"].MountPath != simRoot || m["host-root"].ReadOnly {
					t.Errorf("simulator root mounted at %q (read-only %v), want %q writable", m["host-root"].MountPath, m["host-root"].ReadOnly, simRoot)
				}
				if got := m["pod-resources"].MountPath; got != simRoot+"/var/lib/kubelet/pod-resources" {
					t.Errorf("pod-resources mounted at %q, want under the simulator's root", got)
				}
				if !slices.Contains(c.Args, "--host-root="+simRoot) {
					t.Errorf("args %v lack --host-root=%s", c.Args, simRoot)
				}
				if !slices.Contains(c.Args, "--simulate=dgx-h100,mig=0:1g.10gb+1g.10gb") {
					t.Errorf("args %v lack --simulate", c.Args)
				}
				if spec.Affinity != nil {
					t.Errorf("simulate keeps the GPU node affinity: %+v", spec.Affinity)
				}
				if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge != nil ||
					ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "10%" {
					t.Errorf("simulate updateStrategy %+v, want maxUnavailable 10%% and no surge", ds.Spec.UpdateStrategy)
				}
				if sc := c.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("simulate security context %+v, want unprivileged with a read-only root", sc)
				} else if caps := sc.Capabilities; caps == nil || !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(caps.Add, []corev1.Capability{"MKNOD"}) {
					t.Errorf("simulate capabilities %+v, want all dropped but MKNOD (RDMA device nodes)", caps)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			spec := &ds.Spec.Template.Spec
			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(spec.Containers))
			}
			c := &spec.Containers[0]

			// Common to every mode.
			if spec.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName %q", spec.PriorityClassName)
			}
			for _, key := range []string{"gpu-node-agent.io/unhealthy", "gpu-node-agent.io/preflight"} {
				if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
					return tol.Key == key && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
				}) {
					t.Errorf("tolerations %+v lack the agent's own taint %s (every effect)", spec.Tolerations, key)
				}
			}
			for probe, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port.String() != "metrics" {
					t.Errorf("probe %s: %+v", probe, p)
				}
			}
			if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9400 {
				t.Errorf("ports %+v", c.Ports)
			}
			if !slices.Contains(c.Args, "--metrics-address=:9400") {
				t.Errorf("args %v lack --metrics-address=:9400", c.Args)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
				return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			}) {
				t.Errorf("env %+v lacks NODE_NAME from spec.nodeName", c.Env)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: requests and a memory limit are required", c.Resources)
			}
			us := ds.Spec.UpdateStrategy
			if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil {
				t.Errorf("update strategy %+v, want RollingUpdate", us)
			}
			if ds.Spec.Template.Annotations["checksum/config"] == "" {
				t.Error("no config checksum annotation: config changes would not roll the pods")
			}
			tt.check(t, ds, c)
		})
	}
}

// TestGPUProcessCheckPrivileges: the GPU process check decides hostPID, the
// host /proc and pod log mounts and CAP_KILL: on by default (host PIDs, no
// CAP_KILL), off without them, CAP_KILL only to kill zombies, and kill
// without the check refused at render time.
func TestGPUProcessCheckPrivileges(t *testing.T) {
	disabled := map[string]any{"mig-strategy": "none", "health": map[string]any{"disabledChecks": []any{"gpu-processes"}}}
	kill := func(mig string) map[string]any {
		return map[string]any{"mig-strategy": mig, "health": map[string]any{"zombies": map[string]any{"action": "kill", "killGrace": "20s"}}}
	}
	for _, tt := range []struct {
		name       string
		vals       map[string]any
		hostPID    bool
		caps       []corev1.Capability
		noEscalate bool
	}{
		{name: "report (default), no MIG", vals: map[string]any{"config": map[string]any{"mig-strategy": "none"}}, hostPID: true, caps: []corev1.Capability{"SYSLOG"}, noEscalate: true},
		{name: "check disabled", vals: map[string]any{"config": disabled}, caps: []corev1.Capability{"SYSLOG"}, noEscalate: true},
		{name: "kill", vals: map[string]any{"config": kill("none")}, hostPID: true, caps: []corev1.Capability{"KILL", "SYSLOG"}, noEscalate: true},
		{name: "kill with MIG served", vals: map[string]any{"config": kill("mixed")}, hostPID: true, caps: []corev1.Capability{"SYS_ADMIN", "KILL", "SYSLOG"}},
		{name: "kill on a simulated node", vals: map[string]any{"simulate": "dgx-h100", "config": kill("none")}, caps: []corev1.Capability{"MKNOD"}, noEscalate: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			spec := &ds.Spec.Template.Spec
			c := &spec.Containers[0]
			if spec.HostPID != tt.hostPID {
				t.Errorf("hostPID %v, want %v", spec.HostPID, tt.hostPID)
			}
			_, proc := hostPaths(spec)["host-proc"]
			if proc != tt.hostPID {
				t.Errorf("host /proc mounted %v, want %v", proc, tt.hostPID)
			}
			_, logs := hostPaths(spec)["pod-logs"]
			if disabledCheck := tt.name == "check disabled"; logs == disabledCheck {
				t.Errorf("pod log directories mounted %v with the check disabled %v", logs, disabledCheck)
			}
			sc := c.SecurityContext
			if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				!slices.Equal(sc.Capabilities.Add, tt.caps) {
				t.Errorf("capabilities %+v, want drop ALL, add %v", sc, tt.caps)
			}
			if esc := sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation; esc != tt.noEscalate {
				t.Errorf("allowPrivilegeEscalation false = %v, want %v", esc, tt.noEscalate)
			}
		})
	}
	_, err := Render(loadChart(t), map[string]any{"config": map[string]any{"health": map[string]any{
		"disabledChecks": []any{"gpu-processes"}, "zombies": map[string]any{"action": "kill"}}}})
	if err == nil || !strings.Contains(err.Error(), "kill needs the gpu-processes check") {
		t.Errorf("kill with the check disabled rendered: %v", err)
	}
}

// TestSimulateHostRootMustBeAbsolute: a simulator root that is relative, or
// the host's own / (which it would write a fake /sys and /dev over), is
// refused at render time with a message naming the value.
func TestSimulateHostRootMustBeAbsolute(t *testing.T) {
	ch := loadChart(t)
	for _, bad := range []string{"/", "", "run/sim"} {
		_, err := Render(ch, map[string]any{"simulate": "dgx-h100", "simulateHostRoot": bad})
		if err == nil || !strings.Contains(err.Error(), "simulateHostRoot must be an absolute path") {
			t.Errorf("simulateHostRoot %q: err %v, want it refused", bad, err)
		}
	}
	// Without simulate the value is not used.
	if _, err := Render(ch, map[string]any{"simulateHostRoot": "/"}); err != nil {
		t.Errorf("real-GPU render with an unused simulateHostRoot: %v", err)
	}
}

func TestConfigMapCarriesValuesConfig(t *testing.T) {
	cm := decode[corev1.ConfigMap](t, render(t, map[string]any{
		"config": map[string]any{"log-level": "debug"},
	}), "configmap.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	want := map[string]any{
		"mig-strategy": "mixed", "device-list-strategy": "envvar", "rescan-interval": "30s",
		"log-format": "json", "log-level": "debug",
		// taintKey is written into the config, so taint and toleration agree.
		"taint": map[string]any{"key": "gpu-node-agent.io/unhealthy"},
		// Likewise preflight.taintKey.
		"preflight": map[string]any{"taintKey": "gpu-node-agent.io/preflight"},
		// The move advice, on by default (the RBAC follows it).
		"placement": map[string]any{"moveAdvice": true},
	}
	if len(cfg) != len(want) {
		t.Errorf("config keys %v, want %v", cfg, want)
	}
	// The agent reads its config strictly: every key must be one of its
	// options (declared as {name: "..."} in cmd/gpu-node-agent/config.go).
	src, err := os.ReadFile(filepath.Join(root, "cmd/gpu-node-agent/config.go"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`\{name: "([a-z0-9.-]+)"`).FindAllStringSubmatch(string(src), -1) {
		known[m[1]] = true
	}
	// Sections (health, taint, metrics, rdma) are struct fields of Config.
	for _, m := range regexp.MustCompile(`(?m)^\t[A-Z][A-Za-z]* +[A-Za-z.]+Section +`+"`"+`json:"([a-z]+)"`+"`").FindAllStringSubmatch(string(src), -1) {
		known[m[1]] = true
	}
	if len(known) < 5 {
		t.Fatalf("found only %d agent options in config.go; has its layout changed?", len(known))
	}
	for k := range cfg {
		if !known[k] {
			t.Errorf("config key %q is not an agent option; the agent would refuse the file", k)
		}
	}
	for k, v := range want {
		if !reflect.DeepEqual(cfg[k], v) {
			t.Errorf("config %s = %v, want %v", k, cfg[k], v)
		}
	}
}

func TestMonitoringObjectsAreOptional(t *testing.T) {
	files := render(t, nil)
	for _, f := range []string{"servicemonitor.yaml", "prometheusrule.yaml"} {
		if _, ok := files[f]; ok {
			t.Errorf("%s rendered by default; it needs CRDs and must be opt-in", f)
		}
	}
	files = render(t, map[string]any{"metrics": map[string]any{
		"serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true},
	}})
	var sm struct {
		Kind string
		Spec struct {
			Endpoints []struct{ Port, Path string }
		}
	}
	if err := yaml.Unmarshal([]byte(files["servicemonitor.yaml"]), &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Kind != "ServiceMonitor" || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor %+v", sm)
	}
	var rule struct {
		Kind string
		Spec struct {
			Groups []map[string]any `json:"groups"`
		}
	}
	if err := yaml.Unmarshal([]byte(files["prometheusrule.yaml"]), &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("PrometheusRule %+v", rule)
	}
	alerts := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g["rules"].([]any) {
			if a, ok := r.(map[string]any)["alert"].(string); ok { // else a recording rule
				alerts[a] = true
			}
		}
	}
	for _, a := range []string{"GPUNodeAgentDown", "GPUDeviceUnhealthy", "GPUNodeUnfit"} {
		if !alerts[a] {
			t.Errorf("alert %s missing (have %v)", a, alerts)
		}
	}

	// promtool (Debian's prometheus package) checks the rules for real.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("promtool not installed (make deps-prometheus): %v", err)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(rules, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}

// TestManifestsInSync fails when deploy/manifests differs from what the
// chart renders with default values; `make manifests` fixes it.
func TestManifestsInSync(t *testing.T) {
	want, err := Manifests(loadChart(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, ManifestsDir)
	have, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range have {
		if _, ok := want[filepath.Base(f)]; !ok {
			t.Errorf("%s is not rendered by the chart any more (run make manifests)", f)
		}
	}
	for name, text := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v (run make manifests)", name, err)
			continue
		}
		if !bytes.Equal(got, []byte(text)) {
			t.Errorf("%s/%s is out of sync with the chart (run make manifests)", ManifestsDir, name)
		}
	}
}

// Privilege modes of the DaemonSet.
const (
	modeReal        = "real GPUs"
	modeRealMIG     = "real GPUs serving MIG"                  // the MIG monitor capability
	modeRealKill    = "real GPUs killing zombie GPU processes" // health.zombies.action kill
	modeRealMIGKill = "real GPUs serving MIG and killing zombies"
	modeSimulate    = "simulate"
	modeRealReset   = "real GPUs resetting GPUs" // remediation.reset
)

// allowedCaps is docs/install.md's "Privileges" table as an allow-list: the
// capabilities each mode may add to an otherwise empty set. On real GPUs
// the kernel-log check adds SYSLOG (syslog(2) under dmesg_restrict;
// TestKernelLogPrivileges says when).
var allowedCaps = map[string][]corev1.Capability{
	modeReal:        {"SYSLOG"},                      // the kernel log only, otherwise none, as NVIDIA's device plugin
	modeRealMIG:     {"SYS_ADMIN", "SYSLOG"},         // the NVIDIA runtime injects the MIG monitor capability only then
	modeRealKill:    {"KILL", "SYSLOG"},              // zombie processes of pods run as other users
	modeRealMIGKill: {"SYS_ADMIN", "KILL", "SYSLOG"}, // both
	modeSimulate:    {"MKNOD"},                       // the simulated /dev/infiniband character devices
	modeRealReset:   {"SYS_ADMIN", "SYSLOG"},         // nvidia-smi -r resets a GPU only for an administrator
}

// TestKernelLogPrivileges: CAP_SYSLOG is added on real GPUs while the
// kernel-log check may read /dev/kmsg or syslog(2) (auto, kmsg, syslog),
// and not when it is off (an unquoted off is the YAML boolean false),
// disabled, reads the journal only, or on a simulated node.
func TestKernelLogPrivileges(t *testing.T) {
	health := func(h map[string]any) map[string]any {
		return map[string]any{"config": map[string]any{"mig-strategy": "none", "health": h}}
	}
	for _, tt := range []struct {
		name   string
		vals   map[string]any
		syslog bool
	}{
		{name: "default (auto)", vals: map[string]any{"config": map[string]any{"mig-strategy": "none"}}, syslog: true},
		{name: "auto", vals: health(map[string]any{"kernelLog": "auto"}), syslog: true},
		{name: "kmsg", vals: health(map[string]any{"kernelLog": "kmsg"}), syslog: true},
		{name: "syslog", vals: health(map[string]any{"kernelLog": "syslog"}), syslog: true},
		{name: "off", vals: health(map[string]any{"kernelLog": "off"})},
		{name: "unquoted off", vals: health(map[string]any{"kernelLog": false})},
		{name: "check disabled", vals: health(map[string]any{"disabledChecks": []any{"kernel-log"}})},
		{name: "simulate", vals: map[string]any{"simulate": "dgx-h100"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
			var add []corev1.Capability
			if sc != nil && sc.Capabilities != nil {
				add = sc.Capabilities.Add
			}
			if got := slices.Contains(add, "SYSLOG"); got != tt.syslog {
				t.Errorf("capabilities add %v: SYSLOG %v, want %v", add, got, tt.syslog)
			}
		})
	}
}

// privilegeViolations lists what the DaemonSet asks for beyond the
// "Privileges" table of docs/install.md: privileged, privilege escalation allowed or
// unset, a capability outside the mode's allow-list, a writable root
// filesystem, no RuntimeDefault seccomp profile, host IPC, host PID
// unless the GPU process check runs on real GPUs (gpuProcesses), host
// networking outside simulate mode.
func privilegeViolations(ds *appsv1.DaemonSet, mode string, gpuProcesses bool) []string {
	simulate := mode == modeSimulate
	var out []string
	spec := &ds.Spec.Template.Spec
	if spec.HostIPC {
		out = append(out, "hostIPC: no built feature needs it")
	}
	if spec.HostPID && (simulate || !gpuProcesses) {
		out = append(out, "hostPID: only the GPU process check on real GPUs needs it")
	}
	if spec.HostNetwork != simulate {
		out = append(out, fmt.Sprintf("hostNetwork %v; only simulate mode (loopback control endpoint) has it", spec.HostNetwork))
	}
	var podSeccomp *corev1.SeccompProfile
	if spec.SecurityContext != nil {
		podSeccomp = spec.SecurityContext.SeccompProfile
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			out = append(out, "container "+c.Name+" has no securityContext")
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			out = append(out, "container "+c.Name+" is privileged")
		}
		switch {
		case mode == modeRealReset:
			// The API server refuses false together with CAP_SYS_ADMIN.
			if sc.AllowPrivilegeEscalation != nil {
				out = append(out, fmt.Sprintf("container %s: allowPrivilegeEscalation %v with CAP_SYS_ADMIN, want it unset", c.Name, *sc.AllowPrivilegeEscalation))
			}
		case mode == modeRealMIG || mode == modeRealMIGKill:
			// The API server refuses false together with CAP_SYS_ADMIN.
			if sc.AllowPrivilegeEscalation != nil {
				out = append(out, fmt.Sprintf("container %s: allowPrivilegeEscalation %v with CAP_SYS_ADMIN, want it unset", c.Name, *sc.AllowPrivilegeEscalation))
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NVIDIA_MIG_MONITOR_DEVICES" && e.Value == "all" }) {
				out = append(out, "container "+c.Name+": CAP_SYS_ADMIN without NVIDIA_MIG_MONITOR_DEVICES=all, its only use")
			}
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			out = append(out, fmt.Sprintf("container %s: allowPrivilegeEscalation %v, want false", c.Name, sc.AllowPrivilegeEscalation))
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			out = append(out, fmt.Sprintf("container %s: readOnlyRootFilesystem %v, want true", c.Name, sc.ReadOnlyRootFilesystem))
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			out = append(out, fmt.Sprintf("container %s: procMount %s", c.Name, *sc.ProcMount))
		}
		seccomp := podSeccomp
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			out = append(out, fmt.Sprintf("container %s: seccomp profile %+v, want RuntimeDefault (pod or container)", c.Name, seccomp))
		}
		caps := sc.Capabilities
		if caps == nil || !slices.Contains(caps.Drop, "ALL") {
			out = append(out, fmt.Sprintf("container %s: capabilities %+v, want drop [ALL]", c.Name, caps))
			continue
		}
		for _, add := range caps.Add {
			// The API takes both "MKNOD" and "CAP_MKNOD".
			if !slices.Contains(allowedCaps[mode], corev1.Capability(strings.TrimPrefix(string(add), "CAP_"))) {
				out = append(out, fmt.Sprintf("container %s adds %s; %s allows %v (docs/install.md, Privileges)", c.Name, add, mode, allowedCaps[mode]))
			}
		}
	}
	return out
}

// TestLeastPrivilege: the DaemonSet, in each mode and with the optional
// features on, asks for nothing beyond docs/install.md's "Privileges" table.
func TestLeastPrivilege(t *testing.T) {
	noMIG := map[string]any{"mig-strategy": "none"}
	noCheck := map[string]any{"mig-strategy": "none", "health": map[string]any{"disabledChecks": []any{"gpu-processes"}}}
	kill := func(mig string) map[string]any {
		return map[string]any{"mig-strategy": mig, "health": map[string]any{"zombies": map[string]any{"action": "kill"}}}
	}
	for _, tt := range []struct {
		name    string
		vals    map[string]any
		mode    string
		noCheck bool
	}{
		{name: "real GPUs, MIG served (the default mixed)", mode: modeRealMIG},
		{name: "real GPUs, mig-strategy none", vals: map[string]any{"config": noMIG}, mode: modeReal},
		{name: "real GPUs, MIG served, migMonitor off", vals: map[string]any{"migMonitor": false}, mode: modeReal},
		{name: "real GPUs with web config and a state dir", vals: map[string]any{"config": noMIG,
			"metrics": map[string]any{"webConfigSecret": "web"}, "stateDir": "/var/lib/x"}, mode: modeReal},
		{name: "real GPUs, GPU process check off", vals: map[string]any{"config": noCheck}, mode: modeReal, noCheck: true},
		{name: "real GPUs killing zombies", vals: map[string]any{"config": kill("none")}, mode: modeRealKill},
		{name: "real GPUs serving MIG and killing zombies", vals: map[string]any{"config": kill("mixed")}, mode: modeRealMIGKill},
		{name: "simulate", vals: map[string]any{"simulate": "dgx-h100,mig=0:1g.10gb+1g.10gb"}, mode: modeSimulate},
		// DRA adds host directories, never a privilege: the kubelet's
		// plugin directories and the CDI dir are root's, as device-plugins.
		{name: "real GPUs serving DRA", vals: map[string]any{"dra": map[string]any{"enabled": true}}, mode: modeRealMIG},
		{name: "real GPUs serving DRA, mig-strategy none", vals: map[string]any{"config": noMIG, "dra": map[string]any{"enabled": true}}, mode: modeReal},
		{name: "simulate serving DRA", vals: map[string]any{"simulate": "dgx-h100", "dra": map[string]any{"enabled": true}}, mode: modeSimulate},
		// Remediation: a reset adds CAP_SYS_ADMIN; a drain only RBAC; a
		// reboot request only its sentinel's directory.
		{name: "real GPUs resetting GPUs", vals: map[string]any{"config": map[string]any{"mig-strategy": "none",
			"remediation": map[string]any{"reset": map[string]any{"enabled": true}, "drain": map[string]any{"enabled": true}}}}, mode: modeRealReset},
		{name: "real GPUs requesting reboots", vals: map[string]any{"config": map[string]any{"mig-strategy": "none",
			"remediation": map[string]any{"reboot": map[string]any{"enabled": true}}}}, mode: modeReal},
		{name: "simulate with every remediation step", vals: map[string]any{"simulate": "dgx-h100", "config": map[string]any{
			"remediation": map[string]any{"reset": map[string]any{"enabled": true}, "drain": map[string]any{"enabled": true},
				"reboot": map[string]any{"enabled": true}}}}, mode: modeSimulate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			for _, v := range privilegeViolations(ds, tt.mode, !tt.noCheck) {
				t.Error(v)
			}
		})
	}
}

// TestLeastPrivilegeCatchesOverrides makes sure privilegeViolations bites:
// each case overrides one value to ask for something docs/install.md's
// "Privileges" table does not allow.
func TestLeastPrivilegeCatchesOverrides(t *testing.T) {
	base := map[string]any{
		"runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
		"capabilities": map[string]any{"drop": []any{"ALL"}},
	}
	with := func(k string, v any) map[string]any {
		m := maps.Clone(base)
		m[k] = v
		return m
	}
	for _, tt := range []struct {
		name string
		vals map[string]any
	}{
		{"privileged", map[string]any{"securityContext": with("privileged", true)}},
		{"privileged while serving MIG", map[string]any{"migMonitor": true, "securityContext": with("privileged", true)}},
		{"escalation allowed", map[string]any{"securityContext": with("allowPrivilegeEscalation", true)}},
		{"escalation unset", map[string]any{"securityContext": with("allowPrivilegeEscalation", nil)}},
		{"writable root", map[string]any{"securityContext": with("readOnlyRootFilesystem", false)}},
		{"capabilities not dropped", map[string]any{"securityContext": with("capabilities", nil)}},
		{"MKNOD on real GPUs", map[string]any{"securityContext": with("capabilities",
			map[string]any{"drop": []any{"ALL"}, "add": []any{"MKNOD"}})}},
		{"SYS_ADMIN in simulate", map[string]any{"simulate": "dgx-h100", "simulateSecurityContext": with("capabilities",
			map[string]any{"drop": []any{"ALL"}, "add": []any{"MKNOD", "CAP_SYS_ADMIN"}})}},
		{"no seccomp profile", map[string]any{"podSecurityContext": nil}},
		{"unconfined seccomp", map[string]any{"simulate": "dgx-h100",
			"podSecurityContext": map[string]any{"seccompProfile": map[string]any{"type": "Unconfined"}}}},
		{"KILL without killing zombies", map[string]any{"securityContext": with("capabilities",
			map[string]any{"drop": []any{"ALL"}, "add": []any{"KILL"}})}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mode := modeReal
			switch {
			case tt.vals["simulate"] != nil:
				mode = modeSimulate
			case tt.vals["migMonitor"] == true:
				mode = modeRealMIG
			default:
				// The securityContext override is what is under test, not
				// the MIG monitor's.
				tt.vals["migMonitor"] = false
			}
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			if v := privilegeViolations(ds, mode, true); len(v) == 0 {
				t.Errorf("values %v render a DaemonSet the least-privilege check accepts", tt.vals)
			}
		})
	}
}

// TestDeviceClassesAreOptional: the DRA DeviceClasses render only with
// dra.enabled (the agent does not serve DRA by default), one per device
// kind, each selecting the agent's driver and its kind's "type" attribute,
// and with dra.extendedResources (on by default) the gpu class and one
// class per listed MIG profile name the extended resource the device
// plugin would serve, each name once. The dra package's
// TestChartDeviceClasses evaluates the selectors.
func TestDeviceClassesAreOptional(t *testing.T) {
	if _, ok := render(t, nil)["deviceclasses.yaml"]; ok {
		t.Fatal("deviceclasses.yaml rendered by default; DRA must be opt-in")
	}
	classes := func(values map[string]any) map[string]resourcev1.DeviceClass {
		t.Helper()
		files := render(t, values)
		text, ok := files["deviceclasses.yaml"]
		if !ok {
			t.Fatalf("deviceclasses.yaml not rendered with dra.enabled (have %v)", keys(files))
		}
		got := map[string]resourcev1.DeviceClass{}
		for _, d := range docs(text) {
			var dc resourcev1.DeviceClass
			if err := yaml.UnmarshalStrict([]byte(d), &dc); err != nil {
				t.Fatalf("decode DeviceClass: %v\n%s", err, d)
			}
			if dc.APIVersion != "resource.k8s.io/v1" || dc.Kind != "DeviceClass" {
				t.Errorf("%s: %s %s", dc.Name, dc.APIVersion, dc.Kind)
			}
			if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil {
				t.Fatalf("%s: selectors %+v, want one CEL selector", dc.Name, dc.Spec.Selectors)
			}
			got[dc.Name] = dc
		}
		return got
	}
	kindClasses := func(t *testing.T, got map[string]resourcev1.DeviceClass) {
		t.Helper()
		for _, kind := range []string{"gpu", "mig", "nic"} {
			name := kind + ".dra.gpu-node-agent.io"
			dc, ok := got[name]
			if !ok {
				t.Errorf("DeviceClass %s missing (have %v)", name, keysOf(got))
				continue
			}
			expr := dc.Spec.Selectors[0].CEL.Expression
			for _, want := range []string{`device.driver == "dra.gpu-node-agent.io"`, `.type == "` + kind + `"`} {
				if !strings.Contains(expr, want) {
					t.Errorf("%s: selector %q lacks %q", name, expr, want)
				}
			}
		}
	}
	extended := func(dc resourcev1.DeviceClass) string {
		if dc.Spec.ExtendedResourceName == nil {
			return ""
		}
		return *dc.Spec.ExtendedResourceName
	}

	t.Run("extended resources off", func(t *testing.T) {
		got := classes(map[string]any{"dra": map[string]any{"enabled": true, "extendedResources": map[string]any{"enabled": false}}})
		kindClasses(t, got)
		if len(got) != 3 {
			t.Errorf("%d DeviceClasses, want 3: %v", len(got), keysOf(got))
		}
		for name, dc := range got {
			if e := extended(dc); e != "" {
				t.Errorf("%s names extended resource %s with extendedResources off", name, e)
			}
		}
	})
	t.Run("extended resources on", func(t *testing.T) {
		profiles := []any{"1g.10gb", "1g.10gb+me", "7g.80gb"}
		got := classes(map[string]any{"dra": map[string]any{"enabled": true, "extendedResources": map[string]any{"migProfiles": profiles}}})
		kindClasses(t, got)
		want := map[string]string{
			"gpu.dra.gpu-node-agent.io":            "nvidia.com/gpu",
			"mig.dra.gpu-node-agent.io":            "",
			"nic.dra.gpu-node-agent.io":            "",
			"mig-1g.10gb.dra.gpu-node-agent.io":    "nvidia.com/mig-1g.10gb",
			"mig-1g.10gb.me.dra.gpu-node-agent.io": "nvidia.com/mig-1g.10gb.me",
			"mig-7g.80gb.dra.gpu-node-agent.io":    "nvidia.com/mig-7g.80gb",
		}
		if len(got) != len(want) {
			t.Errorf("DeviceClasses %v, want %v", keysOf(got), keysOf(want))
		}
		for name, res := range want {
			dc, ok := got[name]
			if !ok {
				t.Errorf("DeviceClass %s missing", name)
				continue
			}
			if e := extended(dc); e != res {
				t.Errorf("%s: extendedResourceName %q, want %q", name, e, res)
			}
			if p, ok := strings.CutPrefix(name, "mig-"); ok {
				profile := profiles[slices.IndexFunc(profiles, func(v any) bool {
					return strings.ReplaceAll(v.(string), "+", ".")+".dra.gpu-node-agent.io" == p
				})].(string)
				expr := dc.Spec.Selectors[0].CEL.Expression
				for _, w := range []string{`.type == "mig"`, `.profile == "` + profile + `"`} {
					if !strings.Contains(expr, w) {
						t.Errorf("%s: selector %q lacks %q", name, expr, w)
					}
				}
			}
		}
	})
	t.Run("RDMA resources", func(t *testing.T) {
		got := classes(map[string]any{"dra": map[string]any{"enabled": true, "extendedResources": map[string]any{"migProfiles": []any{}}},
			"config": map[string]any{"rdma": map[string]any{"resources": []any{
				map[string]any{"name": "ib", "selectors": map[string]any{"linkTypes": []any{"infiniband"}}},
				map[string]any{"name": "roce_shared", "mode": "shared", "slots": 10},
			}}}})
		dc, ok := got["rdma-ib.dra.gpu-node-agent.io"]
		if !ok {
			t.Fatalf("no class for rdma/ib (have %v)", keysOf(got))
		}
		if e := extended(dc); e != "rdma/ib" {
			t.Errorf("rdma-ib: extendedResourceName %q, want rdma/ib", e)
		}
		if expr := dc.Spec.Selectors[0].CEL.Expression; !strings.Contains(expr, `.type == "nic"`) || !strings.Contains(expr, `.rdmaResource == "rdma/ib"`) {
			t.Errorf("rdma-ib: selector %q", expr)
		}
		for name := range got {
			if strings.Contains(name, "roce") {
				t.Errorf("class %s for a shared RDMA resource (its slots are not devices)", name)
			}
		}
		if len(got) != 4 {
			t.Errorf("classes %v, want the three kinds and rdma-ib", keysOf(got))
		}
	})
	t.Run("sharing", func(t *testing.T) {
		got := classes(map[string]any{"dra": map[string]any{"enabled": true, "sharing": map[string]any{"enabled": true},
			"extendedResources": map[string]any{"migProfiles": []any{"1g.10gb"}}}})
		kindClasses(t, got)
		exclusive := "!device.allowMultipleAllocations"
		for name, wantExclusive := range map[string]bool{
			"gpu.dra.gpu-node-agent.io": true, "mig.dra.gpu-node-agent.io": true, "mig-1g.10gb.dra.gpu-node-agent.io": true,
			"nic.dra.gpu-node-agent.io": false,
		} {
			if expr := got[name].Spec.Selectors[0].CEL.Expression; strings.Contains(expr, exclusive) != wantExclusive {
				t.Errorf("%s: selector %q; want exclusive devices only: %v", name, expr, wantExclusive)
			}
		}
		for name, res := range map[string]string{"gpu-shared.dra.gpu-node-agent.io": "nvidia.com/gpu.shared", "mig-shared.dra.gpu-node-agent.io": ""} {
			dc, ok := got[name]
			if !ok {
				t.Errorf("DeviceClass %s missing (have %v)", name, keysOf(got))
				continue
			}
			expr := dc.Spec.Selectors[0].CEL.Expression
			if !strings.HasSuffix(expr, "&& device.allowMultipleAllocations") || strings.Contains(expr, exclusive) {
				t.Errorf("%s: selector %q, want shared devices only", name, expr)
			}
			if e := extended(dc); e != res {
				t.Errorf("%s: extendedResourceName %q, want %q", name, e, res)
			}
		}
		cfg := render(t, map[string]any{"dra": map[string]any{"enabled": true, "sharing": map[string]any{"enabled": true}}})["configmap.yaml"]
		if !strings.Contains(cfg, "sharing: true") {
			t.Errorf("the agent's config lacks dra.sharing: true:\n%s", cfg)
		}
	})
	t.Run("default profiles name each resource once", func(t *testing.T) {
		got := classes(map[string]any{"dra": map[string]any{"enabled": true}})
		seen := map[string]string{}
		for name, dc := range got {
			e := extended(dc)
			if e == "" {
				continue
			}
			if other, dup := seen[e]; dup {
				t.Errorf("%s and %s both name %s: the scheduler would pick one", name, other, e)
			}
			seen[e] = name
		}
		for _, e := range []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.71gb", "nvidia.com/mig-1g.23gb.me"} {
			if _, ok := seen[e]; !ok {
				t.Errorf("no default DeviceClass names %s (have %v)", e, keysOf(seen))
			}
		}
	})
}

// draRules is the ClusterRole's verbs by resource, for the core group
// and for resource.k8s.io (a rule on any other group is an error).
func draRules(t *testing.T, files map[string]string) (core, resource map[string][]string) {
	t.Helper()
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(docs(files["rbac.yaml"])[0]), &role); err != nil {
		t.Fatal(err)
	}
	core, resource = map[string][]string{}, map[string][]string{}
	for _, r := range role.Rules {
		if len(r.APIGroups) != 1 || len(r.ResourceNames) != 0 || len(r.NonResourceURLs) != 0 {
			t.Errorf("unexpected rule shape: %+v", r)
			continue
		}
		into := map[string]map[string][]string{"": core, "resource.k8s.io": resource}[r.APIGroups[0]]
		if into == nil {
			t.Errorf("rule on API group %q", r.APIGroups[0])
			continue
		}
		for _, res := range r.Resources {
			into[res] = append(into[res], r.Verbs...)
		}
	}
	return core, resource
}

// TestDRARBACAndPolicy: with dra.enabled the ClusterRole grants exactly
// get, list, watch, create, update, delete on resourceslices and get on
// resourceclaims (core rules unchanged), and the admission policy matches
// ResourceSlice creates, updates and deletes and confines them to the
// token's node and the agent's driver, before and after the write; with
// dra.enabled=false none of it renders. test/apiserver's
// TestAdmissionPolicyResourceSlices runs the rules on a real API server.
func TestDRARBACAndPolicy(t *testing.T) {
	const driver = "dra.gpu-node-agent.io"
	wantCore := map[string][]string{
		"nodes": {"get", "list", "watch", "patch"}, "nodes/status": {"patch"}, "events": {"create", "patch"},
		"pods": {"get"}, // placement.moveAdvice
	}
	for _, enabled := range []bool{true, false} {
		t.Run(fmt.Sprintf("dra.enabled=%v", enabled), func(t *testing.T) {
			files := render(t, map[string]any{"dra": map[string]any{"enabled": enabled}})
			core, res := draRules(t, files)
			if !reflect.DeepEqual(core, wantCore) {
				t.Errorf("core rules %v, want %v", core, wantCore)
			}
			wantRes := map[string][]string{}
			if enabled {
				wantRes = map[string][]string{
					"resourceslices": {"get", "list", "watch", "create", "update", "delete"},
					"resourceclaims": {"get"},
				}
			}
			if !reflect.DeepEqual(res, wantRes) {
				t.Errorf("resource.k8s.io rules %v, want exactly %v", res, wantRes)
			}

			var policy admissionregistrationv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict([]byte(docs(files["validatingadmissionpolicy.yaml"])[0]), &policy); err != nil {
				t.Fatal(err)
			}
			var sliceRules []admissionregistrationv1.NamedRuleWithOperations
			for _, r := range policy.Spec.MatchConstraints.ResourceRules {
				if slices.Contains(r.APIGroups, "resource.k8s.io") || slices.Contains(r.Resources, "resourceslices") {
					sliceRules = append(sliceRules, r)
				}
			}
			var isSlice string
			for _, v := range policy.Spec.Variables {
				if v.Name == "isSlice" {
					isSlice = v.Expression
				}
			}
			var sliceValidations []admissionregistrationv1.Validation
			for _, v := range policy.Spec.Validations {
				if strings.Contains(v.Expression, "isSlice") || strings.Contains(v.Expression, driver) ||
					strings.Contains(v.MessageExpression, "ResourceSlice") {
					sliceValidations = append(sliceValidations, v)
				}
			}
			if !enabled {
				if len(sliceRules) != 0 || isSlice != "" || len(sliceValidations) != 0 {
					t.Errorf("dra disabled, yet the policy has ResourceSlice rules %+v, variable %q, validations %+v",
						sliceRules, isSlice, sliceValidations)
				}
				return
			}
			wantRule := admissionregistrationv1.RuleWithOperations{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"*"}, Resources: []string{"resourceslices"}},
			}
			if len(sliceRules) != 1 || !reflect.DeepEqual(sliceRules[0].RuleWithOperations, wantRule) {
				t.Errorf("ResourceSlice match rules %+v, want only %+v", sliceRules, wantRule)
			}
			if isSlice != "request.resource.group == 'resource.k8s.io' && request.resource.resource == 'resourceslices'" {
				t.Errorf("isSlice variable %q", isSlice)
			}
			if len(sliceValidations) != 1 {
				t.Fatalf("%d ResourceSlice validations, want 1: %+v", len(sliceValidations), sliceValidations)
			}
			v := sliceValidations[0]
			expr := strings.Join(strings.Fields(v.Expression), " ")
			for _, want := range []string{
				"!variables.isSlice ||",
				"oldObject.spec.?nodeName == optional.of(variables.nodeName)",
				"oldObject.spec.driver == '" + driver + "'",
				"object.spec.?nodeName == optional.of(variables.nodeName)",
				"object.spec.driver == '" + driver + "'",
			} {
				if !strings.Contains(expr, want) {
					t.Errorf("ResourceSlice validation %q lacks %q", expr, want)
				}
			}
			if v.Reason == nil || *v.Reason != "Forbidden" || !strings.Contains(v.MessageExpression, "ResourceSlices of driver "+driver) {
				t.Errorf("ResourceSlice validation reason %v message %q", v.Reason, v.MessageExpression)
			}
			// The credential check still comes first, so a token without a
			// node is refused before any slice rule is read.
			if policy.Spec.Validations[0].Expression != "variables.nodeName != ''" {
				t.Errorf("first validation %q, want the node-name check", policy.Spec.Validations[0].Expression)
			}
		})
	}
}

// draVolumes are the hostPath volumes dra.enabled adds, by name: the
// kubelet's plugin and registration directories and the CDI spec dir.
var draVolumes = []string{"kubelet-plugins", "kubelet-plugins-registry", "cdi"}

// TestDRAMounts: with dra.enabled the DaemonSet mounts <kubeletDir>/plugins,
// <kubeletDir>/plugins_registry and dra.cdiDir from the host, read-write,
// at the same paths (the kubelet and the container runtime are told those
// paths), created when missing, in both modes and following kubeletDir and
// cdiDir; every other volume stays as without DRA, and without dra.enabled
// none of them renders.
func TestDRAMounts(t *testing.T) {
	for _, tt := range []struct {
		name string
		vals map[string]any
		want map[string]string
	}{
		{name: "real GPUs", vals: map[string]any{}, want: map[string]string{
			"kubelet-plugins": "/var/lib/kubelet/plugins", "kubelet-plugins-registry": "/var/lib/kubelet/plugins_registry", "cdi": "/var/run/cdi"}},
		{name: "simulate", vals: map[string]any{"simulate": "dgx-h100"}, want: map[string]string{
			"kubelet-plugins": "/var/lib/kubelet/plugins", "kubelet-plugins-registry": "/var/lib/kubelet/plugins_registry", "cdi": "/var/run/cdi"}},
		{name: "other kubelet and cdi dirs", vals: map[string]any{"kubeletDir": "/data/kubelet", "draCDIDir": "/etc/cdi"}, want: map[string]string{
			"kubelet-plugins": "/data/kubelet/plugins", "kubelet-plugins-registry": "/data/kubelet/plugins_registry", "cdi": "/etc/cdi"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			off := maps.Clone(tt.vals)
			dra := map[string]any{"enabled": true}
			if dir, ok := off["draCDIDir"]; ok {
				delete(off, "draCDIDir")
				dra["cdiDir"] = dir
			}
			on := maps.Clone(off)
			on["dra"] = dra

			without := decode[appsv1.DaemonSet](t, render(t, off), "daemonset.yaml")
			with := decode[appsv1.DaemonSet](t, render(t, on), "daemonset.yaml")
			before, after := hostPaths(&without.Spec.Template.Spec), hostPaths(&with.Spec.Template.Spec)
			for _, name := range draVolumes {
				if _, ok := before[name]; ok {
					t.Errorf("volume %s rendered without dra.enabled", name)
				}
			}
			wantAll := maps.Clone(before)
			maps.Copy(wantAll, tt.want)
			if !maps.Equal(after, wantAll) {
				t.Errorf("hostPaths with dra.enabled %v, want %v (the ones without DRA plus %v)", after, wantAll, tt.want)
			}
			for _, v := range with.Spec.Template.Spec.Volumes {
				if _, ok := tt.want[v.Name]; ok && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
					t.Errorf("volume %s: hostPath type %v, want DirectoryOrCreate", v.Name, v.HostPath.Type)
				}
			}
			m := mounts(&with.Spec.Template.Spec.Containers[0])
			for name, path := range tt.want {
				if m[name].MountPath != path || m[name].ReadOnly {
					t.Errorf("volume %s mounted %+v, want read-write at %s (the host's path)", name, m[name], path)
				}
			}
			// Nothing else moves: the other mounts are those without DRA.
			mo := mounts(&without.Spec.Template.Spec.Containers[0])
			for name, mt := range mo {
				if !reflect.DeepEqual(m[name], mt) {
					t.Errorf("mount %s %+v with DRA, %+v without", name, m[name], mt)
				}
			}
		})
	}
	// With no kind left (the first step of turning DRA off) the agent
	// still hands kinds back through the plugin and CDI dirs.
	ds := decode[appsv1.DaemonSet](t, render(t, map[string]any{"dra": map[string]any{"enabled": true, "devices": []any{}}}), "daemonset.yaml")
	paths := hostPaths(&ds.Spec.Template.Spec)
	for _, name := range draVolumes {
		if _, ok := paths[name]; !ok {
			t.Errorf("dra.devices=[]: volume %s not mounted (have %v)", name, paths)
		}
	}
}

// draConfig renders the chart and returns the config file's dra section
// (nil when absent).
func draConfig(t *testing.T, vals map[string]any) map[string]any {
	t.Helper()
	cm := decode[corev1.ConfigMap](t, render(t, vals), "configmap.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	if cfg["dra"] == nil {
		return nil
	}
	d, ok := cfg["dra"].(map[string]any)
	if !ok {
		t.Fatalf("config dra section %T %v, want an object", cfg["dra"], cfg["dra"])
	}
	return d
}

// TestDRAConfig: dra.enabled writes the agent's dra section (the agreed
// keys: devices, noExecute, deviceMetadata and migOnDemand when on, kubeletDir, cdiDir) from the dra values, with
// the defaults gpu, mig, nic and NoSchedule, and the same kubelet and CDI
// dirs the DaemonSet mounts; without it there is no dra section (DRA off,
// the agent's default).
func TestDRAConfig(t *testing.T) {
	if d := draConfig(t, nil); d != nil {
		t.Errorf("default config has a dra section %v; DRA must be off by default", d)
	}
	if d := draConfig(t, map[string]any{"dra": map[string]any{"enabled": false, "devices": []any{"gpu"}}}); d != nil {
		t.Errorf("dra.enabled=false still writes the dra section %v", d)
	}
	for _, tt := range []struct {
		name string
		vals map[string]any
		want map[string]any
	}{
		{"defaults", map[string]any{"dra": map[string]any{"enabled": true}},
			map[string]any{"devices": []any{"gpu", "mig", "nic"}, "noExecute": false, "kubeletDir": "/var/lib/kubelet", "cdiDir": "/var/run/cdi"}},
		{"MIG on demand", map[string]any{"dra": map[string]any{"enabled": true, "migOnDemand": true}},
			map[string]any{"devices": []any{"gpu", "mig", "nic"}, "noExecute": false, "migOnDemand": true, "kubeletDir": "/var/lib/kubelet", "cdiDir": "/var/run/cdi"}},
		{"GPUs only, NoExecute, device metadata, other dirs", map[string]any{"kubeletDir": "/data/kubelet",
			"dra": map[string]any{"enabled": true, "devices": []any{"gpu"}, "noExecute": true, "deviceMetadata": true, "cdiDir": "/etc/cdi"}},
			map[string]any{"devices": []any{"gpu"}, "noExecute": true, "deviceMetadata": true, "kubeletDir": "/data/kubelet", "cdiDir": "/etc/cdi"}},
		{"simulate", map[string]any{"simulate": "dgx-h100", "dra": map[string]any{"enabled": true, "devices": []any{"mig", "nic"}}},
			map[string]any{"devices": []any{"mig", "nic"}, "noExecute": false, "kubeletDir": "/var/lib/kubelet", "cdiDir": "/var/run/cdi"}},
		// The first step of turning DRA off: no kind, mounts and RBAC kept
		// so the agent can hand the kinds back.
		{"no kind", map[string]any{"dra": map[string]any{"enabled": true, "devices": []any{}}},
			map[string]any{"devices": []any{}, "noExecute": false, "kubeletDir": "/var/lib/kubelet", "cdiDir": "/var/run/cdi"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := draConfig(t, tt.vals)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("config dra section %v, want %v", got, tt.want)
			}
			// The DaemonSet passes the device-plugin dir whose parent is
			// the kubelet dir the config names.
			ds := decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml")
			if arg := "--device-plugin-dir=" + tt.want["kubeletDir"].(string) + "/device-plugins"; !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, arg) {
				t.Errorf("args %v lack %s", ds.Spec.Template.Spec.Containers[0].Args, arg)
			}
		})
	}
}

// TestDRAConfigKeysAreTheAgents: the agent reads its config strictly, so
// every key of the rendered dra section must be one the agent declares:
// the section itself and each key are JSON field tags in the agent's
// config code (cmd/gpu-node-agent, or the dra and agent packages it may
// take the section's type from).
func TestDRAConfigKeysAreTheAgents(t *testing.T) {
	var src strings.Builder
	for _, dir := range []string{"cmd/gpu-node-agent", "agent", "dra"} {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	tags := map[string]bool{}
	for _, m := range regexp.MustCompile(`json:"([A-Za-z0-9-]+)[,"]`).FindAllStringSubmatch(src.String(), -1) {
		tags[m[1]] = true
	}
	d := draConfig(t, map[string]any{"dra": map[string]any{"enabled": true, "deviceMetadata": true, "migOnDemand": true,
		"sharing": map[string]any{"enabled": true}}})
	for _, k := range append([]string{"dra"}, slices.Sorted(maps.Keys(d))...) {
		if !tags[k] {
			t.Errorf("config key %q (dra section) is not a JSON field of the agent's config; the agent would refuse the file", k)
		}
	}
}

// TestDRAValuesRefused: dra values the agent could not serve fail the
// render with a message naming the value.
func TestDRAValuesRefused(t *testing.T) {
	ch := loadChart(t)
	for _, tt := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"unknown kind", map[string]any{"dra": map[string]any{"enabled": true, "devices": []any{"gpu", "fpga"}}}, `dra.devices: unknown device kind "fpga"`},
		{"kind twice", map[string]any{"dra": map[string]any{"enabled": true, "devices": []any{"gpu", "gpu"}}}, "dra.devices names a kind twice"},
		{"not a list", map[string]any{"dra": map[string]any{"enabled": true, "devices": "gpu"}}, "dra.devices must be a list"},
		{"relative cdi dir", map[string]any{"dra": map[string]any{"enabled": true, "cdiDir": "run/cdi"}}, `dra.cdiDir must be an absolute path, got "run/cdi"`},
		{"no state dir on real GPUs", map[string]any{"stateDir": "", "dra": map[string]any{"enabled": true}}, "dra.enabled needs stateDir"},
		{"mig on demand without mig", map[string]any{"dra": map[string]any{"enabled": true, "devices": []any{"gpu", "nic"}, "migOnDemand": true}}, "dra.migOnDemand needs mig in dra.devices"},
		{"dra section in config", map[string]any{"config": map[string]any{"dra": map[string]any{"devices": []any{"gpu"}}}}, "config.dra is written by the chart"},
		{"kernel log from the journal", map[string]any{"config": map[string]any{"health": map[string]any{"kernelLog": "journal"}}}, "config.health.kernelLog journal runs the host's journalctl"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(ch, tt.vals)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render error %v, want one containing %q", err, tt.want)
			}
		})
	}
	// Simulate keeps its state under the simulator's root: no stateDir needed.
	if _, err := Render(ch, map[string]any{"simulate": "dgx-h100", "stateDir": "", "dra": map[string]any{"enabled": true}}); err != nil {
		t.Errorf("simulate with DRA and no stateDir: %v", err)
	}
}

// TestSharingValues: the agent config's sharing section reaches the
// ConfigMap as written; nvidiaConfig mounts the named ConfigMap's entry
// read-only and passes it with --nvidia-config, refuses a ConfigMap without
// a key, and leaves the DaemonSet as it was when unset.
func TestSharingValues(t *testing.T) {
	sharing := map[string]any{"timeSlicing": map[string]any{
		"failRequestsGreaterThanOne": true,
		"resources":                  []any{map[string]any{"name": "nvidia.com/gpu", "replicas": 4}},
	}}
	files := render(t, map[string]any{"config": map[string]any{"mig-strategy": "mixed", "sharing": sharing}})
	cm := decode[corev1.ConfigMap](t, files, "configmap.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	want := map[string]any{"timeSlicing": map[string]any{
		"failRequestsGreaterThanOne": true,
		"resources":                  []any{map[string]any{"name": "nvidia.com/gpu", "replicas": float64(4)}},
	}}
	if !reflect.DeepEqual(cfg["sharing"], want) {
		t.Errorf("config sharing = %v, want %v", cfg["sharing"], want)
	}

	const arg = "--nvidia-config=/etc/gpu-node-agent/nvidia/config.yaml"
	agent := func(ds *appsv1.DaemonSet) *corev1.Container { return &ds.Spec.Template.Spec.Containers[0] }
	ds := decode[appsv1.DaemonSet](t, render(t, nil), "daemonset.yaml")
	if slices.Contains(agent(ds).Args, arg) || slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "nvidia-config" }) {
		t.Error("nvidia-config rendered by default")
	}

	ds = decode[appsv1.DaemonSet](t, render(t, map[string]any{"nvidiaConfig": map[string]any{"configMap": "time-slicing-config-all", "key": "any"}}), "daemonset.yaml")
	if !slices.Contains(agent(ds).Args, arg) {
		t.Errorf("args %v lack %s", agent(ds).Args, arg)
	}
	if m := mounts(agent(ds))["nvidia-config"]; m.MountPath != "/etc/gpu-node-agent/nvidia" || !m.ReadOnly {
		t.Errorf("nvidia-config mount %+v, want read-only at /etc/gpu-node-agent/nvidia", m)
	}
	i := slices.IndexFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "nvidia-config" })
	if i < 0 {
		t.Fatal("no nvidia-config volume")
	}
	v := ds.Spec.Template.Spec.Volumes[i]
	if v.ConfigMap == nil || v.ConfigMap.Name != "time-slicing-config-all" ||
		!reflect.DeepEqual(v.ConfigMap.Items, []corev1.KeyToPath{{Key: "any", Path: "config.yaml"}}) {
		t.Errorf("nvidia-config volume %+v, want ConfigMap time-slicing-config-all, entry any as config.yaml", v.VolumeSource)
	}

	_, err := Render(loadChart(t), map[string]any{"nvidiaConfig": map[string]any{"configMap": "time-slicing-config-all"}})
	if err == nil || !strings.Contains(err.Error(), "nvidiaConfig.key: name the entry of ConfigMap nvidiaConfig.configMap") {
		t.Errorf("ConfigMap without a key: %v", err)
	}
}

// TestSurgeUpdateStrategy: a surge set in the values renders as given on
// real GPUs (for kubelets 1.37+), and becomes maxUnavailable of the same
// size on simulated nodes, whose pods cannot share a node (host ports,
// one simulator tree).
func TestSurgeUpdateStrategy(t *testing.T) {
	surge := map[string]any{"updateStrategy": map[string]any{"type": "RollingUpdate",
		"rollingUpdate": map[string]any{"maxSurge": "10%", "maxUnavailable": 0}}}
	ds := decode[appsv1.DaemonSet](t, render(t, surge), "daemonset.yaml")
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || ru.MaxSurge.String() != "10%" ||
		ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("real GPUs with a surge: updateStrategy %+v, want maxSurge 10%% and maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
	surge["simulate"] = "dgx-h100"
	ds = decode[appsv1.DaemonSet](t, render(t, surge), "daemonset.yaml")
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge != nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "10%" {
		t.Errorf("simulate with a surge: updateStrategy %+v, want maxUnavailable 10%% and no surge", ds.Spec.UpdateStrategy)
	}
}

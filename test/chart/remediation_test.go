package chart

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// remediationValues are chart values with config.remediation set to rem
// and MIG not served, so that CAP_SYS_ADMIN can come only from a reset.
func remediationValues(rem map[string]any) map[string]any {
	return map[string]any{"config": map[string]any{"mig-strategy": "none", "remediation": rem}}
}

// clusterRoleRules maps each resource of the ClusterRole to its verbs.
func clusterRoleRules(t *testing.T, files map[string]string) map[string][]string {
	t.Helper()
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict([]byte(docs(files["rbac.yaml"])[0]), &role); err != nil {
		t.Fatal(err)
	}
	if role.Kind != "ClusterRole" {
		t.Fatalf("rbac.yaml's first document is a %s, want the ClusterRole", role.Kind)
	}
	out := map[string][]string{}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			out[res] = append(out[res], r.Verbs...)
		}
	}
	return out
}

// policyVariables maps the admission policy's variables to expressions.
func policyVariables(t *testing.T, files map[string]string) (map[string]string, []admissionregistrationv1.Validation) {
	t.Helper()
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := yaml.UnmarshalStrict([]byte(docs(files["validatingadmissionpolicy.yaml"])[0]), &policy); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range policy.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	return vars, policy.Spec.Validations
}

func agentContainer(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == "agent" {
			return c
		}
	}
	t.Fatalf("no agent container in %+v", ds.Spec.Template.Spec.Containers)
	return nil
}

// TestRemediationPrivileges: each remediation step adds to the pod only
// what it needs, and only when enabled: drain the RBAC to read and evict
// pods, reset CAP_SYS_ADMIN, reboot a read-write mount of the sentinel's
// host directory and its condition in the admission policy.
func TestRemediationPrivileges(t *testing.T) {
	type want struct {
		evictRBAC  bool
		sysAdmin   bool
		sentinel   string // the sentinel's host directory ("": not mounted)
		rebootCond string // the admission policy's rebootConditionType
	}
	tests := []struct {
		name string
		vals map[string]any
		want want
	}{
		{name: "chart defaults", vals: nil, want: want{rebootCond: "''"}},
		{name: "no MIG, remediation unset", vals: remediationValues(map[string]any{}), want: want{rebootCond: "''"}},
		{name: "every step present but off", vals: remediationValues(map[string]any{
			"reset":  map[string]any{"enabled": false},
			"drain":  map[string]any{"enabled": false},
			"reboot": map[string]any{"enabled": false, "sentinelPath": "relative/unused"},
		}), want: want{rebootCond: "''"}},
		{name: "drain and reset", vals: remediationValues(map[string]any{
			"reset": map[string]any{"enabled": true},
			"drain": map[string]any{"enabled": true, "gracePeriod": "30s"},
		}), want: want{evictRBAC: true, sysAdmin: true, rebootCond: "''"}},
		{name: "drain alone", vals: remediationValues(map[string]any{
			"drain": map[string]any{"enabled": true},
		}), want: want{evictRBAC: true, rebootCond: "''"}},
		{name: "reset alone", vals: remediationValues(map[string]any{
			"reset": map[string]any{"enabled": true},
		}), want: want{sysAdmin: true, rebootCond: "''"}},
		{name: "reset in dry run still needs nothing less", vals: remediationValues(map[string]any{
			"reset": map[string]any{"enabled": true, "dryRun": true},
		}), want: want{sysAdmin: true, rebootCond: "''"}},
		{name: "reboot", vals: remediationValues(map[string]any{
			"reboot": map[string]any{"enabled": true, "sentinelPath": "/var/run/gna/reboot-required"},
		}), want: want{sentinel: "/var/run/gna", rebootCond: "'GPURebootRequired'"}},
		{name: "reboot with its own condition type", vals: remediationValues(map[string]any{
			"reboot": map[string]any{"enabled": true, "sentinelPath": "/var/run/gna/reboot-required", "conditionType": "NeedsReboot"},
		}), want: want{sentinel: "/var/run/gna", rebootCond: "'NeedsReboot'"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files := render(t, tc.vals)

			rules := clusterRoleRules(t, files)
			_, evict := rules["pods/eviction"]
			if !tc.want.evictRBAC && evict {
				t.Errorf("ClusterRole grants pods/eviction %v; want none without drain", rules["pods/eviction"])
			}
			if tc.want.evictRBAC && !slices.Equal(rules["pods/eviction"], []string{"create"}) {
				t.Errorf("ClusterRole grants pods/eviction %v; want exactly [create]", rules["pods/eviction"])
			}
			// get pods: the drain's, and the move advice's (on by default).
			if !slices.Equal(rules["pods"], []string{"get"}) {
				t.Errorf("ClusterRole grants pods %v; want exactly [get]", rules["pods"])
			}

			ds := decode[appsv1.DaemonSet](t, files, "daemonset.yaml")
			c := agentContainer(t, ds)
			sc := c.SecurityContext
			if sc == nil || sc.Capabilities == nil {
				t.Fatalf("agent securityContext %+v has no capabilities", sc)
			}
			if n := countCap(sc.Capabilities.Add, "SYS_ADMIN"); tc.vals != nil && (n > 0) != tc.want.sysAdmin {
				// (The chart defaults serve MIG, which adds SYS_ADMIN.)
				t.Errorf("capabilities add %v; want SYS_ADMIN %v", sc.Capabilities.Add, tc.want.sysAdmin)
			}
			if tc.want.sysAdmin && sc.AllowPrivilegeEscalation != nil {
				// The API server refuses false together with CAP_SYS_ADMIN.
				t.Errorf("allowPrivilegeEscalation %v with CAP_SYS_ADMIN, want it unset", *sc.AllowPrivilegeEscalation)
			}
			if !tc.want.sysAdmin && tc.vals != nil && (sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation) {
				t.Errorf("allowPrivilegeEscalation %v without CAP_SYS_ADMIN, want false", sc.AllowPrivilegeEscalation)
			}

			spec := &ds.Spec.Template.Spec
			var vol *corev1.Volume
			for i := range spec.Volumes {
				if spec.Volumes[i].Name == "reboot-sentinel" {
					vol = &spec.Volumes[i]
				}
			}
			m, mounted := mounts(c)["reboot-sentinel"]
			switch {
			case tc.want.sentinel == "" && (vol != nil || mounted):
				t.Errorf("reboot-sentinel volume %+v mounted %v without reboot", vol, mounted)
			case tc.want.sentinel == "":
			case vol == nil || vol.HostPath == nil:
				t.Errorf("reboot-sentinel volume %+v, want hostPath %s", vol, tc.want.sentinel)
			case vol.HostPath.Path != tc.want.sentinel || vol.HostPath.Type == nil || *vol.HostPath.Type != corev1.HostPathDirectoryOrCreate:
				t.Errorf("reboot-sentinel hostPath %s type %v, want %s type DirectoryOrCreate", vol.HostPath.Path, vol.HostPath.Type, tc.want.sentinel)
			case !mounted || m.MountPath != "/host"+tc.want.sentinel || m.ReadOnly:
				t.Errorf("reboot-sentinel mounted %v: %+v; want read-write at /host%s", mounted, m, tc.want.sentinel)
			}

			vars, validations := policyVariables(t, files)
			if got := vars["rebootConditionType"]; got != tc.want.rebootCond {
				t.Errorf("admission policy variable rebootConditionType = %q, want %q", got, tc.want.rebootCond)
			}
			if !slices.ContainsFunc(validations, func(v admissionregistrationv1.Validation) bool {
				return strings.Contains(v.Expression, "c.type in [variables.conditionType, variables.preflightConditionType, variables.rebootConditionType]")
			}) {
				t.Errorf("no validation lets the agent change the reboot condition: %+v", validations)
			}
		})
	}
}

// TestRemediationSysAdminOnce: a reset with MIG served asks for
// CAP_SYS_ADMIN once, and no reset adds nothing on a simulated node.
func TestRemediationSysAdminOnce(t *testing.T) {
	reset := map[string]any{"reset": map[string]any{"enabled": true}}
	for _, tt := range []struct {
		name string
		vals map[string]any
		want int
	}{
		{name: "reset with MIG served", vals: map[string]any{"config": map[string]any{"mig-strategy": "mixed", "remediation": reset}}, want: 1},
		{name: "reset on a simulated node", vals: map[string]any{"simulate": "dgx-h100", "config": map[string]any{"mig-strategy": "none", "remediation": reset}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := agentContainer(t, decode[appsv1.DaemonSet](t, render(t, tt.vals), "daemonset.yaml"))
			var add []corev1.Capability
			if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil {
				add = sc.Capabilities.Add
			}
			if got := countCap(add, "SYS_ADMIN"); got != tt.want {
				t.Errorf("capabilities add %v: SYS_ADMIN %d times, want %d", add, got, tt.want)
			}
		})
	}
}

// TestRemediationSentinelPathMustBeAbsolute: a reboot whose sentinel path
// is relative is refused at render time, naming the value.
func TestRemediationSentinelPathMustBeAbsolute(t *testing.T) {
	ch := loadChart(t)
	for _, bad := range []string{"var/run/reboot-required", "reboot-required", "./reboot-required"} {
		_, err := Render(ch, remediationValues(map[string]any{
			"reboot": map[string]any{"enabled": true, "sentinelPath": bad},
		}))
		if err == nil || !strings.Contains(err.Error(), "sentinelPath must be an absolute path") || !strings.Contains(err.Error(), bad) {
			t.Errorf("sentinelPath %q: err %v, want it refused", bad, err)
		}
	}
}

// countCap counts c in caps, with or without the CAP_ prefix (the API
// takes both).
func countCap(caps []corev1.Capability, c string) int {
	n := 0
	for _, have := range caps {
		if strings.TrimPrefix(string(have), "CAP_") == c {
			n++
		}
	}
	return n
}

// TestRemediationSentinelDirectoryOwn: a sentinel whose directory holds
// the host's sockets or configuration (kured's own default among them) is
// refused, since that directory would be mounted read-write.
func TestRemediationSentinelDirectoryOwn(t *testing.T) {
	ch := loadChart(t)
	for _, bad := range []string{"/var/run/reboot-required", "/run/reboot-required", "/reboot-required", "/etc/reboot-required"} {
		_, err := Render(ch, remediationValues(map[string]any{
			"reboot": map[string]any{"enabled": true, "sentinelPath": bad},
		}))
		if err == nil || !strings.Contains(err.Error(), "would be mounted read-write") {
			t.Errorf("sentinelPath %q: err %v, want it refused", bad, err)
		}
	}
	if _, err := Render(ch, remediationValues(map[string]any{"reboot": map[string]any{"enabled": true}})); err != nil {
		t.Errorf("the default sentinel path: %v", err)
	}
}

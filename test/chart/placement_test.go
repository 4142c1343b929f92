package chart

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestMoveAdvicePrivileges: the move advice (config.placement.moveAdvice,
// on by default) adds get on pods to the ClusterRole and nothing else (no
// eviction: it is advice); off, no pod right is left unless the drain
// needs get and eviction. The agent reads the switch from its config
// file, and the admission policy lets it write its annotation
// (gpu-node-agent.io/*) on its own Node.
func TestMoveAdvicePrivileges(t *testing.T) {
	tests := []struct {
		name             string
		config           map[string]any
		wantGet, wantEvi bool
		wantAdvice       bool
	}{
		{name: "chart defaults", wantGet: true, wantAdvice: true},
		{name: "advice off", config: map[string]any{"placement": map[string]any{"moveAdvice": false}}},
		{name: "advice off, drain on", config: map[string]any{"placement": map[string]any{"moveAdvice": false},
			"remediation": map[string]any{"reset": map[string]any{"enabled": true}, "drain": map[string]any{"enabled": true}}},
			wantGet: true, wantEvi: true},
		{name: "advice and drain", config: map[string]any{
			"remediation": map[string]any{"reset": map[string]any{"enabled": true}, "drain": map[string]any{"enabled": true}}},
			wantGet: true, wantEvi: true, wantAdvice: true},
		{name: "placement section without the key", config: map[string]any{"placement": map[string]any{}}, wantGet: true, wantAdvice: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if tc.config != nil {
				vals = map[string]any{"config": tc.config}
			}
			files := render(t, vals)
			rules := clusterRoleRules(t, files)
			if got, ok := rules["pods"]; ok != tc.wantGet || ok && !slices.Equal(got, []string{"get"}) {
				t.Errorf("pods verbs %v (granted %v); want [get] %v", got, ok, tc.wantGet)
			}
			if _, ok := rules["pods/eviction"]; ok != tc.wantEvi {
				t.Errorf("pods/eviction granted %v, want %v", ok, tc.wantEvi)
			}
			cm := decode[corev1.ConfigMap](t, files, "configmap.yaml")
			var cfg struct {
				Placement *struct {
					MoveAdvice *bool `json:"moveAdvice"`
				} `json:"placement"`
			}
			if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			// Absent means the agent's default, on.
			on := cfg.Placement == nil || cfg.Placement.MoveAdvice == nil || *cfg.Placement.MoveAdvice
			if on != tc.wantAdvice {
				t.Errorf("the agent's config has the move advice %v, want %v", on, tc.wantAdvice)
			}
			vars, _ := policyVariables(t, files)
			if !strings.Contains(vars["foreignAnnotations"], "!k.startsWith('gpu-node-agent.io/')") {
				t.Errorf("the admission policy's annotation rule %q does not let the agent write gpu-node-agent.io/move-advice", vars["foreignAnnotations"])
			}
		})
	}
}

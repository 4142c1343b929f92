package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestRenderedChartConfigLoads reads the config file the Helm chart ships
// (deploy/manifests, rendered from the chart's defaults) and loads it the
// way the DaemonSet's agent will: strictly, then validated. A chart key the
// agent does not know, or a bad value, fails here instead of crash-looping
// every agent pod.
func TestRenderedChartConfigLoads(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "manifests", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatalf("configmap.yaml: %v", err)
	}
	data, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("configmap has no config.yaml; keys %v", cm.Data)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NODE_NAME": "gpu-1"} // the DaemonSet sets it
	cfg, err := loadConfig([]string{"--config", path}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatalf("load chart config: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("chart config does not validate: %v", err)
	}
	if cfg.Taint.Key != "gpu-node-agent.io/unhealthy" {
		t.Errorf("taint key from chart = %q; the DaemonSet tolerates gpu-node-agent.io/unhealthy", cfg.Taint.Key)
	}
}

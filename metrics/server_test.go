package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// startServer runs a metrics server for a collected mock node on a
// loopback port and returns its base URL.
func startServer(t *testing.T, cfg ServerConfig, ready func() error) string {
	t.Helper()
	mn := newMockNode(t, 2, nil)
	reg := NewRegistry("v1.2.3")
	c, err := NewCollector(newSampler(t, mn.lib, mn.node, patientTimeout), Config{Hostname: "node-1"}, reg, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(mn.node)
	collectNow(t, c)

	cfg.Address = "127.0.0.1:0"
	s, err := Listen(cfg, reg, ready, discardLogger())
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + s.Addr().String()
}

func get(t *testing.T, url string, auth ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServerEndpoints(t *testing.T) {
	var notReady atomic.Pointer[error]
	errNotRegistered := errors.New("plugin not registered with the kubelet")
	notReady.Store(&errNotRegistered)
	base := startServer(t, ServerConfig{}, func() error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return nil
	})

	tests := []struct {
		name     string
		path     string
		before   func()
		wantCode int
		want     []string
	}{
		{"healthz", "/healthz", nil, 200, []string{"ok"}},
		{"readyz before ready", "/readyz", nil, 503, []string{"plugin not registered"}},
		{"readyz after ready", "/readyz", func() { notReady.Store(nil) }, 200, []string{"ok"}},
		{"metrics", "/metrics", nil, 200, []string{
			"# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n",
			`DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="570.172.08",GPU_I_ID="",GPU_I_PROFILE="",Hostname="node-1",UUID="GPU-00000000-0000-0000-0000-000000000001"`,
			`gpu_node_agent_build_info{goversion="go`,
			"promhttp_metric_handler_requests_total",
			"process_resident_memory_bytes",
		}},
		{"unknown path", "/nope", nil, 404, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			code, body := get(t, base+tt.path)
			if code != tt.wantCode {
				t.Errorf("status = %d, want %d (body %q)", code, tt.wantCode, body)
			}
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("body lacks %q", w)
				}
			}
		})
	}
}

func TestServerBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  prom: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startServer(t, ServerConfig{WebConfigFile: webConfig}, nil)

	tests := []struct {
		name string
		auth []string
		want int
	}{
		{"no credentials", nil, http.StatusUnauthorized},
		{"wrong password", []string{"prom", "nope"}, http.StatusUnauthorized},
		{"right password", []string{"prom", "s3cret"}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, _ := get(t, base+"/metrics", tt.auth...); code != tt.want {
				t.Errorf("status = %d, want %d", code, tt.want)
			}
		})
	}
}

func TestListenRejectsBadWebConfig(t *testing.T) {
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: /nonexistent.crt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Listen(ServerConfig{Address: "127.0.0.1:0", WebConfigFile: webConfig}, NewRegistry("x"), nil, discardLogger())
	if err == nil || !strings.Contains(err.Error(), "web config") {
		t.Errorf("Listen with a broken web config: err = %v, want a web config error", err)
	}
}

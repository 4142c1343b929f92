package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func newTestNode(t *testing.T, profile string, opts ...ProfileOption) *Node {
	t.Helper()
	spec, err := Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestControlHandler(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		path     string
		body     string
		wantCode int
		wantBody string
		// check runs against the node after the request.
		check func(t *testing.T, n *Node)
	}{
		{name: "mig on", method: "POST", path: "/mig", body: `{"gpu":1,"profiles":["3g.40gb","3g.40gb"]}`, wantCode: 200, wantBody: `"3g.40gb"`,
			check: func(t *testing.T, n *Node) {
				g := n.Spec().GPUs[1]
				if !g.MIGEnabled || len(g.MIG) != 2 {
					t.Errorf("gpu 1 after POST /mig: enabled %t, %d devices", g.MIGEnabled, len(g.MIG))
				}
			}},
		{name: "mig off", method: "POST", path: "/mig", body: `{"gpu":0,"profiles":[]}`, wantCode: 200,
			check: func(t *testing.T, n *Node) {
				if g := n.Spec().GPUs[0]; g.MIGEnabled || len(g.MIG) != 0 {
					t.Errorf("gpu 0 still has MIG: %+v", g.MIG)
				}
			}},
		{name: "mig unknown gpu", method: "POST", path: "/mig", body: `{"gpu":8,"profiles":[]}`, wantCode: 400, wantBody: "gpu: no such gpu 8"},
		{name: "mig gpu missing", method: "POST", path: "/mig", body: `{"profiles":["7g.80gb"]}`, wantCode: 400, wantBody: "gpu: required"},
		{name: "mig bad profile", method: "POST", path: "/mig", body: `{"gpu":1,"profiles":["9g.99gb"]}`, wantCode: 400, wantBody: `profiles: set mig layout: gpu 1: mig profile "9g.99gb" is not offered`},
		{name: "mig does not fit", method: "POST", path: "/mig", body: `{"gpu":1,"profiles":["4g.40gb","4g.40gb"]}`, wantCode: 400, wantBody: "profiles:"},
		{name: "mig bad json", method: "POST", path: "/mig", body: `{"gpu":`, wantCode: 400, wantBody: "invalid JSON body"},
		{name: "mig wrong type", method: "POST", path: "/mig", body: `{"gpu":"one"}`, wantCode: 400, wantBody: "gpu: want int"},
		{name: "mig unknown field", method: "POST", path: "/mig", body: `{"gpu":1,"layout":[]}`, wantCode: 400, wantBody: `unknown field "layout"`},
		{name: "fault unknown gpu", method: "POST", path: "/faults", body: `{"kind":"xid","gpu":-2,"xid":79}`, wantCode: 400, wantBody: "gpu: no such gpu -2"},
		{name: "xid without a device", method: "POST", path: "/faults", body: `{"kind":"xid","gpu":-1,"xid":79}`, wantCode: 204},
		{name: "no device for other kinds", method: "POST", path: "/faults", body: `{"kind":"ecc-dbe","gpu":-1}`, wantCode: 400, wantBody: "gpu: no such gpu -1"},
		{name: "no device with a gpu instance", method: "POST", path: "/faults", body: `{"kind":"xid","gpu":-1,"xid":79,"gi":1}`, wantCode: 400, wantBody: "gpu: -1"},
		{name: "gpu instance for another kind", method: "POST", path: "/faults", body: `{"kind":"gpu-lost","gpu":0,"gi":0}`, wantCode: 400, wantBody: "gi: only for"},
		{name: "gpu reset cannot be cleared", method: "DELETE", path: "/faults", body: `{"kind":"gpu-reset","gpu":0}`, wantCode: 400, wantBody: "instantaneous"},
		{name: "unknown kind lists the new ones", method: "POST", path: "/faults", body: `{"kind":"melted","gpu":0}`, wantCode: 400, wantBody: "gpu-reset, reset-fail, reset-hang, hang, gpu-missing, fabric-not-ready"},
		{name: "calls", method: "GET", path: "/calls", wantCode: 200, wantBody: `{`},
		{name: "fault kind missing", method: "POST", path: "/faults", body: `{"gpu":0}`, wantCode: 400, wantBody: "kind: required"},
		{name: "fault clear bad json", method: "DELETE", path: "/faults", body: `[]`, wantCode: 400, wantBody: "Fault"},
		{name: "port down", method: "POST", path: "/faults", body: `{"kind":"port-down","nic":"mlx5_2"}`, wantCode: 204,
			check: func(t *testing.T, n *Node) {
				b, err := os.ReadFile(filepath.Join(n.HostRoot(), "sys/class/infiniband/mlx5_2/ports/1/state"))
				if err != nil || !strings.Contains(string(b), "DOWN") {
					t.Errorf("mlx5_2 port state after port-down = %q, %v; want DOWN", b, err)
				}
			}},
		{name: "port down without nic", method: "POST", path: "/faults", body: `{"kind":"port-down"}`, wantCode: 400, wantBody: "nic: required"},
		{name: "port down unknown nic", method: "POST", path: "/faults", body: `{"kind":"port-down","nic":"mlx5_99"}`, wantCode: 400, wantBody: `no such nic`},
		{name: "nic flap without nic", method: "POST", path: "/faults", body: `{"kind":"nic-flap"}`, wantCode: 400, wantBody: "nic: required"},
		{name: "nic flap bad period", method: "POST", path: "/faults", body: `{"kind":"nic-flap","nic":"mlx5_2","period":"often"}`, wantCode: 400, wantBody: `period: "often" is not a positive duration`},
		{name: "nic errors negative count", method: "POST", path: "/faults", body: `{"kind":"nic-errors","nic":"mlx5_2","count":-1}`, wantCode: 400, wantBody: "count: -1 is negative"},
		{name: "nic errors unknown nic", method: "DELETE", path: "/faults", body: `{"kind":"nic-errors","nic":"mlx5_99"}`, wantCode: 400, wantBody: `no such nic`},
		{name: "state", method: "GET", path: "/state", wantCode: 200, wantBody: `"uuid": "GPU-`},
		{name: "wrong method", method: "PUT", path: "/mig", body: `{}`, wantCode: 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, "dgx-h100", WithMIG(0, "7g.80gb"))
			srv := httptest.NewServer(n.ControlHandler())
			defer srv.Close()
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body strings.Builder
			_, _ = io.Copy(&body, resp.Body)
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, tc.wantCode, body.String())
			}
			if !strings.Contains(body.String(), tc.wantBody) {
				t.Errorf("body %q does not contain %q", body.String(), tc.wantBody)
			}
			if tc.check != nil {
				tc.check(t, n)
			}
		})
	}
}

func TestControlStateIsSpecJSON(t *testing.T) {
	n := newTestNode(t, "pcie-8gpu")
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/state", nil))
	got, err := topology.ParseSnapshot(rec.Body.Bytes())
	if err != nil {
		t.Fatalf("GET /state is not a valid snapshot: %v", err)
	}
	if len(got.GPUs) != 8 || got.GPUs[5].UUID != n.Spec().GPUs[5].UUID {
		t.Errorf("state does not describe the node")
	}
}

func TestServeControlRefusesNonLoopback(t *testing.T) {
	tests := []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:0", true},
		{"[::1]:0", true},
		{"localhost:0", true},
		{":0", false},
		{"0.0.0.0:0", false},
		{"[::]:0", false},
		{"10.0.0.1:7777", false},
		{"example.com:7777", false},
		{"no-port", false},
	}
	n := newTestNode(t, "dgx-a100")
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- ServeControl(ctx, tc.addr, n.ControlHandler(), nil) }()
			if !tc.ok {
				defer cancel()
				select {
				case err := <-errc:
					if err == nil || !strings.Contains(err.Error(), tc.addr) {
						t.Fatalf("ServeControl(%q) = %v, want a refusal naming the address", tc.addr, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("ServeControl(%q) is serving; want refusal", tc.addr)
				}
				return
			}
			// Loopback: it serves until cancelled, then returns nil.
			select {
			case err := <-errc:
				if strings.Contains(err.Error(), "cannot assign") || strings.Contains(err.Error(), "address family") {
					t.Skipf("no %s on this machine: %v", tc.addr, err)
				}
				t.Fatalf("ServeControl(%q) returned early: %v", tc.addr, err)
			case <-time.After(100 * time.Millisecond):
			}
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Fatalf("ServeControl after cancel = %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("ServeControl did not stop when its context ended")
			}
		})
	}
}

func TestControlRoundTripOverLoopback(t *testing.T) {
	n := newTestNode(t, "dgx-a100")
	srv := httptest.NewServer(n.ControlHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/mig", "application/json", strings.NewReader(`{"gpu":3,"profiles":["1g.5gb","1g.5gb","1g.5gb"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var g topology.GPU
	if err := json.NewDecoder(resp.Body).Decode(&g); err != nil {
		t.Fatal(err)
	}
	if g.Index != 3 || len(g.MIG) != 3 || g.MIG[2].Profile != "1g.5gb" {
		t.Errorf("POST /mig answered %+v", g)
	}
	select {
	case <-n.Changed():
	default:
		t.Error("Changed not signalled by POST /mig")
	}
}

package sim

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
)

// readPortFile reads ports/1/<rel> of nic in n's simulated sysfs.
func readPortFile(t *testing.T, n *Node, nic, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.HostRoot(), "sys/class/infiniband", nic, "ports/1", rel))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func readCounter(t *testing.T, n *Node, nic, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(readPortFile(t, n, nic, "counters/"+name), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func postFault(t *testing.T, h http.Handler, method, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("%s /faults %s: %d %s", method, body, rec.Code, rec.Body)
	}
}

// TestNICFlapFault: nic-flap on the control endpoint counts link downs and
// takes the port down and up until cleared, which leaves it up.
func TestNICFlapFault(t *testing.T) {
	n := newSim(t, "dgx-h100")
	h := n.ControlHandler()
	for _, c := range []string{"symbol_error", "link_downed", "port_rcv_errors"} {
		if v := readCounter(t, n, "mlx5_3", c); v != 0 {
			t.Errorf("%s starts at %d, want 0", c, v)
		}
	}
	postFault(t, h, "POST", `{"kind":"nic-flap","nic":"mlx5_3","period":"20ms"}`)
	sawDown := false
	testutil.WaitFor(t, "three link downs with the port seen down", func() bool {
		sawDown = sawDown || strings.Contains(readPortFile(t, n, "mlx5_3", "state"), "DOWN")
		return sawDown && readCounter(t, n, "mlx5_3", "link_downed") >= 3
	})
	postFault(t, h, "DELETE", `{"kind":"nic-flap","nic":"mlx5_3"}`)
	after := readCounter(t, n, "mlx5_3", "link_downed")
	if s := readPortFile(t, n, "mlx5_3", "state"); s != "4: ACTIVE" {
		t.Errorf("port state after the flap cleared = %q, want 4: ACTIVE", s)
	}
	if v := readCounter(t, n, "mlx5_2", "link_downed"); v != 0 {
		t.Errorf("mlx5_2 link_downed = %d, want 0 (only mlx5_3 flaps)", v)
	}
	// Cleared means no goroutine left: the counter no longer moves.
	postFault(t, h, "POST", `{"kind":"nic-errors","nic":"mlx5_3","period":"1h","count":1}`)
	postFault(t, h, "DELETE", `{"kind":"nic-errors","nic":"mlx5_3"}`)
	if v := readCounter(t, n, "mlx5_3", "link_downed"); v != after {
		t.Errorf("link_downed went from %d to %d after the flap was cleared", after, v)
	}
}

// TestNICErrorsFault: nic-errors raises symbol_error and port_rcv_errors by
// Count every Period, from the moment it is injected.
func TestNICErrorsFault(t *testing.T) {
	n := newSim(t, "dgx-h100")
	h := n.ControlHandler()
	postFault(t, h, "POST", `{"kind":"nic-errors","nic":"mlx5_1","period":"1h","count":7}`)
	if v := readCounter(t, n, "mlx5_1", "symbol_error"); v != 7 {
		t.Errorf("symbol_error = %d right after injection, want 7", v)
	}
	if v := readCounter(t, n, "mlx5_1", "port_rcv_errors"); v != 7 {
		t.Errorf("port_rcv_errors = %d right after injection, want 7", v)
	}
	postFault(t, h, "DELETE", `{"kind":"nic-errors","nic":"mlx5_1"}`)
	postFault(t, h, "POST", `{"kind":"nic-errors","nic":"mlx5_1","period":"5ms"}`)
	testutil.WaitFor(t, "symbol_error rising by the default 100", func() bool { return readCounter(t, n, "mlx5_1", "symbol_error") >= 307 })
	postFault(t, h, "DELETE", `{"kind":"nic-errors","nic":"mlx5_1"}`)
	if s := readPortFile(t, n, "mlx5_1", "state"); s != "4: ACTIVE" {
		t.Errorf("nic-errors changed the port state to %q", s)
	}
}

package nvmlowner

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// fault injects a simulator fault through its control endpoint.
func fault(t *testing.T, n *sim.Node, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("POST /faults %s: %d %s", body, rec.Code, rec.Body.String())
	}
}

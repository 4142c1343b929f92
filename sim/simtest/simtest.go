// Package simtest injects faults into an in-process simulated node the
// way its control API takes them, for tests of the packages that watch
// the node.
package simtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// Fault sends method (POST to inject, DELETE to clear) with the JSON fault
// body to n's control handler, failing the test unless it is accepted.
func Fault(t testing.TB, n *sim.Node, method, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("%s /faults %s: %d %s", method, body, rec.Code, rec.Body.String())
	}
}

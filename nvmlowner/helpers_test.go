package nvmlowner

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

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

// notSupportedByDefault makes every unset XxxFunc field of a go-nvml mock
// answer ERROR_NOT_SUPPORTED (an unset one panics).
func notSupportedByDefault(mockPtr any) {
	v := reflect.ValueOf(mockPtr).Elem()
	ret := reflect.TypeOf(nvml.SUCCESS)
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !strings.HasSuffix(v.Type().Field(i).Name, "Func") || f.Kind() != reflect.Func || !f.IsNil() {
			continue
		}
		ft := f.Type()
		f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			out := make([]reflect.Value, ft.NumOut())
			for k := range out {
				out[k] = reflect.Zero(ft.Out(k))
				if ft.Out(k) == ret {
					out[k] = reflect.ValueOf(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			return out
		}))
	}
}

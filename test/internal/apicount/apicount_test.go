package apicount

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCounterRefusals checks that the counting transport classifies
// refused requests by cause and leaves the body readable for client-go.
func TestCounterRefusals(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   string // key in Counter.denied, "" for none
	}{
		{"allowed", http.StatusOK, `{"kind":"Node"}`, ""},
		{"policy", http.StatusForbidden,
			`{"kind":"Status","status":"Failure","message":"nodes \"b\" is forbidden: ValidatingAdmissionPolicy 'gpu-node-agent-node-scoped' with binding 'x' denied request","reason":"Forbidden","code":403}`,
			"policy PATCH nodes"},
		{"rbac", http.StatusForbidden,
			`{"kind":"Status","message":"nodes \"b\" is forbidden: User \"u\" cannot patch resource \"nodes\"","reason":"Forbidden","code":403}`,
			"forbidden PATCH nodes"},
		{"unauthorized", http.StatusUnauthorized, `{"kind":"Status","reason":"Unauthorized","code":401}`, "unauthorized PATCH nodes"},
		{"conflict is no refusal", http.StatusConflict, `{"kind":"Status","reason":"Conflict","code":409}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c := New()
			req, err := http.NewRequest(http.MethodPatch, srv.URL+"/api/v1/nodes/b", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Wrap(http.DefaultTransport).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || string(got) != tt.body {
				t.Errorf("body %q (%v), want %q", got, err, tt.body)
			}
			s := Sum([]*Counter{c})
			want := 0
			if tt.want != "" {
				want = 1
				if s.Denied[tt.want] != 1 || len(s.Samples) != 1 || s.Samples[0] != tt.body {
					t.Errorf("denied %v samples %q, want %s once with the body", s.Denied, s.Samples, tt.want)
				}
			}
			if s.DeniedTotal() != want {
				t.Errorf("%d refusals counted, want %d", s.DeniedTotal(), want)
			}
			if s.KindBytes["PATCH nodes"] != int64(len(tt.body)) {
				t.Errorf("%d body bytes counted, want %d", s.KindBytes["PATCH nodes"], len(tt.body))
			}
		})
	}
}

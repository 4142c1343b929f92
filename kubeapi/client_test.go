package kubeapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestConfigureRESTAsksForProtobuf: the typed client asks for protobuf
// first and still decodes a server that answers JSON (an aggregated or
// older server may).
func TestConfigureRESTAsksForProtobuf(t *testing.T) {
	var mu sync.Mutex
	var accept []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = append(accept, r.Header.Get("Accept"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&corev1.Node{
			TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"},
		})
	}))
	defer srv.Close()
	rc := &rest.Config{Host: srv.URL}
	ConfigureREST(rc, "test", ClientConfig{})
	c, err := ClientsForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Core.CoreV1().Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node from a JSON-only server: %v", err)
	}
	if n.Name != "gpu-1" {
		t.Errorf("node name %q, want gpu-1", n.Name)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(accept) != 1 || !strings.HasPrefix(accept[0], "application/vnd.kubernetes.protobuf") || !strings.Contains(accept[0], "application/json") {
		t.Errorf("Accept headers %q, want one that prefers protobuf and accepts JSON", accept)
	}
}

package kubeapi

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Clients are one agent's API clients over one rest.Config: client-go's
// clientset, and the metadata-only client the fleet safeguard counts the
// fleet's Nodes with (a paged LIST of names and labels, not full Nodes).
type Clients struct {
	Core kubernetes.Interface
	Meta metadata.Interface
}

// ClientsForConfig builds Clients over rc (used as given).
func ClientsForConfig(rc *rest.Config) (Clients, error) {
	core, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes client: %w", err)
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes metadata client: %w", err)
	}
	return Clients{Core: core, Meta: meta}, nil
}

// NewClients builds Clients from kubeconfig, or from the in-cluster
// service account when kubeconfig is empty, rate-limited by cfg.
//
// Throttling by the API server needs nothing more: client-go's REST client
// retries a 429 (and a 5xx) that carries Retry-After, waiting the seconds
// the server asked for, up to 10 times per request (rest/with_retry.go,
// IsNextRetry/checkWait; the default set in rest.NewRequest). A 429 without
// Retry-After reaches the caller, whose jittered backoff spreads it out.
func NewClients(kubeconfig, userAgent string, cfg ClientConfig) (Clients, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes client config: %w", err)
	}
	ConfigureREST(rc, userAgent, cfg)
	return ClientsForConfig(rc)
}

// ConfigureREST sets rc's user agent, client-side rate limit and wire
// format.
//
// The agent speaks protobuf to the API server (JSON stays accepted as a
// fallback), as the kubelet and kube-proxy do: every object the agent
// reads or writes is a built-in type (Node, Lease, Event), and a
// protobuf Node or Lease is a fraction of its JSON size and cheaper for
// the API server to encode, which matters when thousands of agents read
// slot Leases in one fault wave. Patch bodies are JSON whatever this
// says; the metadata client negotiates protobuf on its own
// (metadata.ConfigFor).
func ConfigureREST(rc *rest.Config, userAgent string, cfg ClientConfig) {
	cfg = cfg.WithDefaults()
	if userAgent != "" {
		rc.UserAgent = userAgent
	}
	rc.QPS = float32(cfg.QPS)
	rc.Burst = cfg.Burst
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
}

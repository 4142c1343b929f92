package kubeapi

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client is the agent's typed API client: the resources and verbs kubeapi
// uses, and nothing else. Its methods have client-go's typed-client
// signatures, so client-go's typed clients (and its fake clientset's)
// satisfy NodeClient, LeaseClient and EventClient as they are;
// kubeapitest adapts a whole kubernetes.Interface for tests. The product
// builds it with NewClients, over REST clients that know only these
// groups, rather than linking client-go's clientset, whose scheme
// registers every API group at init.
type Client interface {
	// Nodes is the cluster's Nodes (core/v1).
	Nodes() NodeClient
	// Leases is the Leases (coordination.k8s.io/v1) of namespace: the
	// fleet safeguard's slots.
	Leases(namespace string) LeaseClient
	// Events is the Events (core/v1, as the kubelet posts node events) of
	// namespace.
	Events(namespace string) EventClient
	// ResourceSlices is the cluster's ResourceSlices (resource.k8s.io/v1):
	// the SlicePublisher's pool of this node.
	ResourceSlices() ResourceSliceClient
	// ResourceClaims is the ResourceClaims (resource.k8s.io/v1) of
	// namespace: the DRA kubelet plugin reads a claim's allocation at
	// prepare time.
	ResourceClaims(namespace string) ResourceClaimClient
}

// NodeClient is what kubeapi does with Nodes: the NodeWatch's list and
// watch, a GET when its cache lags, the slots' GET of a holder, and the
// tainter's and labeler's patches (spec, metadata and the status
// subresource).
type NodeClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions,
		subresources ...string) (*corev1.Node, error)
}

// LeaseClient is what the fleet safeguard (Slots) does with its Leases.
type LeaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// EventClient posts the tainter's node Events.
type EventClient interface {
	Create(ctx context.Context, event *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
}

// ResourceSliceClient is what the SlicePublisher does with ResourceSlices:
// its informer's list and watch of this node's slices of our driver (field
// selectors spec.nodeName and spec.driver), and the writes that reconcile
// them.
type ResourceSliceClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*resourcev1.ResourceSliceList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, slice *resourcev1.ResourceSlice, opts metav1.CreateOptions) (*resourcev1.ResourceSlice, error)
	Update(ctx context.Context, slice *resourcev1.ResourceSlice, opts metav1.UpdateOptions) (*resourcev1.ResourceSlice, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// ResourceClaimClient reads one ResourceClaim (its status.allocation says
// which of our devices a prepared claim holds).
type ResourceClaimClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*resourcev1.ResourceClaim, error)
}

// Clients are one agent's API clients over one rest.Config: the typed
// client, and the metadata-only client the fleet safeguard counts the
// fleet's Nodes with (a paged LIST of names and labels, not full Nodes).
type Clients struct {
	Core Client
	Meta metadata.Interface
}

// ClientsForConfig builds Clients over rc (used as given).
func ClientsForConfig(rc *rest.Config) (Clients, error) {
	core, err := newTypedClient(rc)
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

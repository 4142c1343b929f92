package kubeapi

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// typedClient is the product's Client: the generated clientset's requests
// (resource) over one REST client per API group, decoding with a scheme of
// only core/v1, coordination.k8s.io/v1 and resource.k8s.io/v1. On the
// wire it is the clientset's CoreV1(), CoordinationV1() and ResourceV1():
// same paths, content types,
// parameters, bodies, rate limiter and retries
// (TestTypedClientOnTheWireAsClientset).
type typedClient struct {
	core, coordination, resource rest.Interface
	params                       runtime.ParameterCodec
}

// newTypedClient builds the typed client over rc, as
// kubernetes.NewForConfig does for the three groups: one HTTP client and one
// token bucket (rc.QPS, rc.Burst) shared by both.
func newTypedClient(rc *rest.Config) (*typedClient, error) {
	scheme := runtime.NewScheme()
	// As client-go/kubernetes/scheme registers them: the unversioned meta
	// types (Status, WatchEvent, options) under "v1", then each group.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("core/v1 scheme: %w", err)
	}
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("coordination.k8s.io/v1 scheme: %w", err)
	}
	if err := resourcev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("resource.k8s.io/v1 scheme: %w", err)
	}
	codecs := serializer.NewCodecFactory(scheme)

	config := *rc
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if config.RateLimiter == nil && config.QPS > 0 {
		if config.Burst <= 0 {
			return nil, fmt.Errorf("burst must be above 0 when QPS is set (%g)", config.QPS)
		}
		config.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(config.QPS, config.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&config)
	if err != nil {
		return nil, err
	}
	// What the generated typed clients' setConfigDefaults set.
	groupClient := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := config
		c.GroupVersion = &gv
		c.APIPath = apiPath
		c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, codecs).WithoutConversion()
		return rest.RESTClientForConfigAndClient(&c, httpClient)
	}
	core, err := groupClient(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	coordination, err := groupClient(coordinationv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	resource, err := groupClient(resourcev1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &typedClient{core: core, coordination: coordination, resource: resource,
		params: runtime.NewParameterCodec(scheme)}, nil
}

func (c *typedClient) Nodes() NodeClient {
	return &resource[*corev1.Node, *corev1.NodeList]{client: c.core, params: c.params, name: "nodes",
		newObject: func() *corev1.Node { return &corev1.Node{} },
		newList:   func() *corev1.NodeList { return &corev1.NodeList{} }}
}

func (c *typedClient) Leases(namespace string) LeaseClient {
	return &resource[*coordinationv1.Lease, *coordinationv1.LeaseList]{client: c.coordination, params: c.params,
		name: "leases", namespace: namespace,
		newObject: func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		newList:   func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} }}
}

func (c *typedClient) Events(namespace string) EventClient {
	return &resource[*corev1.Event, *corev1.EventList]{client: c.core, params: c.params, name: "events",
		namespace: namespace,
		newObject: func() *corev1.Event { return &corev1.Event{} },
		newList:   func() *corev1.EventList { return &corev1.EventList{} }}
}

func (c *typedClient) ResourceSlices() ResourceSliceClient {
	return &resource[*resourcev1.ResourceSlice, *resourcev1.ResourceSliceList]{client: c.resource, params: c.params,
		name:      "resourceslices",
		newObject: func() *resourcev1.ResourceSlice { return &resourcev1.ResourceSlice{} },
		newList:   func() *resourcev1.ResourceSliceList { return &resourcev1.ResourceSliceList{} }}
}

func (c *typedClient) ResourceClaims(namespace string) ResourceClaimClient {
	return &resource[*resourcev1.ResourceClaim, *resourcev1.ResourceClaimList]{client: c.resource, params: c.params,
		name: "resourceclaims", namespace: namespace,
		newObject: func() *resourcev1.ResourceClaim { return &resourcev1.ResourceClaim{} },
		newList:   func() *resourcev1.ResourceClaimList { return &resourcev1.ResourceClaimList{} }}
}

// object is what resource reads and writes: a typed API object.
type object interface {
	runtime.Object
	GetName() string
}

// resource is one resource's typed client: the requests of client-go's
// generic typed client (gentype.Client, which the generated clients are
// made of), written out for the verbs kubeapi uses. gentype itself is not
// used: its package also holds the fake clients, which link client-go's
// object tracker and with it managed fields, strategic merge patch,
// kube-openapi, gnostic and two YAML libraries, all initialised at start.
// Objects prefer protobuf as the generated clients' do
// (UseProtobufAsDefaultIfPreferred; ConfigureREST asks for it anyway).
type resource[T object, L runtime.Object] struct {
	client    rest.Interface
	params    runtime.ParameterCodec
	name      string
	namespace string // "" for a cluster-scoped resource
	newObject func() T
	newList   func() L
}

func (r *resource[T, L]) request(req *rest.Request) *rest.Request {
	return req.UseProtobufAsDefaultIfPreferred(true).
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.name)
}

// timeout is the client-side timeout a list or watch asks for.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

func (r *resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	result := r.newObject()
	err := r.request(r.client.Get()).Name(name).VersionedParams(&opts, r.params).Do(ctx).Into(result)
	return result, err
}

func (r *resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := r.newList()
	err := r.request(r.client.Get()).VersionedParams(&opts, r.params).Timeout(timeout(opts)).Do(ctx).Into(list)
	return list, err
}

func (r *resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request(r.client.Get()).VersionedParams(&opts, r.params).Timeout(timeout(opts)).Watch(ctx)
}

func (r *resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	result := r.newObject()
	err := r.request(r.client.Post()).VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(result)
	return result, err
}

func (r *resource[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	result := r.newObject()
	err := r.request(r.client.Put()).Name(obj.GetName()).VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(result)
	return result, err
}

func (r *resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request(r.client.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

func (r *resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions,
	subresources ...string) (T, error) {
	result := r.newObject()
	err := r.request(r.client.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, r.params).
		Body(data).Do(ctx).Into(result)
	return result, err
}

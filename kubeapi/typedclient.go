package kubeapi

import (
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// typedClient is the product's Client: client-go's generic typed clients
// (gentype, what the generated clientset is made of) over one REST client
// per API group, decoding with a scheme of only core/v1 and
// coordination.k8s.io/v1. On the wire it is the clientset's CoreV1() and
// CoordinationV1(): same paths, content types, parameters, rate limiter
// and retries.
type typedClient struct {
	core, coordination rest.Interface
	params             runtime.ParameterCodec
}

// newTypedClient builds the typed client over rc, as
// kubernetes.NewForConfig does for the two groups: one HTTP client and one
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
	return &typedClient{core: core, coordination: coordination, params: runtime.NewParameterCodec(scheme)}, nil
}

func (c *typedClient) Nodes() NodeClient {
	return gentype.NewClientWithList[*corev1.Node, *corev1.NodeList]("nodes", c.core, c.params, "",
		func() *corev1.Node { return &corev1.Node{} },
		func() *corev1.NodeList { return &corev1.NodeList{} },
		gentype.PrefersProtobuf[*corev1.Node]())
}

func (c *typedClient) Leases(namespace string) LeaseClient {
	return gentype.NewClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList]("leases", c.coordination, c.params, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} },
		gentype.PrefersProtobuf[*coordinationv1.Lease]())
}

func (c *typedClient) Events(namespace string) EventClient {
	return gentype.NewClientWithList[*corev1.Event, *corev1.EventList]("events", c.core, c.params, namespace,
		func() *corev1.Event { return &corev1.Event{} },
		func() *corev1.EventList { return &corev1.EventList{} },
		gentype.PrefersProtobuf[*corev1.Event]())
}

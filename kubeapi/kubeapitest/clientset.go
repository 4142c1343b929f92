// Package kubeapitest adapts client-go's clientset (its fake, in tests) to
// kubeapi's narrow Client, for tests outside kubeapi. The product never
// imports it: it links client-go's whole clientset.
package kubeapitest

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/metadata"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/watchlist"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
)

// Client is cs as a kubeapi.Client: its CoreV1 Nodes and Events, its
// CoordinationV1 Leases and its ResourceV1 ResourceSlices and ResourceClaims.
func Client(cs kubernetes.Interface) kubeapi.Client { return clientset{cs} }

// Clients are cs and meta as kubeapi.Clients.
func Clients(cs kubernetes.Interface, meta metadata.Interface) kubeapi.Clients {
	return kubeapi.Clients{Core: Client(cs), Meta: meta}
}

type clientset struct{ cs kubernetes.Interface }

func (c clientset) Nodes() kubeapi.NodeClient { return c.cs.CoreV1().Nodes() }

func (c clientset) Leases(namespace string) kubeapi.LeaseClient {
	return c.cs.CoordinationV1().Leases(namespace)
}

func (c clientset) Events(namespace string) kubeapi.EventClient {
	return c.cs.CoreV1().Events(namespace)
}

func (c clientset) ResourceSlices() kubeapi.ResourceSliceClient {
	return c.cs.ResourceV1().ResourceSlices()
}

func (c clientset) ResourceClaims(namespace string) kubeapi.ResourceClaimClient {
	return c.cs.ResourceV1().ResourceClaims(namespace)
}

// IsWatchListSemanticsUnSupported passes on cs's answer: client-go's fake
// clientset says it cannot serve a watch-list, so the NodeWatch's
// reflector lists and watches instead (cache.ToListWatcherWithWatchListSemantics).
func (c clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.cs)
}

// GenerateNames makes cs name created objects from their generateName as
// the API server does (client-go's fake leaves the name empty, so a
// second object of the same generateName would collide): the prefix and
// a 5-digit counter, and a UID.
func GenerateNames(cs *fake.Clientset) {
	var mu sync.Mutex
	n := 0
	cs.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		m, err := meta.Accessor(action.(k8stesting.CreateAction).GetObject())
		if err != nil || m.GetName() != "" || m.GetGenerateName() == "" {
			return false, nil, nil
		}
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		m.SetName(fmt.Sprintf("%s%05d", m.GetGenerateName(), i))
		m.SetUID(types.UID(fmt.Sprintf("generated-uid-%d", i)))
		return false, nil, nil
	})
}

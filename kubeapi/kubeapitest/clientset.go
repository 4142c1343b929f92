// Package kubeapitest holds what tests outside kubeapi need of client-go's
// fake clientset beyond what it does itself. The product never imports it.
package kubeapitest

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

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

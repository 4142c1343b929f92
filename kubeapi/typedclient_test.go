package kubeapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// wireRequest is what the API server sees of one request.
type wireRequest struct {
	Method, Path, Query string
	ContentType, Accept string
	UserAgent           string
	Body                []byte
}

// TestTypedClientOnTheWireAsClientset: every request kubeapi's Client
// makes is the request client-go's generated clientset makes for the same
// call (method, path, query, content type, accepted types, user agent and
// body bytes), on a config made by ConfigureREST. The server answers 404
// to everything: the requests are what is compared.
func TestTypedClientOnTheWireAsClientset(t *testing.T) {
	var mu sync.Mutex
	var got []wireRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, wireRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"),
			r.Header.Get("Accept"), r.Header.Get("User-Agent"), body})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer srv.Close()
	rc := &rest.Config{Host: srv.URL}
	ConfigureREST(rc, "wire-test", ClientConfig{QPS: 1000, Burst: 1000})
	ours, err := ClientsForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}

	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "slot-3", Namespace: "ns", ResourceVersion: "7",
		Labels: map[string]string{SlotLabel: "slot"}}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("gpu-1")}}
	event := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1.1", Namespace: "default"}, Reason: "GPUUnhealthy",
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "gpu-1"}}
	list := metav1.ListOptions{LabelSelector: "fleet=a", FieldSelector: "metadata.name=gpu-1", Limit: 500,
		Continue: "c", ResourceVersion: "0", TimeoutSeconds: ptr.To[int64](30)}
	watchOpts := metav1.ListOptions{FieldSelector: "metadata.name=gpu-1", ResourceVersion: "12", AllowWatchBookmarks: true,
		SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, TimeoutSeconds: ptr.To[int64](300)}
	patch := []byte(`{"metadata":{"labels":{"a":"b"}}}`)
	pre := metav1.Preconditions{ResourceVersion: ptr.To("7")}
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "00000-dra.example.com-gpu-1-"},
		Spec: resourcev1.ResourceSliceSpec{Driver: "dra.example.com", NodeName: ptr.To("gpu-1"),
			Pool:    resourcev1.ResourcePool{Name: "gpu-1", Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}}}}
	updated := slice.DeepCopy()
	updated.Name, updated.ResourceVersion = "00000-dra.example.com-gpu-1-abcde", "9"
	sliceList := metav1.ListOptions{FieldSelector: "spec.driver=dra.example.com,spec.nodeName=gpu-1", ResourceVersion: "0"}

	calls := []struct {
		name string
		ours func(ctx context.Context, c Client) error
		them func(ctx context.Context, c kubernetes.Interface) error
	}{
		{"get node",
			func(ctx context.Context, c Client) error {
				_, err := c.Nodes().Get(ctx, "gpu-1", metav1.GetOptions{ResourceVersion: "0"})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{ResourceVersion: "0"})
				return err
			}},
		{"list nodes",
			func(ctx context.Context, c Client) error { _, err := c.Nodes().List(ctx, list); return err },
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().List(ctx, list)
				return err
			}},
		{"watch nodes",
			func(ctx context.Context, c Client) error { _, err := c.Nodes().Watch(ctx, watchOpts); return err },
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().Watch(ctx, watchOpts)
				return err
			}},
		{"merge-patch node",
			func(ctx context.Context, c Client) error {
				_, err := c.Nodes().Patch(ctx, "gpu-1", types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "m"})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().Patch(ctx, "gpu-1", types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "m"})
				return err
			}},
		{"strategic-merge-patch node status",
			func(ctx context.Context, c Client) error {
				_, err := c.Nodes().Patch(ctx, "gpu-1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Nodes().Patch(ctx, "gpu-1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
				return err
			}},
		{"get lease",
			func(ctx context.Context, c Client) error {
				_, err := c.Leases("ns").Get(ctx, "slot-3", metav1.GetOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoordinationV1().Leases("ns").Get(ctx, "slot-3", metav1.GetOptions{})
				return err
			}},
		{"list leases",
			func(ctx context.Context, c Client) error { _, err := c.Leases("ns").List(ctx, list); return err },
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoordinationV1().Leases("ns").List(ctx, list)
				return err
			}},
		{"create lease",
			func(ctx context.Context, c Client) error {
				_, err := c.Leases("ns").Create(ctx, lease, metav1.CreateOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoordinationV1().Leases("ns").Create(ctx, lease, metav1.CreateOptions{})
				return err
			}},
		{"update lease",
			func(ctx context.Context, c Client) error {
				_, err := c.Leases("ns").Update(ctx, lease, metav1.UpdateOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoordinationV1().Leases("ns").Update(ctx, lease, metav1.UpdateOptions{})
				return err
			}},
		{"delete lease with a precondition",
			func(ctx context.Context, c Client) error {
				return c.Leases("ns").Delete(ctx, "slot-3", metav1.DeleteOptions{Preconditions: &pre})
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				return c.CoordinationV1().Leases("ns").Delete(ctx, "slot-3", metav1.DeleteOptions{Preconditions: &pre})
			}},
		{"create event",
			func(ctx context.Context, c Client) error {
				_, err := c.Events("default").Create(ctx, event, metav1.CreateOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.CoreV1().Events("default").Create(ctx, event, metav1.CreateOptions{})
				return err
			}},
		{"list resourceslices",
			func(ctx context.Context, c Client) error {
				_, err := c.ResourceSlices().List(ctx, sliceList)
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.ResourceV1().ResourceSlices().List(ctx, sliceList)
				return err
			}},
		{"watch resourceslices",
			func(ctx context.Context, c Client) error {
				_, err := c.ResourceSlices().Watch(ctx, watchOpts)
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.ResourceV1().ResourceSlices().Watch(ctx, watchOpts)
				return err
			}},
		{"create resourceslice",
			func(ctx context.Context, c Client) error {
				_, err := c.ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
				return err
			}},
		{"update resourceslice",
			func(ctx context.Context, c Client) error {
				_, err := c.ResourceSlices().Update(ctx, updated, metav1.UpdateOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.ResourceV1().ResourceSlices().Update(ctx, updated, metav1.UpdateOptions{})
				return err
			}},
		{"delete resourceslice with preconditions",
			func(ctx context.Context, c Client) error {
				return c.ResourceSlices().Delete(ctx, updated.Name, metav1.DeleteOptions{Preconditions: &pre})
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				return c.ResourceV1().ResourceSlices().Delete(ctx, updated.Name, metav1.DeleteOptions{Preconditions: &pre})
			}},
		{"get resourceclaim",
			func(ctx context.Context, c Client) error {
				_, err := c.ResourceClaims("ns").Get(ctx, "claim", metav1.GetOptions{})
				return err
			},
			func(ctx context.Context, c kubernetes.Interface) error {
				_, err := c.ResourceV1().ResourceClaims("ns").Get(ctx, "claim", metav1.GetOptions{})
				return err
			}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			errOurs := tc.ours(t.Context(), ours.Core)
			errTheirs := tc.them(t.Context(), theirs)
			if !apierrors.IsNotFound(errOurs) || !apierrors.IsNotFound(errTheirs) {
				t.Errorf("errors %v and %v, want NotFound from both", errOurs, errTheirs)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 {
				t.Fatalf("%d requests, want one from each client: %+v", len(got), got)
			}
			if diff := cmp.Diff(got[1], got[0]); diff != "" {
				t.Errorf("our request differs from the clientset's (-clientset +ours):\n%s", diff)
			}
		})
	}
}

// TestTypedClientSharesOneRateLimit: Nodes, Leases and Events draw on one
// token bucket (ClientConfig QPS and burst), as the clientset's groups do:
// with a burst of 1 and a bucket that refills in ~17 minutes, the request
// after the first, to another group, is refused by the client-side limiter
// (it would wait past its context's deadline) without reaching the server.
func TestTypedClientSharesOneRateLimit(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer srv.Close()
	rc := &rest.Config{Host: srv.URL}
	ConfigureREST(rc, "rate-test", ClientConfig{QPS: 0.001, Burst: 1})
	c, err := ClientsForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Core.Nodes().Get(t.Context(), "gpu-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("first request: %v, want the server's NotFound", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err = c.Core.Leases("ns").Get(ctx, "slot-0", metav1.GetOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		t.Errorf("second request, to coordination.k8s.io: %v, want the client-side rate limiter's refusal", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 {
		t.Errorf("server saw %v, want only the first request", paths)
	}
}

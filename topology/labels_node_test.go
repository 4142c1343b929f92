package topology

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var errBoom = errors.New("boom")

func newTestLabeler(client *fake.Clientset) *NodeLabeler {
	l := NewNodeLabeler(client, "node-a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.backoff = wait.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 1}
	return l
}

func countVerb(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb {
			n++
		}
	}
	return n
}

func nodeLabels(t *testing.T, c *fake.Clientset) (map[string]string, map[string]string) {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels, n.Annotations
}

func TestNodeLabelerApply(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   "node-a",
		Labels: map[string]string{"team": "ml", LabelGPUCount: "stale-from-gfd"},
	}})
	l := newTestLabeler(client)

	first := map[string]string{LabelGPUCount: "8", LabelNVLink: "true", LabelNVSwitch: "true"}
	if err := l.Apply(ctx, first, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 1 {
		t.Fatalf("first Apply: %d patches, want 1", got)
	}
	labels, ann := nodeLabels(t, client)
	want := map[string]string{"team": "ml", LabelGPUCount: "8", LabelNVLink: "true", LabelNVSwitch: "true"}
	if !maps.Equal(labels, want) {
		t.Errorf("labels after first Apply = %v, want %v", labels, want)
	}
	if got := ann[OwnedLabelsAnnotation]; got != "gpu-node-agent.io/nvlink,gpu-node-agent.io/nvswitch,nvidia.com/gpu.count" {
		t.Errorf("owned annotation = %q", got)
	}

	// Unchanged: no API call of any kind.
	before := len(client.Actions())
	if err := l.Apply(ctx, maps.Clone(first), nil); err != nil {
		t.Fatal(err)
	}
	if got := len(client.Actions()) - before; got != 0 {
		t.Errorf("unchanged Apply made %d API calls, want 0", got)
	}

	// One changed, one gone: one patch; the foreign label stays.
	second := map[string]string{LabelGPUCount: "7", LabelNVLink: "true"}
	if err := l.Apply(ctx, second, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 2 {
		t.Errorf("after changed Apply: %d patches, want 2", got)
	}
	labels, _ = nodeLabels(t, client)
	want = map[string]string{"team": "ml", LabelGPUCount: "7", LabelNVLink: "true"}
	if !maps.Equal(labels, want) {
		t.Errorf("labels after second Apply = %v, want %v", labels, want)
	}

	// A restarted agent reads what it owned: same labels, no patch.
	client.ClearActions()
	restarted := newTestLabeler(client)
	if err := restarted.Apply(ctx, second, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 0 {
		t.Errorf("restarted, unchanged: %d patches, want 0", got)
	}
	// ... and removes what its previous run set and no longer applies.
	if err := restarted.Apply(ctx, map[string]string{LabelGPUCount: "7"}, nil); err != nil {
		t.Fatal(err)
	}
	labels, _ = nodeLabels(t, client)
	want = map[string]string{"team": "ml", LabelGPUCount: "7"}
	if !maps.Equal(labels, want) {
		t.Errorf("labels after restart = %v, want %v", labels, want)
	}
}

func TestNodeLabelerRetries(t *testing.T) {
	tests := []struct {
		name        string
		failures    []error // returned by successive patches before success
		wantErr     bool
		wantPatches int
	}{
		{"conflict then success", []error{apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "node-a", nil)}, false, 2},
		{"unavailable twice then success", []error{apierrors.NewServiceUnavailable("busy"), apierrors.NewServiceUnavailable("busy")}, false, 3},
		{"forbidden is not retried", []error{apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "node-a", nil)}, true, 1},
		{"gives up after the backoff", []error{
			apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom),
			apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom)}, true, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
			calls := 0
			client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= len(tc.failures) {
					return true, nil, tc.failures[calls-1]
				}
				return false, nil, nil
			})
			l := newTestLabeler(client)
			err := l.Apply(context.Background(), map[string]string{LabelNVLink: "true"}, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Apply error = %v, want error %v", err, tc.wantErr)
			}
			if calls != tc.wantPatches {
				t.Errorf("%d patch attempts, want %d", calls, tc.wantPatches)
			}
			labels, _ := nodeLabels(t, client)
			if ok := labels[LabelNVLink] == "true"; ok == tc.wantErr {
				t.Errorf("label applied = %v with error = %v", ok, err)
			}
			if tc.wantErr {
				// A failed Apply is not remembered: the next one tries again.
				client.ClearActions()
				calls = len(tc.failures) // no more injected failures
				if err := l.Apply(context.Background(), map[string]string{LabelNVLink: "true"}, nil); err != nil {
					t.Fatal(err)
				}
				if got := countVerb(client, "patch"); got != 1 {
					t.Errorf("retry after failure: %d patches, want 1", got)
				}
			}
		})
	}
}

func TestNodeLabelerMissingNode(t *testing.T) {
	l := newTestLabeler(fake.NewClientset())
	if err := l.Apply(context.Background(), map[string]string{LabelNVLink: "true"}, nil); err == nil {
		t.Fatal("Apply on a missing node succeeded")
	}
}

// lastPatch decodes the body of the last patch the client sent.
func lastPatch(t *testing.T, c *fake.Clientset) map[string]any {
	t.Helper()
	var body []byte
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			body = p.GetPatch()
		}
	}
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("patch %q: %v", body, err)
	}
	return out
}

// TestNodeLabelerAnnotations follows one node through the agent's NIC
// annotation appearing, changing, going away and coming back, and through
// restarts, with a foreign label and annotation that must stay.
func TestNodeLabelerAnnotations(t *testing.T) {
	ctx := context.Background()
	foreignLabels := map[string]string{"team": "ml"}
	foreignAnn := map[string]string{"example.com/owner": "infra"}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "node-a", Labels: maps.Clone(foreignLabels), Annotations: maps.Clone(foreignAnn),
	}})

	h100 := loadProfile(t, "dgx-h100")
	nics := Annotations(h100)
	h100.NICs = h100.NICs[:4] // half the NICs gone
	fewer := Annotations(h100)
	labels := map[string]string{LabelGPUCount: "8"}
	owned := LabelGPUCount

	l := newTestLabeler(client)
	steps := []struct {
		name        string
		restart     bool // a new labeler, as after an agent restart
		labels, ann map[string]string
		wantGets    int
		wantPatch   map[string]any // the patch's metadata; nil: no patch
		wantAnn     string         // AnnotationNICs on the node; "" absent
	}{
		{"labels and annotation in one patch", false, labels, nics, 1,
			map[string]any{
				"labels":      map[string]any{LabelGPUCount: "8"},
				"annotations": map[string]any{AnnotationNICs: nics[AnnotationNICs], OwnedLabelsAnnotation: owned},
			}, nics[AnnotationNICs]},
		{"unchanged: no API call", false, labels, nics, 0, nil, nics[AnnotationNICs]},
		{"changed value: annotation only", false, labels, fewer, 0,
			map[string]any{"annotations": map[string]any{AnnotationNICs: fewer[AnnotationNICs]}}, fewer[AnnotationNICs]},
		{"NICs gone: annotation removed", false, labels, map[string]string{}, 0,
			map[string]any{"annotations": map[string]any{AnnotationNICs: nil}}, ""},
		{"NICs gone, unchanged", false, labels, nil, 0, nil, ""},
		{"NICs back", false, labels, nics, 0,
			map[string]any{"annotations": map[string]any{AnnotationNICs: nics[AnnotationNICs]}}, nics[AnnotationNICs]},
		{"restart with the same value: only the read", true, labels, nics, 1, nil, nics[AnnotationNICs]},
		{"restarted agent removes what its previous run set", true, labels, nil, 1,
			map[string]any{"annotations": map[string]any{AnnotationNICs: nil}}, ""},
		{"restart without NICs on either side", true, labels, nil, 1, nil, ""},
	}
	for _, st := range steps {
		client.ClearActions()
		if st.restart {
			l = newTestLabeler(client)
		}
		if err := l.Apply(ctx, st.labels, st.ann); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		gets, patches := countVerb(client, "get"), countVerb(client, "patch")
		wantPatches := 0
		if st.wantPatch != nil {
			wantPatches = 1
		}
		if gets != st.wantGets || patches != wantPatches {
			t.Errorf("%s: %d gets and %d patches, want %d and %d", st.name, gets, patches, st.wantGets, wantPatches)
		}
		if st.wantPatch != nil && patches == 1 {
			if got := lastPatch(t, client)["metadata"]; !reflect.DeepEqual(got, st.wantPatch) {
				t.Errorf("%s: patch metadata\n got %v\nwant %v", st.name, got, st.wantPatch)
			}
		}
		nodeL, nodeA := nodeLabels(t, client)
		wantL := maps.Clone(foreignLabels)
		maps.Copy(wantL, st.labels)
		wantA := maps.Clone(foreignAnn)
		wantA[OwnedLabelsAnnotation] = owned
		if st.wantAnn != "" {
			wantA[AnnotationNICs] = st.wantAnn
		}
		if !maps.Equal(nodeL, wantL) {
			t.Errorf("%s: node labels %v, want %v", st.name, nodeL, wantL)
		}
		if !maps.Equal(nodeA, wantA) {
			t.Errorf("%s: node annotations %v, want %v", st.name, nodeA, wantA)
		}
	}
}

// TestNodeLabelerRefusesForeignAnnotation: Apply only sets the annotations
// the agent owns, which it can find again after a restart.
func TestNodeLabelerRefusesForeignAnnotation(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	l := newTestLabeler(client)
	for _, key := range []string{"example.com/owner", OwnedLabelsAnnotation} {
		if err := l.Apply(context.Background(), nil, map[string]string{key: "x"}); err == nil {
			t.Errorf("Apply set annotation %s", key)
		}
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("refused Apply made %d API calls", n)
	}
}

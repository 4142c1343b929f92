package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"reflect"
	"sync"
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

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

var errBoom = errors.New("boom")

func newTestLabeler(t *testing.T, client *fake.Clientset) *Labeler {
	t.Helper()
	return newTestLabelerOn(client, startWatch(t, client, 0))
}

func newTestLabelerOn(client *fake.Clientset, w *NodeWatch) *Labeler {
	l := NewLabeler(client, w, discard())
	l.backoff = wait.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 1}
	return l
}

func loadProfile(t *testing.T, name string) *topology.Node {
	t.Helper()
	n, err := topology.LoadSnapshot(filepath.Join("..", "topology", "testdata", "profiles", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func nodeLabels(t *testing.T, c *fake.Clientset) (map[string]string, map[string]string) {
	t.Helper()
	n := getNode(t, c)
	return n.Labels, n.Annotations
}

func TestLabelerApply(t *testing.T) {
	ctx := context.Background()
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   nodeName,
		Labels: map[string]string{"team": "ml", topology.LabelGPUCount: "stale-from-gfd"},
	}})
	l := newTestLabeler(t, client)

	first := map[string]string{topology.LabelGPUCount: "8", topology.LabelNVLink: "true", topology.LabelNVSwitch: "true"}
	if err := l.Apply(ctx, first, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 1 {
		t.Fatalf("first Apply: %d patches, want 1", got)
	}
	labels, ann := nodeLabels(t, client)
	want := map[string]string{"team": "ml", topology.LabelGPUCount: "8", topology.LabelNVLink: "true", topology.LabelNVSwitch: "true"}
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
	second := map[string]string{topology.LabelGPUCount: "7", topology.LabelNVLink: "true"}
	if err := l.Apply(ctx, second, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 2 {
		t.Errorf("after changed Apply: %d patches, want 2", got)
	}
	labels, _ = nodeLabels(t, client)
	want = map[string]string{"team": "ml", topology.LabelGPUCount: "7", topology.LabelNVLink: "true"}
	if !maps.Equal(labels, want) {
		t.Errorf("labels after second Apply = %v, want %v", labels, want)
	}

	// A restarted agent reads what it owned: same labels, no patch.
	client.ClearActions()
	restarted := newTestLabeler(t, client)
	if err := restarted.Apply(ctx, second, nil); err != nil {
		t.Fatal(err)
	}
	if got := countVerb(client, "patch"); got != 0 {
		t.Errorf("restarted, unchanged: %d patches, want 0", got)
	}
	// ... and removes what its previous run set and no longer applies.
	if err := restarted.Apply(ctx, map[string]string{topology.LabelGPUCount: "7"}, nil); err != nil {
		t.Fatal(err)
	}
	labels, _ = nodeLabels(t, client)
	want = map[string]string{"team": "ml", topology.LabelGPUCount: "7"}
	if !maps.Equal(labels, want) {
		t.Errorf("labels after restart = %v, want %v", labels, want)
	}
}

func TestLabelerRetries(t *testing.T) {
	tests := []struct {
		name        string
		failures    []error // returned by successive patches before success
		wantErr     bool
		wantPatches int
	}{
		{"conflict then success", []error{apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, nodeName, nil)}, false, 2},
		{"unavailable twice then success", []error{apierrors.NewServiceUnavailable("busy"), apierrors.NewServiceUnavailable("busy")}, false, 3},
		{"forbidden is not retried", []error{apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, nodeName, nil)}, true, 1},
		{"gives up after the backoff", []error{
			apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom),
			apierrors.NewInternalError(errBoom), apierrors.NewInternalError(errBoom)}, true, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
			calls := 0
			client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= len(tc.failures) {
					return true, nil, tc.failures[calls-1]
				}
				return false, nil, nil
			})
			l := newTestLabeler(t, client)
			err := l.Apply(context.Background(), map[string]string{topology.LabelNVLink: "true"}, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Apply error = %v, want error %v", err, tc.wantErr)
			}
			if calls != tc.wantPatches {
				t.Errorf("%d patch attempts, want %d", calls, tc.wantPatches)
			}
			labels, _ := nodeLabels(t, client)
			if ok := labels[topology.LabelNVLink] == "true"; ok == tc.wantErr {
				t.Errorf("label applied = %v with error = %v", ok, err)
			}
			if tc.wantErr {
				// A failed Apply is not remembered: the next one tries again.
				client.ClearActions()
				calls = len(tc.failures) // no more injected failures
				if err := l.Apply(context.Background(), map[string]string{topology.LabelNVLink: "true"}, nil); err != nil {
					t.Fatal(err)
				}
				if got := countVerb(client, "patch"); got != 1 {
					t.Errorf("retry after failure: %d patches, want 1", got)
				}
			}
		})
	}
}

func TestLabelerMissingNode(t *testing.T) {
	l := newTestLabeler(t, newFake(t))
	if err := l.Apply(context.Background(), map[string]string{topology.LabelNVLink: "true"}, nil); err == nil {
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
func TestLabelerAnnotations(t *testing.T) {
	ctx := context.Background()
	foreignLabels := map[string]string{"team": "ml"}
	foreignAnn := map[string]string{"example.com/owner": "infra"}
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName, Labels: maps.Clone(foreignLabels), Annotations: maps.Clone(foreignAnn),
	}})

	h100 := loadProfile(t, "dgx-h100")
	nics := topology.Annotations(h100)
	h100.NICs = h100.NICs[:4] // half the NICs gone
	fewer := topology.Annotations(h100)
	labels := map[string]string{topology.LabelGPUCount: "8"}
	owned := topology.LabelGPUCount

	l := newTestLabeler(t, client)
	steps := []struct {
		name        string
		restart     bool // a new labeler, as after an agent restart
		labels, ann map[string]string
		wantPatch   map[string]any // the patch's metadata; nil: no patch
		wantAnn     string         // topology.AnnotationNICs on the node; "" absent
	}{
		{"labels and annotation in one patch", false, labels, nics,
			map[string]any{
				"labels":      map[string]any{topology.LabelGPUCount: "8"},
				"annotations": map[string]any{topology.AnnotationNICs: nics[topology.AnnotationNICs], OwnedLabelsAnnotation: owned},
			}, nics[topology.AnnotationNICs]},
		{"unchanged: no API call", false, labels, nics, nil, nics[topology.AnnotationNICs]},
		{"changed value: annotation only", false, labels, fewer,
			map[string]any{"annotations": map[string]any{topology.AnnotationNICs: fewer[topology.AnnotationNICs]}}, fewer[topology.AnnotationNICs]},
		{"NICs gone: annotation removed", false, labels, map[string]string{},
			map[string]any{"annotations": map[string]any{topology.AnnotationNICs: nil}}, ""},
		{"NICs gone, unchanged", false, labels, nil, nil, ""},
		{"NICs back", false, labels, nics,
			map[string]any{"annotations": map[string]any{topology.AnnotationNICs: nics[topology.AnnotationNICs]}}, nics[topology.AnnotationNICs]},
		{"restart with the same value: nothing sent", true, labels, nics, nil, nics[topology.AnnotationNICs]},
		{"restarted agent removes what its previous run set", true, labels, nil,
			map[string]any{"annotations": map[string]any{topology.AnnotationNICs: nil}}, ""},
		{"restart without NICs on either side", true, labels, nil, nil, ""},
	}
	for _, st := range steps {
		client.ClearActions()
		if st.restart {
			l = newTestLabeler(t, client)
		}
		if err := l.Apply(ctx, st.labels, st.ann); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		gets, patches := countVerb(client, "get"), countVerb(client, "patch")
		wantPatches := 0
		if st.wantPatch != nil {
			wantPatches = 1
		}
		if gets != 0 || patches != wantPatches {
			t.Errorf("%s: %d gets and %d patches, want 0 (the node comes from the informer) and %d", st.name, gets, patches, wantPatches)
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
			wantA[topology.AnnotationNICs] = st.wantAnn
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
func TestLabelerRefusesForeignAnnotation(t *testing.T) {
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	l := newTestLabeler(t, client)
	for _, key := range []string{"example.com/owner", OwnedLabelsAnnotation} {
		if err := l.Apply(context.Background(), nil, map[string]string{key: "x"}); err == nil {
			t.Errorf("Apply set annotation %s", key)
		}
	}
	if n := len(requests(client)); n != 0 {
		t.Errorf("refused Apply made %d API calls", n)
	}
}

// TestLabelerRunRepairsDrift runs the labeler: the wanted labels land;
// a label of ours removed by someone is put back from the informer's
// update alone; new topology is applied on the changed signal.
func TestLabelerRunRepairsDrift(t *testing.T) {
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"team": "ml"}}})
	l := newTestLabeler(t, client)
	var mu sync.Mutex
	want := map[string]string{topology.LabelGPUCount: "8"}
	changed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		l.Run(ctx, changed, func() (map[string]string, map[string]string, bool) {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(want), nil, true
		})
		close(done)
	}()
	label := func() string { labels, _ := nodeLabels(t, client); return labels[topology.LabelGPUCount] }
	testutil.WaitFor(t, "the label", func() bool { return label() == "8" })
	gets := countVerb(client, "get")
	modifyNode(t, client, func(n *corev1.Node) { delete(n.Labels, topology.LabelGPUCount) })
	testutil.WaitFor(t, "the removed label put back", func() bool { return label() == "8" })
	mu.Lock()
	want = map[string]string{topology.LabelGPUCount: "7"}
	mu.Unlock()
	changed <- struct{}{}
	testutil.WaitFor(t, "the new label value", func() bool { return label() == "7" })
	cancel()
	<-done
	if labels, _ := nodeLabels(t, client); labels["team"] != "ml" {
		t.Errorf("foreign label lost: %v", labels)
	}
	if got := countVerb(client, "get") - gets; got != 1 {
		t.Errorf("%d GETs, want only the test's own", got)
	}
}

// TestNodeWatchScopedToNode: the informer lists and watches this node
// alone (a field selector on its name), never every Node.
func TestNodeWatchScopedToNode(t *testing.T) {
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	w := startWatch(t, client, 0)
	if _, err := w.Node(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the informer's watch", func() bool { return countVerb(client, "watch") > 0 })
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "list" && v != "watch" {
			continue
		}
		if !informerAction(a) {
			t.Errorf("%s without a field selector", a.GetVerb())
			continue
		}
		var sel string
		switch a := a.(type) {
		case k8stesting.ListAction:
			sel = a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			sel = a.GetWatchRestrictions().Fields.String()
		}
		if sel != "metadata.name="+nodeName {
			t.Errorf("%s field selector %q, want metadata.name=%s", a.GetVerb(), sel, nodeName)
		}
	}
}

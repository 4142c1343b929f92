package safeguard

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi/kubeapitest"
)

// The users of the shared slot in these tests, as the agent names them.
const (
	userTaint       = "taint"
	userRemediation = "remediation"
)

// newSharedFixture is slotSelf's Shared slot on a versioned fake API
// server whose fleet is slotSelf alone (K = 1), without random delays.
func newSharedFixture(t *testing.T) (*fake.Clientset, *Shared) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: slotSelf}}
	c := kubeapitest.NewVersioned(t, node)
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	meta := metadatafake.NewSimpleMetadataClient(scheme, &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: node.ObjectMeta})
	cfg := Config{Namespace: slotNS, TaintKey: slotTaint, MaxFraction: 0.5}
	return c, NewShared(New(c, meta, slotSelf, cfg, slotTestLog(), WithoutSpread()))
}

// heldLeases are the names of c's slot Leases slotSelf holds.
func heldLeases(t *testing.T, c *fake.Clientset) []string {
	t.Helper()
	l, err := c.CoordinationV1().Leases(slotNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, lease := range l.Items {
		if leaseHolder(&lease) == slotSelf {
			out = append(out, lease.Name)
		}
	}
	return out
}

// TestShared: the tainter and remediation share one Lease, which is
// deleted only when neither holds it any more.
func TestShared(t *testing.T) {
	type step struct {
		op   string // acquire, release (Shared); allow, unallow (the taint user's view)
		user string
		// wantLease says this node holds a slot Lease after the step.
		wantLease bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "taint, then remediation; released in that order", steps: []step{
			{"acquire", userTaint, true},
			{"acquire", userRemediation, true},
			{"release", userTaint, true},
			{"release", userRemediation, false},
		}},
		{name: "released in the other order", steps: []step{
			{"acquire", userTaint, true},
			{"acquire", userRemediation, true},
			{"release", userRemediation, true},
			{"release", userTaint, false},
		}},
		{name: "through the tainter's Safeguard", steps: []step{
			{"acquire", userRemediation, true},
			{"allow", userTaint, true},
			{"release", userRemediation, true},
			{"unallow", userTaint, false},
		}},
		{name: "remediation alone", steps: []step{
			{"acquire", userRemediation, true},
			{"release", userRemediation, false},
		}},
		{name: "the tainter's release at start keeps remediation's slot", steps: []step{
			{"acquire", userRemediation, true},
			{"unallow", userTaint, true},
			{"release", userRemediation, false},
		}},
		{name: "acquired twice by one user, released once", steps: []step{
			{"acquire", userRemediation, true},
			{"acquire", userRemediation, true},
			{"release", userRemediation, false},
		}},
		{name: "taken again after both released", steps: []step{
			{"acquire", userTaint, true},
			{"release", userTaint, false},
			{"acquire", userRemediation, true},
			{"release", userRemediation, false},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, slot := newSharedFixture(t)
			ctx := context.Background()
			for i, s := range tc.steps {
				var err error
				switch s.op {
				case "acquire":
					var d Decision
					d, err = slot.Acquire(ctx, s.user)
					if err == nil && !d.Held {
						t.Fatalf("step %d: acquire(%s) refused: %+v", i, s.user, d)
					}
				case "release":
					err = slot.Release(ctx, s.user)
				case "allow":
					var ok bool
					ok, err = slot.User(userTaint).Allow(ctx)
					if err == nil && !ok {
						t.Fatalf("step %d: Allow refused", i)
					}
				case "unallow":
					err = slot.User(userTaint).Release(ctx)
				}
				if err != nil {
					t.Fatalf("step %d: %s(%s): %v", i, s.op, s.user, err)
				}
				leases := heldLeases(t, c)
				if got := len(leases) > 0; got != s.wantLease {
					t.Fatalf("step %d: after %s(%s) this node's slot Leases are %v; want held=%v", i, s.op, s.user, leases, s.wantLease)
				}
				if len(leases) > 1 {
					t.Fatalf("step %d: this node holds %d slot Leases %v, want one", i, len(leases), leases)
				}
			}
		})
	}
}

// TestSharedReleaseDuringAcquire: a user's release that races another
// user's acquire must not delete the Lease the acquire just renewed; the
// renew is held open until the release had every chance to run.
func TestSharedReleaseDuringAcquire(t *testing.T) {
	c, slot := newSharedFixture(t)
	ctx := context.Background()
	if _, err := slot.Acquire(ctx, userRemediation); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	renewing := false
	c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if renewing {
			return false, nil, nil
		}
		renewing = true
		go func() { released <- slot.Release(ctx, userRemediation) }()
		// Give the release every chance to decide while the taint's
		// acquire is under way: it may decide only after it (a correct
		// Shared) or it has (a racy one: the users are then empty).
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) {
			if slot.mu.TryLock() {
				_, held := slot.users[userRemediation]
				done := !held
				slot.mu.Unlock()
				if done {
					break
				}
			}
			time.Sleep(time.Millisecond)
		}
		return false, nil, nil
	})
	if ok, err := slot.User(userTaint).Allow(ctx); err != nil || !ok {
		t.Fatalf("Allow = %v, %v; want true", ok, err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if !renewing {
		t.Fatal("the taint's acquire did not renew the Lease")
	}
	if leases := heldLeases(t, c); len(leases) != 1 {
		t.Fatalf("after remediation released while the taint acquired, this node's slot Leases are %v; want one (the taint holds it)", leases)
	}
}

// TestSharedRenewsSparingly: a user asking again and again (a standing
// reboot request, every retry interval) writes the Lease once per third of
// its duration, not once per ask.
func TestSharedRenewsSparingly(t *testing.T) {
	c, slot := newSharedFixture(t)
	now := time.Now()
	slot.slots.now = func() time.Time { return now }
	ctx := context.Background()
	writes := func() int {
		n := 0
		for _, a := range c.Actions() {
			if a.GetResource().Resource == "leases" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
				n++
			}
		}
		return n
	}
	for range 10 {
		if d, err := slot.Acquire(ctx, userRemediation); err != nil || !d.Held {
			t.Fatalf("acquire: %+v %v", d, err)
		}
		now = now.Add(10 * time.Second)
	}
	if got := writes(); got != 1 {
		t.Fatalf("%d Lease writes for 10 asks within a third of the Lease, want 1", got)
	}
	now = now.Add(slot.slots.cfg.LeaseDuration / 3)
	if d, err := slot.Acquire(ctx, userRemediation); err != nil || !d.Held {
		t.Fatalf("acquire: %+v %v", d, err)
	}
	if got := writes(); got != 2 {
		t.Fatalf("%d Lease writes after a third of the Lease, want 2 (renewed)", got)
	}
}

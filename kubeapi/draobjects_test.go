package kubeapi

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDRAObjects: devices set before the client exists are published once
// it does; a claim read waits for the client, or fails with the caller's
// deadline while there is none.
func TestDRAObjects(t *testing.T) {
	cs := newFake(t,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}},
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "claim-uid"}},
	)
	allow := make(chan struct{})
	d, err := NewDRAObjects(DRAObjectsConfig{NodeName: "node-a", Retry: 10 * time.Millisecond, NewClients: func() (Clients, error) {
		select {
		case <-allow:
			return Clients{Core: cs}, nil
		default:
			return Clients{}, errors.New("no API access yet")
		}
	}}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDRAObjects(DRAObjectsConfig{}, nil, nil); err == nil {
		t.Error("no error without node name and client builder")
	}
	d.SetDevices([]resourcev1.Device{{Name: "gpu-0"}, {Name: "nic-mlx5-0"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := d.Get(short, "ns", "c"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get without a client = %v, want the deadline", err)
	}
	if d.Published() {
		t.Fatal("published without a client")
	}
	close(allow)
	c, err := d.Get(ctx, "ns", "c")
	if err != nil || c.UID != "claim-uid" {
		t.Fatalf("Get = %v, %v", c, err)
	}
	waitFor(t, "devices published", d.Published)
	list, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != 2 {
		t.Fatalf("slices = %+v, %v", list, err)
	}
	// Later sets go straight to the publisher.
	d.SetDevices([]resourcev1.Device{{Name: "gpu-0"}})
	waitFor(t, "one device left", func() bool {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Spec.Devices) == 1 && d.Published()
	})
}

// Package usagetest serves the kubelet's pod-resources List API on a unix
// socket, for the tests of the packages that ask it which containers hold
// which devices (usage, agent, metrics).
package usagetest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources answers List as the kubelet's pod-resources server does,
// with the pods last Set, or fails with the error last given to Fail.
type PodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  []*podresourcesv1.PodResources
	err   error
	calls int
}

// ServePodResources serves pods on socket (its directory made) until the
// test ends.
func ServePodResources(t testing.TB, socket string, pods ...*podresourcesv1.PodResources) *PodResources {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen %s: %v", socket, err)
	}
	f := &PodResources{pods: pods}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return f
}

// List is the pod-resources API's List.
func (f *PodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// Set makes pods the answer from now on, and ends a Fail.
func (f *PodResources) Set(pods ...*podresourcesv1.PodResources) {
	f.mu.Lock()
	f.pods, f.err = pods, nil
	f.mu.Unlock()
}

// Fail makes List fail with err until the next Set.
func (f *PodResources) Fail(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// Calls counts the List requests served.
func (f *PodResources) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

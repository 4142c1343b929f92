package signals

import (
	"context"
	"testing"
	"time"
)

func TestFanIn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := make(chan struct{}), make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	out := FanIn(ctx, a, nil, b, closed)
	if cap(out) != 1 {
		t.Fatalf("capacity %d: a burst must coalesce into one pending signal", cap(out))
	}
	// A closed channel is no change (a liveness wait, not a timing
	// assertion: a spinning forwarder would have signalled at once).
	time.Sleep(50 * time.Millisecond)
	select {
	case <-out:
		t.Fatal("a signal with no change (the closed channel)")
	default:
	}
	for _, c := range []chan struct{}{a, b} {
		c <- struct{}{}
		select {
		case <-out:
		case <-time.After(10 * time.Second):
			t.Fatal("no signal after a change")
		}
	}
	// A burst: every send is taken (none blocks), one signal or more
	// follows.
	for range 5 {
		a <- struct{}{}
	}
	select {
	case <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("no signal after a burst")
	}
}

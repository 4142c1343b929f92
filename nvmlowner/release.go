package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrReleased is what a call waiting for a released NVML gets when its
// context ends first.
var ErrReleased = errors.New("nvml released for a gpu reset")

// gate counts the calls in flight and holds new ones back while NVML is
// released (Owner.Release). The zero value is open.
type gate struct {
	mu     sync.Mutex
	active int
	// resumed is closed when a release ends; nil while none is under way.
	resumed chan struct{}
	// idle is closed when active drops to zero; nil unless Release waits.
	idle chan struct{}
	// gen counts releases: an NVML object made before one (an event
	// set) is no longer valid after it.
	gen uint64
}

// enter waits while NVML is released, then counts one call in flight.
func (g *gate) enter(ctx context.Context) error {
	for {
		g.mu.Lock()
		wait := g.resumed
		if wait == nil {
			g.active++
			g.mu.Unlock()
			return nil
		}
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleased, ctx.Err())
		}
	}
}

// exit ends one call in flight.
func (g *gate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	if g.active == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// Generation counts the releases so far: an event set created under one
// generation must be built again under the next.
func (o *Owner) Generation() uint64 {
	o.gate.mu.Lock()
	defer o.gate.mu.Unlock()
	return o.gate.gen
}

// Enter and Exit bracket an NVML call made outside the owner's lanes (the
// event set's Wait, which blocks by design): Enter waits while NVML is
// released, so that Release waits for the call to end.
func (o *Owner) Enter(ctx context.Context) error { return o.gate.enter(ctx) }

// Exit ends a call Enter began.
func (o *Owner) Exit() { o.gate.exit() }

// Release lets go of NVML for a GPU reset: NVIDIA's nvidia-smi(1) refuses
// a reset while any application holds the GPU, monitoring applications
// such as NVML's other users included. It holds every new call back
// (they wait, however long, and then run: no caller sees an error), waits
// up to wait for the calls in flight to end, shuts NVML down (the one
// Init the hardware made) and forgets every handle. resume initialises
// NVML again and lets the held calls go; call it exactly once, also
// after a failed reset. A call that does not end in time (a GPU hung in
// the driver) fails the release: NVML is left as it was, and the error
// names the calls still running.
func (o *Owner) Release(ctx context.Context, wait time.Duration) (resume func(), err error) {
	g := &o.gate
	g.mu.Lock()
	if g.resumed != nil {
		g.mu.Unlock()
		return nil, errors.New("nvml release: already released")
	}
	resumed := make(chan struct{})
	g.resumed = resumed
	var idle chan struct{}
	if g.active > 0 {
		idle = make(chan struct{})
		g.idle = idle
	}
	g.mu.Unlock()
	reopen := func() {
		g.mu.Lock()
		g.resumed, g.idle = nil, nil
		g.mu.Unlock()
		close(resumed)
	}
	if idle != nil {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-idle:
		case <-t.C:
			reopen()
			return nil, fmt.Errorf("nvml release: calls still running after %s: %s", wait, o.running())
		case <-ctx.Done():
			reopen()
			return nil, fmt.Errorf("nvml release: %w", ctx.Err())
		}
	}
	if ret := o.bounded(func() nvml.Return { return o.lib.Shutdown() }); ret != nvml.SUCCESS {
		reopen()
		return nil, fmt.Errorf("nvml release: shutdown: %w", ret)
	}
	o.dropHandles()
	var once sync.Once
	return func() {
		once.Do(func() {
			if ret := o.bounded(func() nvml.Return { return o.lib.Init() }); ret != nvml.SUCCESS {
				// The calls that follow fail, and the health checks
				// report NVML failing: the truth.
				o.log.Error("nvml init after a gpu reset failed", "err", ret)
			}
			g.mu.Lock()
			g.gen++
			g.mu.Unlock()
			reopen()
		})
	}, nil
}

// bounded runs a library call on its own goroutine for at most the call
// timeout (a hung driver answers ERROR_TIMEOUT; the call goes on alone).
func (o *Owner) bounded(fn func() nvml.Return) nvml.Return {
	done := make(chan nvml.Return, 1)
	go func() {
		defer func() {
			if recover() != nil {
				done <- nvml.ERROR_UNKNOWN
			}
		}()
		done <- fn()
	}()
	t := time.NewTimer(o.cfg.CallTimeout)
	defer t.Stop()
	select {
	case ret := <-done:
		return ret
	case <-t.C:
		return nvml.ERROR_TIMEOUT
	}
}

// running names the calls on the lanes now, for errors.
func (o *Owner) running() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for id, l := range o.lanes {
		l.mu.Lock()
		if l.what != "" {
			out = append(out, id+": "+l.what)
		}
		l.mu.Unlock()
	}
	o.libLane.mu.Lock()
	if o.libLane.what != "" {
		out = append(out, "library: "+o.libLane.what)
	}
	o.libLane.mu.Unlock()
	if len(out) == 0 {
		return "an event wait"
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

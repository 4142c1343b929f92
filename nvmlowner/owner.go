package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DefaultCallTimeout bounds one NVML call (or one batch of calls on one
// GPU) when Config.CallTimeout is zero. A healthy driver answers in
// microseconds to a few milliseconds; a GPU stuck in a GSP timeout (XID
// 119) blocks its callers for tens of seconds.
const DefaultCallTimeout = 5 * time.Second

// ErrTimeout is returned when an NVML call did not return within the call
// timeout, or when an earlier call on the same GPU is still running (the GPU
// is hung): the caller gets its answer in bounded time either way.
var ErrTimeout = errors.New("nvml call timed out")

// Config configures an Owner.
type Config struct {
	// CallTimeout bounds each Do/Lib call; DefaultCallTimeout when zero.
	CallTimeout time.Duration
}

// Owner owns one NVML library handle for the process. It is safe for
// concurrent use. Every call is bounded by the call timeout, except that
// while NVML is released for a GPU reset (Release) calls first wait for it
// to be taken up again.
type Owner struct {
	lib Library
	cfg Config
	log *slog.Logger

	// libLane serialises and bounds library-wide calls (Init, device
	// count, handle lookups, event sets).
	libLane *lane

	mu sync.Mutex
	// lanes are the per-GPU lanes by UUID; a lane outlives the GPU's
	// removal while a call on it is still running.
	lanes map[string]*lane
	// handles caches each GPU's handle by UUID; dropped when a lookup
	// fails or the GPU leaves the set (SetGPUs).
	handles map[string]Device

	// gate holds calls back while NVML is released (Release).
	gate gate
}

// New returns an Owner over lib (nvml.New() in production, a simulated
// library in tests). Nothing is called until Init.
func New(lib Library, cfg Config, log *slog.Logger) *Owner {
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Owner{
		lib:     lib,
		cfg:     cfg,
		log:     log,
		libLane: newLane(),
		lanes:   map[string]*lane{},
		handles: map[string]Device{},
	}
}

// CallTimeout is the bound on one call.
func (o *Owner) CallTimeout() time.Duration { return o.cfg.CallTimeout }

// Init initialises NVML, bounded by the call timeout. NVML counts
// references: every successful Init needs one Shutdown.
func (o *Owner) Init(ctx context.Context) error {
	return o.Lib(ctx, "init", func(lib Library) nvml.Return { return lib.Init() })
}

// Shutdown balances one successful Init (bounded by the call timeout).
func (o *Owner) Shutdown(ctx context.Context) error {
	return o.Lib(ctx, "shutdown", func(lib Library) nvml.Return { return lib.Shutdown() })
}

// Lib runs fn with the library on the library lane: one call at a time,
// each bounded by the call timeout. A non-SUCCESS return comes back as an
// error wrapping the nvml.Return (errors.Is works with nvml.ERROR_*).
func (o *Owner) Lib(ctx context.Context, what string, fn func(lib Library) nvml.Return) error {
	if err := o.gate.enter(ctx); err != nil {
		return &CallError{What: what, Err: err}
	}
	return o.libLane.run(ctx, o.cfg.CallTimeout, what, func() nvml.Return { return fn(o.lib) }, o.gate.exit)
}

// Do runs fn with GPU uuid's handle on that GPU's lane, bounded by the call
// timeout. Calls on one GPU run one at a time; calls on different GPUs
// never wait for each other. If an earlier call on this GPU is still
// running when the timeout expires, Do returns ErrTimeout without starting
// fn, so a hung GPU costs each caller at most one timeout and holds at most
// one goroutine. The handle is looked up by UUID (cached until a lookup
// fails or SetGPUs drops the GPU). what names the call for errors.
func (o *Owner) Do(ctx context.Context, uuid, what string, fn func(dev Device) nvml.Return) error {
	if err := o.gate.enter(ctx); err != nil {
		return &CallError{What: what, Err: err}
	}
	l := o.lane(uuid)
	return l.run(ctx, o.cfg.CallTimeout, what, func() nvml.Return {
		dev, ret := o.handle(uuid)
		if ret != nvml.SUCCESS {
			return ret
		}
		ret = fn(dev)
		if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_FOUND {
			// A stale handle (the GPU was re-enumerated): look it up
			// again next time.
			o.dropHandle(uuid)
		}
		return ret
	}, o.gate.exit)
}

// DoIndex runs fn with the handle of GPU index i, on a lane of that index:
// discovery's way to a GPU whose UUID it does not know yet. The handle is
// looked up by index on every call (indexes are not stable across a driver
// reload or a GPU falling off the bus) and never cached. Bounds and errors
// are Do's; the lane of an index is not the lane of the GPU's UUID, so a
// hung GPU can hold one goroutine on each.
func (o *Owner) DoIndex(ctx context.Context, i int, what string, fn func(dev Device) nvml.Return) error {
	if err := o.gate.enter(ctx); err != nil {
		return &CallError{What: what, Err: err}
	}
	l := o.lane(indexLane(i))
	return l.run(ctx, o.cfg.CallTimeout, what, func() nvml.Return {
		dev, ret := o.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return ret
		}
		return fn(dev)
	}, o.gate.exit)
}

// indexLane is the lanes key of GPU index i: never a UUID (those start
// with "GPU-" or "MIG-").
func indexLane(i int) string { return fmt.Sprintf("#%d", i) }

// cachedHandle is GPU uuid's handle if a call has looked it up, else nil.
// It never calls NVML, so it is safe on another GPU's lane.
func (o *Owner) cachedHandle(uuid string) Device {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handles[uuid]
}

// Hung reports whether a call on GPU uuid has been running for longer
// than the call timeout.
func (o *Owner) Hung(uuid string) bool {
	o.mu.Lock()
	l := o.lanes[uuid]
	o.mu.Unlock()
	return l != nil && l.hung(o.cfg.CallTimeout)
}

// SetGPUs tells the owner which GPUs exist now: handles and idle lanes of
// other GPUs are dropped.
func (o *Owner) SetGPUs(uuids []string) {
	keep := make(map[string]bool, len(uuids))
	for _, u := range uuids {
		keep[u] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for u := range o.handles {
		if !keep[u] {
			delete(o.handles, u)
		}
	}
	for u, l := range o.lanes {
		// Index lanes are few (one per GPU index) and kept.
		if !keep[u] && !strings.HasPrefix(u, "#") && !l.busy() {
			delete(o.lanes, u)
		}
	}
}

func (o *Owner) lane(uuid string) *lane {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lanes[uuid]
	if l == nil {
		l = newLane()
		o.lanes[uuid] = l
	}
	return l
}

// handle runs on uuid's lane: the lookup itself may hang on a hung GPU.
func (o *Owner) handle(uuid string) (Device, nvml.Return) {
	o.mu.Lock()
	dev := o.handles[uuid]
	o.mu.Unlock()
	if dev != nil {
		return dev, nvml.SUCCESS
	}
	dev, ret := o.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	o.mu.Lock()
	o.handles[uuid] = dev
	o.mu.Unlock()
	return dev, nvml.SUCCESS
}

// dropHandles forgets every cached handle.
func (o *Owner) dropHandles() {
	o.mu.Lock()
	clear(o.handles)
	o.mu.Unlock()
}

func (o *Owner) dropHandle(uuid string) {
	o.mu.Lock()
	delete(o.handles, uuid)
	o.mu.Unlock()
}

// CallError is the error of a failed call: which call, and the NVML return
// (or ErrTimeout).
type CallError struct {
	What string
	Err  error
	// Running is the call that still held the GPU's lane when this one
	// gave up waiting for it (the call that hangs), else empty.
	Running string
}

func (e *CallError) Error() string { return fmt.Sprintf("nvml %s: %v", e.What, e.Err) }
func (e *CallError) Unwrap() error { return e.Err }

// lane runs one call at a time. slot is a one-token semaphore: held by the
// goroutine running a call until the call returns, however late.
type lane struct {
	slot chan struct{}

	mu      sync.Mutex
	started time.Time // zero when idle
	what    string    // the running call
	// overdue is set when a caller gave up on the running call (it
	// outlived the timeout); cleared when the call returns.
	overdue bool
}

func newLane() *lane { return &lane{slot: make(chan struct{}, 1)} }

func (l *lane) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.started.IsZero()
}

func (l *lane) hung(timeout time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.started.IsZero() && (l.overdue || time.Since(l.started) > timeout)
}

// run waits up to timeout for the lane, then up to the rest of timeout for
// fn. fn keeps running after a timeout; the lane stays taken until it
// returns. done is called once fn has returned, or at once when fn never
// started.
func (l *lane) run(ctx context.Context, timeout time.Duration, what string, fn func() nvml.Return, done func()) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	select {
	case l.slot <- struct{}{}:
	case <-deadline.C:
		done()
		l.mu.Lock()
		running := l.what
		l.mu.Unlock()
		return &CallError{What: what, Running: running,
			Err: fmt.Errorf("%w (an earlier call on this device, %s, is still running)", ErrTimeout, running)}
	case <-ctx.Done():
		done()
		return &CallError{What: what, Err: ctx.Err()}
	}
	l.mu.Lock()
	l.started, l.what = time.Now(), what
	l.mu.Unlock()
	result := make(chan nvml.Return, 1)
	go func() {
		var ret nvml.Return = nvml.ERROR_UNKNOWN
		defer func() {
			l.mu.Lock()
			l.started, l.what = time.Time{}, ""
			l.overdue = false
			l.mu.Unlock()
			<-l.slot
			done()
			if r := recover(); r != nil {
				// A binding bug or an unset mock function costs this
				// call, not the process.
				result <- nvml.ERROR_UNKNOWN
				return
			}
			result <- ret
		}()
		ret = fn()
	}()
	select {
	case ret := <-result:
		if ret != nvml.SUCCESS {
			return &CallError{What: what, Err: ret}
		}
		return nil
	case <-deadline.C:
		l.mu.Lock()
		l.overdue = !l.started.IsZero()
		l.mu.Unlock()
		return &CallError{What: what, Err: fmt.Errorf("%w after %s", ErrTimeout, timeout)}
	case <-ctx.Done():
		return &CallError{What: what, Err: ctx.Err()}
	}
}

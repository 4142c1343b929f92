package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/utils/clock"
)

// EventTypes are the NVML events an EventWatcher registers for: XIDs and
// single/double-bit ECC errors. A GPU that refuses the ECC events (nvml.h,
// nvmlDeviceRegisterEvents: NOT_SUPPORTED "if the platform does not
// support this feature or some of requested event types") is registered
// for XIDs alone.
const EventTypes = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError

// NoInstance is nvmlEventData_t's gpuInstanceId / computeInstanceId when
// an event is not attributable to a GPU / compute instance (nvml.h,
// nvmlEventData_t: "set to 0xFFFFFFFF otherwise").
const NoInstance uint32 = 0xFFFFFFFF

// Default EventWatcher timings, used when EventConfig leaves them zero.
const (
	DefaultEventWait  = time.Second
	DefaultEventRetry = 10 * time.Second
)

// Calls named in EventConfig.OnNoData.
const (
	CallEventSetCreate = "event-set-create"
	CallRegisterEvents = "register-events"
)

// Event is one NVML event, decoded.
type Event struct {
	// UUID is the GPU the event came from; empty when its device cannot
	// be identified (the handle's GetUUID fails: a NULL handle answers
	// ERROR_INVALID_ARGUMENT). Such an event concerns every GPU.
	UUID string
	// Type is one nvml.EventType* bit.
	Type uint64
	// Data is the XID for nvml.EventTypeXidCriticalError (999 for an
	// unknown XID), 0 otherwise (nvml.h, nvmlEventData_t.eventData).
	Data uint64
	// GPUInstance and ComputeInstance locate the event within a MIG GPU,
	// NoInstance when it is not attributable to one (nvml.h,
	// nvmlEventData_t.gpuInstanceId / computeInstanceId).
	GPUInstance, ComputeInstance uint32
}

// EventConfig configures an EventWatcher.
type EventConfig struct {
	// Wait is the EventSet.Wait timeout: how long the watcher blocks
	// before it looks at GPU set changes. DefaultEventWait when zero.
	Wait time.Duration
	// Retry is how long the watcher waits before it retries a GPU whose
	// registration failed (lost, timed out) or rebuilds a set whose Wait
	// keeps failing. DefaultEventRetry when zero.
	Retry time.Duration
	// Clock times retries; the real clock when nil.
	Clock clock.Clock
	// OnEvent receives every event of a GPU in the current set (and
	// every event whose device cannot be identified), in order, on the
	// watcher's goroutine. Required.
	OnEvent func(Event)
	// OnState is told whether the event machinery works: nil once a set
	// is registered and its Wait answers, an error when creating or
	// registering a set or waiting on it fails (other than NOT_SUPPORTED
	// and a lost GPU). Called on changes, and on every failure.
	OnState func(err error)
	// OnNoData is told each time NVML answers NOT_SUPPORTED to call
	// (CallEventSetCreate, uuid empty, or CallRegisterEvents): no data,
	// never a fault.
	OnNoData func(call, uuid string)
}

// EventWatcher owns the NVML event set of the current GPU set. It creates
// the set through Owner.Lib and registers GPUs through Owner.Do; it keeps
// the set across rescans: new GPUs are registered on it, events of GPUs
// that left are ignored, and the set is rebuilt only when Wait fails (the
// new set registered before the old one is freed, so events are always
// being recorded). NVML records only events that occur after registration
// (nvml.h, nvmlDeviceRegisterEvents), so every rebuild that leaves a gap
// loses XIDs.
type EventWatcher struct {
	o   *Owner
	cfg EventConfig
	log *slog.Logger

	mu sync.Mutex
	// want is the GPU set of the last SetGPUs; gen counts its changes.
	want map[string]bool
	gen  uint64
	// ready is closed while the set of generation gen is registered.
	ready   chan struct{}
	isReady bool
	changed chan struct{}

	// Watcher goroutine only.
	set     EventSet
	handles map[string]Device // GPUs registered on set, by UUID
	active  map[string]bool   // registered and wanted
	retry   map[string]bool   // wanted, registration to retry
	nosup   map[string]bool   // wanted, events not supported
	logged  map[string]bool   // no-data already logged, by call/uuid
	failing bool              // the last Wait (or build) failed
	retryAt time.Time         // when a build or registrations are retried
	idle    bool              // no event sets here: wait for a GPU set change
	// tried is the GPU set generation the last build was for: a newer
	// one is tried at once, idle or not (wanted consumes the change
	// signal that sleep would otherwise wake on).
	tried uint64
	// released is the owner's release generation set was built under
	// (Owner.Release shuts NVML down: a set from before is gone).
	released uint64
}

// NewEventWatcher returns a watcher over o. Call SetGPUs and Run.
func NewEventWatcher(o *Owner, cfg EventConfig) *EventWatcher {
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultEventWait
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultEventRetry
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.OnEvent == nil {
		cfg.OnEvent = func(Event) {}
	}
	if cfg.OnState == nil {
		cfg.OnState = func(error) {}
	}
	if cfg.OnNoData == nil {
		cfg.OnNoData = func(string, string) {}
	}
	return &EventWatcher{
		o: o, cfg: cfg, log: o.log.With("component", "nvml-events"),
		want: map[string]bool{}, ready: make(chan struct{}), changed: make(chan struct{}, 1),
		handles: map[string]Device{}, active: map[string]bool{}, retry: map[string]bool{},
		nosup: map[string]bool{}, logged: map[string]bool{},
	}
}

// SetGPUs sets the GPUs whose events are wanted (after every discovery).
// An unchanged set costs nothing: the event set is kept as it is. It never
// waits for NVML.
func (w *EventWatcher) SetGPUs(uuids []string) {
	want := make(map[string]bool, len(uuids))
	for _, u := range uuids {
		want[u] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if maps.Equal(want, w.want) {
		return
	}
	w.want = want
	w.gen++
	w.setReadyLocked(false)
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Ready returns a channel that is closed once the event set is registered
// for the GPU set of the last SetGPUs (every GPU attempted once). A GPU
// set change or a failing set replaces it with a new, open channel, so
// take it again after SetGPUs. Events that occur before are not recorded.
func (w *EventWatcher) Ready() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready
}

// Listening reports whether Ready is closed.
func (w *EventWatcher) Listening() bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

func (w *EventWatcher) setReadyLocked(ok bool) {
	if ok == w.isReady {
		return
	}
	w.isReady = ok
	if ok {
		close(w.ready)
	} else {
		w.ready = make(chan struct{})
	}
}

// markReady reports the set registered for generation gen, unless the GPU
// set changed meanwhile.
func (w *EventWatcher) markReady(gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen == w.gen && w.set != nil {
		w.setReadyLocked(true)
	}
}

func (w *EventWatcher) notReady() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setReadyLocked(false)
}

// wanted is the GPU set to register now. It consumes the change signal:
// a SetGPUs after this sends a new one.
func (w *EventWatcher) wanted() (map[string]bool, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.changed:
	default:
	}
	return w.want, w.gen
}

func (w *EventWatcher) isWanted(uuid string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.want[uuid]
}

// Run keeps the event set and delivers its events until ctx ends, then
// frees the set. Wait blocks by design, so it runs here, on the watcher's
// own goroutine (never on a lane), for at most EventConfig.Wait at a time.
func (w *EventWatcher) Run(ctx context.Context) error {
	defer func() {
		w.notReady()
		w.free(context.WithoutCancel(ctx), w.set)
		w.setSet(nil)
	}()
	waitMs := uint32(w.cfg.Wait / time.Millisecond)
	for ctx.Err() == nil {
		want, gen := w.wanted()
		if w.set == nil {
			if gen != w.tried {
				// The GPU set changed since the last build (its signal
				// may have been consumed by wanted just now).
				w.retryAt, w.idle = time.Time{}, false
			}
			if len(want) == 0 || w.idle || !w.retryAt.IsZero() && w.cfg.Clock.Now().Before(w.retryAt) {
				w.sleep(ctx)
				continue
			}
			w.rebuild(ctx, want, gen)
			continue
		}
		if !w.sync(ctx, want, gen) {
			continue
		}
		// Wait outside the lanes, but counted: a release for a GPU
		// reset waits for it to return, and this waits for the release.
		if w.o.Enter(ctx) != nil {
			continue
		}
		if w.o.Generation() != w.released {
			w.o.Exit()
			// NVML was released for a GPU reset and initialised again:
			// the set belonged to the session before (not freed: NVML's
			// shutdown took it). Build a new one, as after a failed
			// Wait; XIDs during the reset were not recorded.
			w.log.Info("nvml was released for a gpu reset; building the event set again")
			w.setSet(nil)
			w.handles = map[string]Device{}
			w.rebuild(ctx, want, gen)
			continue
		}
		e, ret := w.set.Wait(waitMs)
		w.o.Exit()
		switch ret {
		case nvml.SUCCESS:
			w.working()
			w.deliver(e)
		case nvml.ERROR_TIMEOUT:
			w.working()
		case nvml.ERROR_GPU_IS_LOST:
			// A registered GPU fell off the bus (nvml.h,
			// nvmlEventSetWait_v2): the set is rebuilt; the lost GPU's
			// registration then fails with GPU_IS_LOST and is retried,
			// every other GPU is registered again as it was. Not a
			// fault of the node: the gpu-lost check reports the GPU.
			w.log.Warn("nvml event wait: a registered gpu is lost; rebuilding the event set")
			w.waitFailed(ctx, nil)
		default:
			err := fmt.Errorf("nvml event wait: %w", ret)
			w.log.Error("nvml event wait failed; rebuilding the event set", "err", err)
			w.waitFailed(ctx, err)
		}
	}
	return nil
}

// sleep waits for a GPU set change, the retry time or ctx.
func (w *EventWatcher) sleep(ctx context.Context) {
	var after <-chan time.Time
	if !w.retryAt.IsZero() {
		after = w.cfg.Clock.After(w.retryAt.Sub(w.cfg.Clock.Now()))
	}
	select {
	case <-ctx.Done():
	case <-w.changed:
		// A new GPU set is worth trying at once.
		w.retryAt, w.idle = time.Time{}, false
	case <-after:
	}
}

// working records a Wait that answered: the set works.
func (w *EventWatcher) working() {
	if w.failing {
		w.failing = false
		w.cfg.OnState(nil)
	}
}

// waitFailed rebuilds the set after a failed Wait (err nil for a lost
// GPU). A set whose Wait fails again before it ever answered is rebuilt
// only after the retry period (or a GPU set change), so a persistent
// failure does not spin.
func (w *EventWatcher) waitFailed(ctx context.Context, err error) {
	if err != nil {
		w.cfg.OnState(err)
	}
	if w.failing {
		w.notReady()
		w.retryAt = w.cfg.Clock.Now().Add(w.cfg.Retry)
		w.sleep(ctx)
		if ctx.Err() != nil {
			return
		}
	}
	w.failing = true
	want, gen := w.wanted()
	w.rebuild(ctx, want, gen)
}

// rebuild creates a new set, registers every wanted GPU on it and only
// then frees the old one. If the new set cannot be built, the old one (if
// any) is freed, since a set whose Wait failed is in an undefined state
// (nvml.h, nvmlDeviceRegisterEvents: "event set is in undefined state and
// should be freed"), and a new one is tried after the retry period.
func (w *EventWatcher) rebuild(ctx context.Context, want map[string]bool, gen uint64) {
	w.tried = gen
	w.released = w.o.Generation()
	old := w.set
	set, handles, err := w.build(ctx, want)
	if err != nil {
		w.notReady()
		w.setSet(nil)
		w.free(ctx, old)
		w.failing = true
		w.retryAt = w.cfg.Clock.Now().Add(w.cfg.Retry)
		if errors.Is(err, nvml.ERROR_NOT_SUPPORTED) {
			// No events on this platform (integrated GPUs, some
			// hypervisors): no data, not a fault. Try again only when
			// the GPU set changes.
			w.retryAt, w.idle = time.Time{}, true
			w.noData(CallEventSetCreate, "")
			w.cfg.OnState(nil)
			return
		}
		w.log.Error("nvml event set", "err", err, "retry", w.cfg.Retry)
		w.cfg.OnState(err)
		return
	}
	w.setSet(set)
	w.handles = handles
	w.free(ctx, old)
	w.markReady(gen)
	if old == nil {
		// A first set (or one after a failed build): it works once
		// built; a set rebuilt after a failed Wait proves itself with
		// its first Wait.
		w.failing = false
		w.cfg.OnState(nil)
	}
}

func (w *EventWatcher) setSet(set EventSet) {
	w.mu.Lock()
	w.set = set
	w.mu.Unlock()
}

// build creates a set and registers every GPU of want on it. It fails if
// the set cannot be created or a registration leaves it undefined
// (ERROR_UNKNOWN); a GPU that cannot be registered otherwise (lost, timed
// out, gone) is left for a retry.
func (w *EventWatcher) build(ctx context.Context, want map[string]bool) (EventSet, map[string]Device, error) {
	set, err := w.create(ctx)
	if err != nil {
		return nil, nil, err
	}
	handles := map[string]Device{}
	w.retryAt = time.Time{}
	clear(w.active)
	clear(w.retry)
	clear(w.nosup)
	if err := w.registerAll(ctx, set, slices.Collect(maps.Keys(want)), handles); err != nil {
		w.free(ctx, set)
		return nil, nil, err
	}
	return set, handles, nil
}

// sync brings the kept set up to the wanted GPU set: registers GPUs that
// appeared (and those due a retry), forgets those that left. It reports
// false if the set had to be rebuilt or dropped instead.
func (w *EventWatcher) sync(ctx context.Context, want map[string]bool, gen uint64) bool {
	retryDue := !w.retryAt.IsZero() && !w.cfg.Clock.Now().Before(w.retryAt)
	// NVML cannot unregister a device from a set: the events of a GPU
	// that left are dropped when they arrive. Its handle stays for the
	// lookup.
	maps.DeleteFunc(w.active, func(u string, _ bool) bool { return !want[u] })
	maps.DeleteFunc(w.retry, func(u string, _ bool) bool { return !want[u] })
	maps.DeleteFunc(w.nosup, func(u string, _ bool) bool { return !want[u] })
	var todo []string
	for u := range want {
		if !w.active[u] && !w.nosup[u] && (!w.retry[u] || retryDue) {
			todo = append(todo, u)
		}
	}
	if retryDue {
		w.retryAt = time.Time{}
	}
	if err := w.registerAll(ctx, w.set, todo, w.handles); err != nil {
		// The kept set is now undefined: replace it.
		w.log.Error("nvml event registration failed; rebuilding the event set", "err", err)
		w.cfg.OnState(err)
		w.failing = true
		w.rebuild(ctx, want, gen)
		return false
	}
	w.markReady(gen)
	return true
}

// create creates an event set on the library lane. A set created after
// the call timed out is freed at once, not leaked.
func (w *EventWatcher) create(ctx context.Context) (EventSet, error) {
	var mu sync.Mutex
	var created EventSet
	abandoned := false
	err := w.o.Lib(ctx, "event set create", func(lib Library) nvml.Return {
		set, ret := lib.EventSetCreate()
		mu.Lock()
		defer mu.Unlock()
		if ret != nvml.SUCCESS {
			return ret
		}
		if abandoned {
			// Already on the library lane: free it here.
			set.Free()
			return ret
		}
		created = set
		return ret
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		abandoned = true
		if created != nil {
			// The call finished just as it timed out.
			go w.free(context.WithoutCancel(ctx), created)
		}
		return nil, err
	}
	return created, nil
}

// free frees set on the library lane.
func (w *EventWatcher) free(ctx context.Context, set EventSet) {
	if set == nil {
		return
	}
	if err := w.o.Lib(ctx, "event set free", func(Library) nvml.Return { return set.Free() }); err != nil {
		w.log.Warn("freeing nvml event set", "err", err)
	}
}

// registerAll registers uuids on set, each on its GPU's lane and all at
// once, so a hung GPU delays the others by nothing. Registered handles go
// to handles. It fails only when a registration leaves the set undefined;
// a GPU that does not support events is left out for good, one that is
// lost, gone or hung is retried after the retry period.
func (w *EventWatcher) registerAll(ctx context.Context, set EventSet, uuids []string, handles map[string]Device) error {
	type result struct {
		dev Device
		err error
	}
	results := make([]result, len(uuids))
	var wg sync.WaitGroup
	for i, u := range uuids {
		wg.Go(func() {
			got := make(chan Device, 1)
			err := w.o.Do(ctx, u, "register events", func(dev Device) nvml.Return {
				ret := dev.RegisterEvents(EventTypes, set)
				if ret == nvml.ERROR_NOT_SUPPORTED {
					// Nothing was registered (nvml.h); some GPUs
					// give XIDs but not the ECC events.
					ret = dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
				}
				if ret == nvml.SUCCESS {
					got <- dev
				}
				return ret
			})
			if err == nil {
				results[i] = result{dev: <-got}
			} else {
				results[i] = result{err: err}
			}
		})
	}
	wg.Wait()
	var errs []error
	for i, u := range uuids {
		r := results[i]
		switch err := r.err; {
		case err == nil:
			w.active[u] = true
			delete(w.retry, u)
			handles[u] = r.dev
		case errors.Is(err, nvml.ERROR_NOT_SUPPORTED):
			w.nosup[u] = true
			delete(w.retry, u)
			w.noData(CallRegisterEvents, u)
		case errors.Is(err, nvml.ERROR_UNKNOWN), errors.Is(err, nvml.ERROR_UNINITIALIZED):
			// nvml.h, nvmlDeviceRegisterEvents: "If function reports
			// NVML_ERROR_UNKNOWN, event set is in undefined state and
			// should be freed."
			errs = append(errs, fmt.Errorf("gpu %s: %w", u, err))
		default:
			// Lost, gone, timed out (a hung GPU): the gpu-lost check
			// and the owner's Hung report those; register it again
			// later.
			w.retry[u] = true
			w.log.Debug("registering nvml events; will retry", "device", u, "err", err, "retry", w.cfg.Retry)
		}
	}
	if len(w.retry) > 0 && w.retryAt.IsZero() {
		w.retryAt = w.cfg.Clock.Now().Add(w.cfg.Retry)
	}
	return errors.Join(errs...)
}

// noData counts a NOT_SUPPORTED answer and logs it the first time.
func (w *EventWatcher) noData(call, uuid string) {
	w.cfg.OnNoData(call, uuid)
	if key := call + "/" + uuid; !w.logged[key] {
		w.logged[key] = true
		if uuid == "" {
			w.log.Info("nvml events not supported on this platform; polled checks only", "call", call)
		} else {
			w.log.Info("gpu does not support nvml events; polled checks only", "device", uuid, "call", call)
		}
	}
}

// deliver identifies e's GPU and hands it on, unless the GPU has left.
func (w *EventWatcher) deliver(e EventData) {
	ev := Event{UUID: w.uuidOf(e.Device), Type: e.EventType, Data: e.EventData,
		GPUInstance: e.GpuInstanceId, ComputeInstance: e.ComputeInstanceId}
	if ev.UUID != "" && !w.isWanted(ev.UUID) {
		w.log.Debug("nvml event of a gpu no longer present; ignored", "device", ev.UUID, "type", ev.Type, "data", ev.Data)
		return
	}
	w.cfg.OnEvent(ev)
}

// uuidOf finds the UUID of an event's device: a registered handle first
// (no NVML call), then the handle's GetUUID. Real NVML never gives a nil
// Device (go-nvml wraps the C handle, NULL included); GetUUID on a NULL
// handle answers ERROR_INVALID_ARGUMENT, so the device is unknown ("").
func (w *EventWatcher) uuidOf(dev Device) string {
	if dev == nil {
		return ""
	}
	for u, h := range w.handles {
		if sameHandle(h, dev) {
			return u
		}
	}
	// An unregistered handle: asked here, on the watcher's goroutine,
	// which blocks in Wait anyway, rather than on the library lane.
	uuid, ret := safeUUID(dev)
	if ret != nvml.SUCCESS {
		return ""
	}
	return uuid
}

// sameHandle compares two handles; an incomparable implementation (a
// test double holding a func or map) is simply not equal.
func sameHandle(a, b Device) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

func safeUUID(dev Device) (uuid string, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			uuid, ret = "", nvml.ERROR_UNKNOWN
		}
	}()
	return dev.GetUUID()
}

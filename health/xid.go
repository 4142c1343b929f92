package health

import (
	"context"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// noInstance is the GPU/compute instance ID NVML reports for events not
// attributable to a GPU/compute instance.
const noInstance = nvmlowner.NoInstance

// xidWatcher turns the NVML events of the owner's event watcher into
// observations as they arrive (event driven, not polled). The event set
// itself (kept across rescans, rebuilt without a gap) is the owner's
// business; this file decides which devices an event concerns and what
// it does to them. Failures of the event machinery are node-wide NVML
// faults; NOT_SUPPORTED is no data.
type xidWatcher struct {
	m  *Monitor
	ew *nvmlowner.EventWatcher
}

// eventsHook connects SetNode and Listening to the running watcher.
type eventsHook struct {
	mu sync.Mutex
	w  *nvmlowner.EventWatcher
}

func newXIDWatcher(m *Monitor) *xidWatcher {
	w := &xidWatcher{m: m}
	w.ew = nvmlowner.NewEventWatcher(m.owner, nvmlowner.EventConfig{
		Wait:    m.cfg.eventWait,
		Retry:   m.cfg.PollInterval,
		Clock:   m.clock,
		OnEvent: w.handle,
		OnState: func(err error) { m.Observe(nodeEventsObservation(err)) },
		OnNoData: func(call, uuid string) {
			m.metrics.noData.WithLabelValues(uuid, call).Inc()
		},
	})
	return w
}

func (w *xidWatcher) Name() string { return CheckXID }

// nodeEventsObservation is the node-wide NVML cause of the event
// machinery failing (err) or working (nil).
func nodeEventsObservation(err error) Observation {
	o := Observation{DeviceID: NodeID, Check: CheckNVML, Key: "events"}
	if err != nil {
		o.Fatal, o.Reason = true, err.Error()
	} else {
		o.Cleared = true
	}
	return o
}

// run runs the event watcher until ctx ends.
func (w *xidWatcher) run(ctx context.Context) {
	w.m.events.attach(w.m, w.ew)
	defer w.m.events.attach(w.m, nil)
	_ = w.ew.Run(ctx)
}

// attach makes ew the watcher SetNode tells about GPU set changes, and
// hands it the current GPU set.
func (h *eventsHook) attach(m *Monitor, ew *nvmlowner.EventWatcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.w = ew
	if ew != nil {
		ew.SetGPUs(gpuUUIDs(m.gpuList()))
	}
}

// nodeChanged tells the watcher the current GPU set. Under h.mu, so the
// last caller's (newest) set is the one the watcher keeps; an unchanged
// set costs nothing (the event set is kept).
func (h *eventsHook) nodeChanged(m *Monitor) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w != nil {
		h.w.SetGPUs(gpuUUIDs(m.gpuList()))
	}
}

func (h *eventsHook) listening() bool {
	h.mu.Lock()
	w := h.w
	h.mu.Unlock()
	return w != nil && w.Listening()
}

func gpuUUIDs(gpus []topology.GPU) []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = g.UUID
	}
	return out
}

// handle turns one event into observations of the devices it concerns.
func (w *xidWatcher) handle(e nvmlowner.Event) {
	o, wholeGPU := w.observation(e)
	targets := attribute(w.m.gpuList(), e, wholeGPU, w.m.cfg.MIGDevicesServed)
	if len(targets) == 0 {
		// The node model no longer has the GPU (it left between the
		// owner's filter and here).
		w.m.log.Debug("nvml event for a device not in the node model; ignored", "device", e.UUID, "type", e.Type, "data", e.Data)
		return
	}
	if e.UUID == "" {
		w.m.log.Warn("nvml event without an identifiable device; charged to every gpu", "type", e.Type, "data", e.Data)
	}
	for _, t := range targets {
		obs := o
		obs.DeviceID, obs.Kind = t.id, t.kind
		w.m.Observe(obs)
	}
}

// observation is what event e says, before it is charged to devices, and
// whether it concerns the whole GPU whatever instance it names.
func (w *xidWatcher) observation(e nvmlowner.Event) (o Observation, wholeGPU bool) {
	switch e.Type {
	case nvml.EventTypeXidCriticalError:
		// The same observation the kernel log's Xid line makes
		// (kernlog.go).
		return w.m.xidObservation(e.Data)
	case nvml.EventTypeDoubleBitEccError:
		// An uncorrectable ECC error: the GPU's memory needs a reset
		// (page retirement / row remapping happen then).
		return Observation{Check: CheckXID, Key: "dbe", Fatal: true, Event: true, HoldUntilReset: true,
			Reason: "double-bit ECC error event"}, true
	case nvml.EventTypeSingleBitEccError:
		return Observation{Check: CheckXID, Key: "sbe", Reason: "single-bit ECC error event"}, false
	}
	return Observation{Check: CheckXID, Key: "event", Reason: fmt.Sprintf("nvml event type %#x", e.Type)}, false
}

// eventTarget is a device an event is charged to.
type eventTarget struct{ id, kind string }

// attribute says which devices of gpus event e concerns, following
// nvml.h's nvmlEventData_t: gpuInstanceId is valid "if MIG is enabled and
// nvmlEventTypeXidCriticalError event is attributable to a GPU instance",
// computeInstanceId "if ... attributable to a compute instance", each
// 0xFFFFFFFF otherwise. So:
//   - no identifiable device: every GPU (as NVIDIA's k8s-device-plugin,
//     internal/rm/health.go, marks every device when GetUUID fails);
//   - wholeGPU (a reset-class XID, a DBE), or MIG devices not served (the
//     GPU is the only device the kubelet knows), or no instance: the GPU;
//   - GPU and compute instance: that MIG device;
//   - GPU instance only: every MIG device of that GPU instance;
//   - an instance that matches no MIG device (the layout changed under
//     the event): the GPU, rather than losing the fault.
//
// A GPU not in gpus gets nothing.
func attribute(gpus []topology.GPU, e nvmlowner.Event, wholeGPU, migServed bool) []eventTarget {
	var out []eventTarget
	if e.UUID == "" {
		for _, g := range gpus {
			out = append(out, eventTarget{g.UUID, KindGPU})
		}
		return out
	}
	for _, g := range gpus {
		if g.UUID != e.UUID {
			continue
		}
		gpu := []eventTarget{{g.UUID, KindGPU}}
		if wholeGPU || !migServed || e.GPUInstance == noInstance {
			return gpu
		}
		for _, mig := range g.MIG {
			if uint32(mig.GPUInstance) != e.GPUInstance {
				continue
			}
			if e.ComputeInstance == noInstance || uint32(mig.ComputeInstance) == e.ComputeInstance {
				out = append(out, eventTarget{mig.UUID, KindMIG})
			}
		}
		if len(out) == 0 {
			return gpu
		}
		return out
	}
	return nil
}

package health

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// xidEvents are the NVML events the watcher registers for.
const xidEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError

// noInstance is the GPU/compute instance ID NVML reports for events that
// are not tied to a MIG device.
const noInstance = 0xFFFFFFFF

// errWaitGPULost is EventSet.Wait failing because a registered GPU is
// lost: the gpu-lost check reports that GPU; the set is built again after
// a poll interval, without it, and the node is not at fault.
var errWaitGPULost = errors.New("nvml event wait: a registered gpu is lost")

// xidWatcher blocks in EventSet.Wait and turns each NVML event into an
// observation as it arrives (event-driven, not polled). Fatal XIDs make
// the device unfit; others are counted. Events carrying a GPU/compute
// instance go to the matching MIG device. Failures of the event machinery
// itself are node-wide NVML faults.
type xidWatcher struct {
	m     *Monitor
	fatal map[uint64]bool
	// notSupported remembers GPUs already logged as lacking events.
	notSupported map[string]bool
}

func newXIDWatcher(m *Monitor) *xidWatcher {
	w := &xidWatcher{m: m, fatal: map[uint64]bool{}, notSupported: map[string]bool{}}
	for _, x := range m.cfg.FatalXIDs {
		w.fatal[x] = true
	}
	return w
}

func (w *xidWatcher) Name() string { return CheckXID }

func (w *xidWatcher) nodeObservation(err error) Observation {
	o := Observation{DeviceID: NodeID, Check: CheckNVML, Key: "events"}
	if err != nil {
		o.Fatal, o.Reason = true, err.Error()
	} else {
		o.Cleared = true
	}
	return o
}

// run (re)builds the event set whenever the node changes or the set fails,
// until ctx ends.
func (w *xidWatcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		gpus := w.m.gpuList()
		if len(gpus) == 0 {
			select {
			case <-ctx.Done():
			case <-w.m.nodeChanged:
			}
			continue
		}
		err := w.watch(ctx, gpus)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errWaitGPULost) {
			w.m.log.Warn("nvml event wait: a registered gpu is lost; registering again", "retry", w.m.cfg.PollInterval)
		} else if err != nil {
			w.m.Observe(w.nodeObservation(err))
			w.m.log.Error("nvml event watch failed; retrying", "err", err, "retry", w.m.cfg.PollInterval)
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-w.m.nodeChanged:
			case <-w.m.clock.After(w.m.cfg.PollInterval):
			}
		}
	}
}

// watch creates an event set for gpus and handles events until ctx ends,
// the node changes, a GPU that could not be registered should be retried,
// or NVML fails (returned).
func (w *xidWatcher) watch(ctx context.Context, gpus []topology.GPU) error {
	set, ret := w.m.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml event set create: %w", ret)
	}
	defer set.Free()
	byUUID := map[string]topology.GPU{}
	handles := map[string]nvml.Device{}
	retry := false
	for _, g := range gpus {
		byUUID[g.UUID] = g
		dev, ret := w.m.lib.DeviceGetHandleByUUID(g.UUID)
		if ret == nvml.SUCCESS {
			ret = dev.RegisterEvents(xidEvents, set)
			if ret == nvml.ERROR_NOT_SUPPORTED {
				// Some GPUs support XIDs but not the ECC events.
				ret = dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
			}
		}
		switch ret {
		case nvml.SUCCESS:
			handles[g.UUID] = dev
		case nvml.ERROR_NOT_SUPPORTED:
			if !w.notSupported[g.UUID] {
				w.notSupported[g.UUID] = true
				w.m.log.Info("gpu does not support xid events; polled checks only", "device", g.UUID)
			}
		default:
			// Lost GPUs are the gpu-lost check's business; register again
			// once they may be back.
			retry = true
			w.m.log.Debug("registering nvml events", "device", g.UUID, "err", ret)
		}
	}
	w.m.Observe(w.nodeObservation(nil))
	w.m.eventsReady.Store(true)
	defer w.m.eventsReady.Store(false)
	started := w.m.clock.Now()
	waitMs := uint32(w.m.cfg.eventWait / time.Millisecond)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.m.nodeChanged:
			return nil
		default:
		}
		if retry && w.m.clock.Since(started) >= w.m.cfg.PollInterval {
			return nil
		}
		e, ret := set.Wait(waitMs)
		switch ret {
		case nvml.SUCCESS:
			w.handle(e, byUUID, handles)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			// One registered GPU fell off the bus: the gpu-lost check
			// reports it; build the set again without it.
			return errWaitGPULost
		default:
			return fmt.Errorf("nvml event wait: %w", ret)
		}
	}
}

// handle turns one event into observations.
func (w *xidWatcher) handle(e nvml.EventData, byUUID map[string]topology.GPU, handles map[string]nvml.Device) {
	var targets []topology.GPU
	if e.Device == nil {
		// NVML reports some XIDs without a device: they concern them all.
		for _, g := range byUUID {
			targets = append(targets, g)
		}
	} else if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS && byUUID[uuid].UUID != "" {
		targets = append(targets, byUUID[uuid])
	} else {
		for uuid, h := range handles {
			if h == e.Device {
				targets = append(targets, byUUID[uuid])
			}
		}
	}
	if len(targets) == 0 {
		w.m.log.Warn("nvml event for an unknown device", "type", e.EventType, "data", e.EventData)
		return
	}
	for _, g := range targets {
		o := w.observation(e)
		o.DeviceID, o.Kind = g.UUID, KindGPU
		if e.GpuInstanceId != noInstance && e.ComputeInstanceId != noInstance {
			for _, mig := range g.MIG {
				if uint32(mig.GPUInstance) == e.GpuInstanceId && uint32(mig.ComputeInstance) == e.ComputeInstanceId {
					o.DeviceID, o.Kind = mig.UUID, KindMIG
				}
			}
		}
		w.m.Observe(o)
	}
}

func (w *xidWatcher) observation(e nvml.EventData) Observation {
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		fatal := w.fatal[e.EventData]
		return Observation{Check: CheckXID, Key: "xid " + strconv.FormatUint(e.EventData, 10),
			Fatal: fatal, Event: fatal, Reason: fmt.Sprintf("xid %d", e.EventData), XID: e.EventData}
	case nvml.EventTypeDoubleBitEccError:
		return Observation{Check: CheckXID, Key: "dbe", Fatal: true, Event: true, Reason: "double-bit ECC error event"}
	case nvml.EventTypeSingleBitEccError:
		return Observation{Check: CheckXID, Key: "sbe", Reason: "single-bit ECC error event"}
	}
	return Observation{Check: CheckXID, Key: "event", Reason: fmt.Sprintf("nvml event type %#x", e.EventType)}
}

package health

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// CheckKernelLog reads the kernel log (package kernlog) for the faults the
// NVIDIA drivers write there. Its XIDs are observations of check "xid",
// as NVML's are (xiddedup.go counts an XID both report once); its own
// causes are a GPU fallen off the bus (key "fallen-off-the-bus") and a
// fatal NVSwitch SXid (key "sxid").
const CheckKernelLog = "kernel-log"

// kernelLogFirstStartHorizon is kernlog.Config.FirstStartHorizon.
const kernelLogFirstStartHorizon = 10 * time.Minute

// SourceKernelLog is Observation.Source of what the kernel log reports.
const SourceKernelLog = "kernel-log"

// kernelLogCheck turns kernel log events into observations. It calls no
// NVML, so it keeps reporting while NVML calls hang (a GPU in that state
// is what the log still speaks of) or the library is gone: the node model
// (SetNode) maps PCI bus IDs to GPUs.
type kernelLogCheck struct {
	m      *Monitor
	reader *kernlog.Reader
	// sxids counts NVSwitch SXids by switch, number and severity.
	sxids *prometheus.CounterVec
	// unattributed counts events naming a PCI address no GPU of the node
	// model has.
	unattributed prometheus.Counter
}

func (c *kernelLogCheck) Name() string { return CheckKernelLog }

func newKernelLogCheck(m *Monitor, reg prometheus.Registerer) (*kernelLogCheck, error) {
	r, err := kernlog.NewReader(kernlog.Config{
		Mode:       m.cfg.KernelLog,
		HostRoot:   m.cfg.HostRoot,
		StateDir:   m.cfg.StateDir,
		Journalctl: m.cfg.journalctl,
		// Long enough for the agent's start after a boot (the driver
		// loads, the DaemonSet's pod starts) so that the boot's own
		// faults are acted on; short enough that a first rollout over a
		// fleet does not hold GPUs for XIDs logged days ago.
		FirstStartHorizon: kernelLogFirstStartHorizon,
	}, m.log.With("check", CheckKernelLog), reg)
	if err != nil {
		return nil, err
	}
	c := &kernelLogCheck{m: m, reader: r,
		sxids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_nvswitch_sxid_errors_total",
			Help: "NVSwitch SXid errors read from the kernel log, by switch (N of nvidia-nvswitchN), SXid and whether the driver called it fatal (true or false).",
		}, []string{"nvswitch", "sxid", "fatal"}),
		unattributed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_kernel_log_unattributed_total",
			Help: "GPU faults in the kernel log naming a PCI address no GPU in the node model has (ignored).",
		}),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{c.sxids, c.unattributed} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("kernel log metrics: %w", err)
			}
		}
	}
	return c, nil
}

func (c *kernelLogCheck) run(ctx context.Context) {
	_ = c.reader.Run(ctx, c.handle)
}

// handle turns one event into observations of the devices it concerns.
func (c *kernelLogCheck) handle(e kernlog.Event) {
	gpus := c.m.gpuList()
	switch e.Kind {
	case kernlog.KindXID:
		if !c.m.cfg.Enabled(CheckXID) {
			// health.disabledChecks: [xid] switches XIDs off whichever
			// source reports them.
			return
		}
		g, ok := gpuByBus(gpus, e.BusID)
		if !ok {
			c.unattributedEvent(e)
			return
		}
		o, wholeGPU := c.m.xidObservation(e.Code)
		o.Source = SourceKernelLog
		ev := nvmlowner.Event{UUID: g.UUID, Data: e.Code, GPUInstance: e.GPUInstance, ComputeInstance: e.ComputeInstance}
		for _, t := range attribute(gpus, ev, wholeGPU, c.m.cfg.MIGDevicesServed) {
			obs := o
			obs.DeviceID, obs.Kind = t.id, t.kind
			c.m.Observe(obs)
		}
	case kernlog.KindFallenOffBus:
		g, ok := gpuByBus(gpus, e.BusID)
		if !ok {
			c.unattributedEvent(e)
			return
		}
		// The driver found the GPU's registers reading all ones: the
		// GPU is gone from the bus, as with XID 79, whose catalog bucket
		// is RESTART_BM (xidtable.go). Held until a reset or reboot.
		c.m.Observe(Observation{DeviceID: g.UUID, Kind: KindGPU, Check: CheckKernelLog, Key: "fallen-off-the-bus",
			Fatal: true, Event: true, HoldUntilReset: true, Action: ActionReboot, Source: SourceKernelLog,
			Reason: "gpu has fallen off the bus (kernel log)"})
	case kernlog.KindSXID:
		c.sxids.WithLabelValues(strconv.Itoa(e.Switch), strconv.FormatUint(e.Code, 10), strconv.FormatBool(e.Fatal)).Inc()
		if !e.Fatal {
			c.m.log.Info("nvswitch non-fatal sxid", "nvswitch", e.Switch, "pci", e.BusID, "sxid", e.Code, "text", e.Text)
			return
		}
		// NVIDIA's Fabric Manager user guide (docs.nvidia.com/datacenter/
		// tesla/fabric-manager-user-guide, "NVSwitch SXid errors" and
		// error handling): a fatal SXid leaves the switch's links unusable
		// and the CUDA jobs on the fabric aborted until the GPUs and
		// NVSwitches are reset. The NVSwitches of an HGX baseboard serve
		// every GPU on it, and the log does not say which GPUs' traffic
		// the failing port carried, so every GPU of the node is charged,
		// held until its reset (or a reboot, or an operator's clear).
		reason := fmt.Sprintf("nvswitch%d sxid %d: %s (kernel log)", e.Switch, e.Code, e.Text)
		for _, g := range gpus {
			c.m.Observe(Observation{DeviceID: g.UUID, Kind: KindGPU, Check: CheckKernelLog, Key: "sxid",
				Fatal: true, Event: true, HoldUntilReset: true, Action: ActionResetGPU, Source: SourceKernelLog,
				Reason: reason})
		}
	}
}

func (c *kernelLogCheck) unattributedEvent(e kernlog.Event) {
	c.unattributed.Inc()
	c.m.log.Warn("kernel log fault for a PCI address no GPU of the node has; ignored", "kind", e.Kind, "pci", e.BusID, "code", e.Code)
}

// gpuByBus finds the GPU at PCI address bus ("dddd:bb:dd", an Xid line
// names no function; a GPU is function 0).
func gpuByBus(gpus []topology.GPU, bus string) (topology.GPU, bool) {
	for _, g := range gpus {
		if g.PCIBusID != "" && kernlog.BusIDOf(g.PCIBusID) == bus {
			return g, true
		}
	}
	return topology.GPU{}, false
}

// xidObservation is the observation of XID x, whichever source reported
// it, before it is charged to devices, and whether it concerns the whole
// GPU whatever instance it names (a reset- or reboot-class XID needs the
// whole GPU reset, so every MIG device on it is affected).
func (m *Monitor) xidObservation(x uint64) (Observation, bool) {
	class := ClassifyXID(x)
	fatal, hold := m.cfg.FatalXID(x)
	return Observation{Check: CheckXID, Key: "xid " + strconv.FormatUint(x, 10),
		Fatal: fatal, Event: fatal, HoldUntilReset: hold,
		Reason: fmt.Sprintf("xid %d (%s)", x, class), XID: x}, class.holds()
}

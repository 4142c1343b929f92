package preflight

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Inputs is what a preflight reads besides its configuration. The caller
// discovers the node just before (a preflight judges the node as it is
// now).
type Inputs struct {
	// Owner reads the GPUs; nil when NVML is unavailable.
	Owner *nvmlowner.Owner
	// Node is the node as a discovery just found it: GPUs by index with
	// bus IDs and models, the driver version. Nil when NVML is
	// unavailable; NodeErr then says why.
	Node    *topology.Node
	NodeErr error
	// BusGPUs are the NVIDIA GPUs on the PCI bus (health.GPUsOnPCI under
	// the host root); BusErr when the bus could not be read.
	BusGPUs []string
	BusErr  error
	// ExpectedGPUs is the expected GPU count from the node label
	// preflight.gpuCount.label names (0: none; gpuCount.expected then);
	// ExpectedGPUsErr when that label's value is not a count (the item
	// fails naming it). ExpectedGPUsFromLabels reads both.
	ExpectedGPUs    int
	ExpectedGPUsErr error
	// RDMADevices are the node's RDMA devices (rdma.Discover) and
	// RDMAResources the configured resources whose ports are checked;
	// RDMAErr when discovery failed.
	RDMADevices   []rdma.Device
	RDMAResources []rdma.ResourceConfig
	RDMAErr       error
	// DCGM runs DCGM's diagnostic; nil without DCGM (DCGMErr may say why).
	DCGM    DCGMDiag
	DCGMErr error
	// Busy, when set, says why the items that load the GPUs (dcgm-diag,
	// command) must not run now, e.g. "pods hold GPU 2, GPU 5": they are
	// reported skipped with it. The agent sets it when a node that was
	// never proven already runs GPU pods (preflight switched on for a
	// fleet in use); the reading items run as always.
	Busy string
	// WrapCommand, when set, rewrites the command that is run: a
	// simulated node's command-fail and command-slow faults (the agent
	// sets it from the hardware). Nil runs command.args as configured.
	WrapCommand func(args []string) []string
}

// Checker runs preflights with one configuration.
type Checker struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New returns a Checker; cfg must have passed Validate. log may be nil.
func New(cfg Config, log *slog.Logger) *Checker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Checker{cfg: cfg.WithDefaults(), log: log, now: time.Now}
}

// Config is the configuration with defaults filled in.
func (c *Checker) Config() Config { return c.cfg }

// Run runs every item once: first what only reads (the PCI bus, the
// driver, every GPU at the same time, each on its own NVML lane, so a GPU
// that hangs costs its own results the NVML call timeout and delays no
// other; the RDMA ports), then DCGM's diagnostic, then the command, one
// after the other: each of those two loads the GPUs, which would change
// the readings (clocks event reasons, the link speed of an idle GPU) and
// disturb the other's measurements.
func (c *Checker) Run(ctx context.Context, in Inputs) *Report {
	rep := &Report{Started: c.now()}
	var gpus []topology.GPU
	if in.Node != nil {
		gpus = in.Node.GPUs
	}
	byUUID := map[string]gpu{}
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		byUUID[g.UUID] = gpuOf(g)
		uuids[i] = g.UUID
	}
	var results []Result
	add := func(item string, run func() []Result) {
		if c.cfg.disabled(item) {
			results = append(results, Result{Item: item, Target: "node", Status: Skipped, Detail: "disabled (preflight.disabledItems)"})
			return
		}
		results = append(results, run()...)
	}
	add(ItemGPUCount, func() []Result { return []Result{checkGPUCount(c.cfg, &in)} })
	add(ItemDriverVersion, func() []Result { return []Result{checkDriver(c.cfg, &in)} })
	results = append(results, c.runGPUs(ctx, in, gpus)...)
	add(ItemRDMA, func() []Result { return checkRDMA(c.cfg, &in) })
	disruptive := func(item string, run func() []Result) {
		if in.Busy != "" && !c.cfg.disabled(item) {
			results = append(results, Result{Item: item, Target: "node", Status: Skipped, Detail: "not run: " + in.Busy})
			return
		}
		add(item, run)
	}
	disruptive(ItemDCGM, func() []Result { return checkDCGM(ctx, c.cfg, &in, byUUID) })
	disruptive(ItemCommand, func() []Result { return []Result{checkCommand(ctx, c.cfg, uuids, in.WrapCommand)} })

	rep.Results = sortResults(results)
	rep.Finished = c.now()
	c.logReport(rep)
	return rep
}

// RunGPUs runs the per-GPU items (GPUItems) on the GPUs of in.Node whose
// UUIDs are listed: a periodic re-check of GPUs no pod is allocated.
func (c *Checker) RunGPUs(ctx context.Context, in Inputs, uuids []string) *Report {
	rep := &Report{Started: c.now()}
	var gpus []topology.GPU
	if in.Node != nil {
		for _, g := range in.Node.GPUs {
			if slices.Contains(uuids, g.UUID) {
				gpus = append(gpus, g)
			}
		}
	}
	rep.Results = sortResults(c.runGPUs(ctx, in, gpus))
	rep.Finished = c.now()
	c.logReport(rep)
	return rep
}

// runGPUs reads gpus and judges every enabled per-GPU item on each.
func (c *Checker) runGPUs(ctx context.Context, in Inputs, gpus []topology.GPU) []Result {
	var out []Result
	var enabled []string
	for _, item := range GPUItems {
		if c.cfg.disabled(item) {
			out = append(out, Result{Item: item, Target: "node", Status: Skipped, Detail: "disabled (preflight.disabledItems)"})
			continue
		}
		enabled = append(enabled, item)
	}
	if len(enabled) == 0 {
		return out
	}
	if in.Owner == nil || in.Node == nil {
		for _, item := range enabled {
			out = append(out, Result{Item: item, Target: "node", Status: Skipped, Detail: "no GPU read: NVML unavailable"})
		}
		return out
	}
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	samples := in.Owner.ReadPreflight(ctx, uuids)
	for i, g := range gpus {
		ref, s := gpuOf(g), &samples[i]
		for _, item := range enabled {
			if s.Err != nil {
				what := "not read"
				switch {
				case s.Lost():
					what = "GPU lost or gone"
				case s.TimedOut():
					what = "GPU not answering (nvml-timeout)"
				}
				out = append(out, ref.result(item, Fail, "%s: %v", what, s.Err))
				continue
			}
			out = append(out, gpuItems[item](c.cfg, ref, s))
		}
	}
	return out
}

// sortResults orders results by item (Items order), keeping each item's
// targets in the order they were judged (GPUs by index, ports by
// resource).
func sortResults(rs []Result) []Result {
	slices.SortStableFunc(rs, func(a, b Result) int {
		return slices.Index(Items, a.Item) - slices.Index(Items, b.Item)
	})
	return rs
}

func (c *Checker) logReport(rep *Report) {
	if rep.Passed() {
		c.log.Info("preflight passed", "results", len(rep.Results), "took", rep.Finished.Sub(rep.Started))
		return
	}
	for _, r := range rep.Failed() {
		c.log.Warn("preflight item failed", "item", r.Item, "target", r.Target, "device", r.Device, "detail", r.Detail)
	}
}

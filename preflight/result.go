package preflight

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The items, in the order a Report lists them. Per-GPU items give one
// Result per GPU; the others one per node, port or failed DCGM test.
const (
	ItemGPUCount      = "gpu-count"        // GPUs on the PCI bus = GPUs in NVML = expected
	ItemDriverVersion = "driver-version"   // the driver at least driver.minVersion
	ItemPersistence   = "persistence-mode" // per GPU: driver persistence mode enabled
	ItemECC           = "ecc-mode"         // per GPU: ECC enabled, now and after the next reboot, where supported
	ItemRetiredPages  = "retired-pages"    // per GPU: no page waiting to be retired (Kepler to Volta)
	ItemRowRemap      = "row-remap"        // per GPU: no row remap pending, no remap failure (Ampere and later)
	ItemPCIe          = "pcie-link"        // per GPU: the link at its maximum generation and width
	ItemNVLink        = "nvlink"           // per GPU: every NVLink its model wires up
	ItemFabric        = "fabric"           // per GPU: NVSwitch fabric registration completed
	ItemThrottle      = "throttle"         // per GPU: no counted clocks event reason active
	ItemRDMA          = "rdma-ports"       // per port: ACTIVE/LinkUp, netdevs up, at the expected rate
	ItemDCGM          = "dcgm-diag"        // DCGM's diagnostic at dcgm.level passes
	ItemCommand       = "command"          // the operator's command exits 0 within its timeout
)

// Items lists every item in report order.
var Items = []string{
	ItemGPUCount, ItemDriverVersion, ItemPersistence, ItemECC, ItemRetiredPages, ItemRowRemap,
	ItemPCIe, ItemNVLink, ItemFabric, ItemThrottle, ItemRDMA, ItemDCGM, ItemCommand,
}

// GPUItems are the items read from each GPU on its own: what a periodic
// re-check of an idle GPU runs (RunGPUs).
var GPUItems = []string{ItemPersistence, ItemECC, ItemRetiredPages, ItemRowRemap, ItemPCIe, ItemNVLink, ItemFabric, ItemThrottle}

// Status is an item's verdict on one target.
type Status string

// Statuses. Skipped is neither pass nor fail: the item could not judge
// (the GPU does not report it, nothing is configured, DCGM is absent) or
// is disabled; the message says which.
const (
	Pass    Status = "pass"
	Fail    Status = "fail"
	Skipped Status = "skipped"
)

// Result is one item's verdict on one target.
type Result struct {
	Item string
	// Target names what was checked for people: "GPU 3 (0000:1b:00.0)",
	// "rdma/ib mlx5_0", "node".
	Target string
	// Device is the GPU UUID or RDMA port ID the result is about; empty
	// for the node.
	Device string
	Status Status
	// Detail is what was seen against what was expected, without the
	// target: "PCIe link gen 4 x8, max gen 5 x16".
	Detail string
}

// Message is the result as one line: "GPU 3 (0000:1b:00.0): PCIe link gen
// 4 x8, max gen 5 x16".
func (r Result) Message() string { return r.Target + ": " + r.Detail }

// Report is one preflight run.
type Report struct {
	Started, Finished time.Time
	// Results are in Items order, then by target (GPUs by index).
	Results []Result
}

// Passed reports whether no result failed.
func (r *Report) Passed() bool { return len(r.Failed()) == 0 }

// Failed returns the failed results.
func (r *Report) Failed() []Result {
	var out []Result
	for _, x := range r.Results {
		if x.Status == Fail {
			out = append(out, x)
		}
	}
	return out
}

// ItemStatus is an item's verdict over all its targets: Fail if any
// failed, else Pass if any passed, else Skipped (also for an item the
// report does not hold). A metric per item reads it.
func (r *Report) ItemStatus(item string) Status {
	st := Skipped
	for _, x := range r.Results {
		if x.Item != item {
			continue
		}
		switch x.Status {
		case Fail:
			return Fail
		case Pass:
			st = Pass
		}
	}
	return st
}

// FailedDevices are the GPU UUIDs and port IDs with a failed result (a
// periodic re-check's health observations name them).
func (r *Report) FailedDevices() []string {
	var out []string
	for _, x := range r.Failed() {
		if x.Device != "" && !slices.Contains(out, x.Device) {
			out = append(out, x.Device)
		}
	}
	return out
}

// Summary is one line for a node condition's message: "preflight passed
// (13 items)" or "preflight failed: pcie-link: GPU 3 (0000:1b:00.0): PCIe
// link gen 4 x8, max gen 5 x16; ecc-mode: ...", cut at max bytes (0: no
// limit) with the number of failures left out.
func (r *Report) Summary(max int) string {
	failed := r.Failed()
	if len(failed) == 0 {
		ran := 0
		for _, item := range Items {
			if r.ItemStatus(item) == Pass {
				ran++
			}
		}
		return fmt.Sprintf("preflight passed (%d items passed, %d skipped)", ran, len(Items)-ran)
	}
	var b strings.Builder
	b.WriteString("preflight failed: ")
	for i, x := range failed {
		part := x.Item + ": " + x.Message()
		if i > 0 {
			part = "; " + part
		}
		more := fmt.Sprintf("; and %d more", len(failed)-i)
		if max > 0 && b.Len()+len(part)+len(more) > max && i > 0 {
			b.WriteString(more)
			break
		}
		b.WriteString(part)
	}
	return b.String()
}

// Merge returns r with the results of a later re-check (RunGPUs) in place
// of r's results for the same item and device; the re-check's node-level
// entries (a disabled item) are not taken, and its finish time becomes
// the merged report's. r and re are not changed.
func (r *Report) Merge(re *Report) *Report {
	type key struct{ item, device string }
	fresh := map[key]bool{}
	for _, x := range re.Results {
		if x.Device != "" {
			fresh[key{x.Item, x.Device}] = true
		}
	}
	out := &Report{Started: r.Started, Finished: re.Finished}
	for _, x := range r.Results {
		if !fresh[key{x.Item, x.Device}] {
			out.Results = append(out.Results, x)
		}
	}
	for _, x := range re.Results {
		if x.Device != "" {
			out.Results = append(out.Results, x)
		}
	}
	out.Results = sortResults(out.Results)
	return out
}

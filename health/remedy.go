package health

import (
	"maps"
	"slices"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// Remedy is what a device's faults ask of the node itself, as the
// remediation acts on it: a GPU reset or a node reboot.
type Remedy struct {
	// Device is the GPU or MIG UUID whose causes ask for it.
	Device string
	// GPU is the GPU the remedy acts on: Device, or a MIG device's parent.
	GPU string
	// Action is ActionResetGPU or ActionReboot (a reboot also resets).
	Action string
	// Reasons are the causes that ask for it.
	Reasons []string
	// Since is when the device last went unhealthy.
	Since time.Time
	// Seen is when a check last reported one of the causes (zero for
	// causes restored from the state file): a fault seen after a GPU
	// reset came back; one seen only before is waiting for the checks.
	Seen time.Time
}

// Remedies lists, sorted by device, every GPU and MIG device whose
// blocking causes (active, or held until a reset) carry the action
// reset-gpu or reboot: the faults that do not clear until the GPU is
// reset or the node rebooted. A device with both asks for a reboot. The
// node's own causes (NVML failing) are no device's and never listed.
func (m *Monitor) Remedies() []Remedy {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Remedy
	for _, id := range slices.Sorted(maps.Keys(m.states)) {
		s := m.states[id]
		if s.healthy || (s.kind != KindGPU && s.kind != KindMIG) {
			continue
		}
		r := Remedy{Device: id, GPU: id, Since: s.since}
		if p, ok := m.parents[id]; ok {
			r.GPU = p
		}
		for _, k := range slices.Sorted(maps.Keys(s.causes)) {
			c := s.causes[k]
			if !c.blocking() || (c.action != ActionResetGPU && c.action != ActionReboot) {
				continue
			}
			if r.Action != ActionReboot {
				r.Action = c.action
			}
			r.Reasons = append(r.Reasons, c.reason)
			if c.seen.After(r.Seen) {
				r.Seen = c.seen
			}
		}
		if r.Action != "" {
			out = append(out, r)
		}
	}
	return out
}

// BootID is the kernel's boot ID under hostRoot (/ when empty), "" when
// it cannot be read.
func BootID(hostRoot string) string { return kernlog.ReadBootID(hostRoot) }

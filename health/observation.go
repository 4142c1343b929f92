package health

import "time"

// NodeID is the DeviceID of observations about the node as a whole (NVML
// itself failing); a fault on it makes every GPU and MIG device unhealthy.
const NodeID = "node"

// Device kinds, as reported in Status and the device_healthy metric.
const (
	KindGPU  = "gpu"
	KindMIG  = "mig"
	KindNode = "node"
	KindNIC  = "nic"
)

// Observation is one finding of a check about one device.
//
// A Fatal observation is a cause that makes the device unhealthy; a Cleared
// observation says that cause (same Check and Key) has gone; an observation
// that is neither is informational and only counted. An Event observation
// is a one-off (an XID, an ECC event): it makes the device unhealthy but its
// cause counts as cleared at once, so recovery starts from that moment and
// restarts with every repeat.
//
// A Fatal observation with HoldUntilReset (a reset- or reboot-class XID,
// the double-bit ECC event, a volatile DBE count that rose) is held: the
// cause stays active, whatever Cleared observations follow, until a Reset
// observation for its GPU, a boot ID change or an operator's
// Monitor.ClearFaults releases it; the recovery period counts from then.
//
// A Reset observation is evidence that GPU DeviceID was reset or its
// driver reloaded (Reason names the evidence, e.g. "volatile ECC counters
// dropped"). It releases every held cause of that GPU and of its MIG
// devices and is otherwise ignored: it is not a fault and creates no
// state. Held causes on NodeID are released only by ClearFaults (or a new
// boot ID).
type Observation struct {
	// DeviceID is a GPU UUID, a MIG UUID, an RDMA device ID or NodeID.
	DeviceID string
	// Kind is the device kind for IDs the node model doesn't know (e.g.
	// KindNIC for RDMA devices); ignored for GPUs and MIG devices.
	Kind string
	// Check names the check (a Check* constant, or the external source).
	Check string
	// Key distinguishes several causes from one check (a link number,
	// "pending" vs "failure"); empty is fine.
	Key     string
	Fatal   bool
	Cleared bool
	Event   bool
	// HoldUntilReset keeps a Fatal observation's cause active until reset
	// evidence or an operator clear (see above).
	HoldUntilReset bool
	// Reset reports reset evidence for GPU DeviceID (see above).
	Reset bool
	// Reason is a short human-readable cause, e.g. "xid 79", or for a
	// Reset observation the evidence.
	Reason string
	// XID is set for XID observations (fatal or counted).
	XID uint64
	// Action says what the cause asks of an operator (an Action*
	// constant, action.go), for a check whose key does not tell (the
	// driver's recovery action); empty: derived from Check, Key and XID.
	Action string
	// At is when what the observation reports was read (a polled check:
	// its sample's time); zero is when it is observed.
	At time.Time
	// Source is where an XID was read: "" for NVML (and every other
	// source of old), SourceKernelLog for the kernel log. The same XID
	// from two sources is counted once (xiddedup.go).
	Source string
}

func (o Observation) causeKey() string {
	if o.Key == "" {
		return o.Check
	}
	return o.Check + "/" + o.Key
}

// Check is one source of observations, switched off by name.
type Check interface {
	Name() string
}

package kernlog

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Kinds of Event.
const (
	// KindXID is an NVRM Xid line.
	KindXID = "xid"
	// KindSXID is an NVSwitch SXid line.
	KindSXID = "sxid"
	// KindFallenOffBus is the driver's "fallen off the bus" message.
	KindFallenOffBus = "fallen-off-the-bus"
)

// NoInstance is GPUInstance and ComputeInstance of an Xid line that names
// no MIG instance (NVML's 0xFFFFFFFF for the same case, nvml.h
// nvmlEventData_t).
const NoInstance = 0xFFFFFFFF

// Event is a GPU fault a kernel log record reports.
type Event struct {
	// Kind is KindXID, KindSXID or KindFallenOffBus.
	Kind string
	// BusID is the PCI address of the GPU (Xid, fallen off the bus) or of
	// the NVSwitch (SXid) as "dddd:bb:dd": domain, bus and device, lower
	// case. An Xid line names no function, so none is kept for any kind.
	BusID string
	// Code is the XID or SXid number.
	Code uint64
	// GPUInstance and ComputeInstance are the MIG instance an Xid line is
	// attributed to, NoInstance when it names none.
	GPUInstance, ComputeInstance uint32
	// Switch is the N of nvidia-nvswitchN (SXid only).
	Switch int
	// Fatal is an SXid's severity: the driver writes "Fatal" or
	// "Non-fatal" after the number.
	Fatal bool
	// Text is what the driver says after the number (Xid, SXid), or the
	// whole message.
	Text string
}

// The formats, as the drivers write them:
//
//   - Xid, from NVIDIA's open-gpu-kernel-modules
//     src/nvidia/src/kernel/gpu/rc/kernel_rc.c (krcReportXid), three forms:
//     "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s",
//     "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, %s" and
//     "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s".
//     Older drivers leave pid and name out ("NVRM: Xid (PCI:0000:3b:00): 79,
//     GPU has fallen off the bus."), so the parser takes the number and the
//     rest as text, whatever comes between.
//   - SXid, from the NVSwitch driver (open-gpu-kernel-modules
//     src/common/nvswitch, NVSWITCH_PRINT_SXID): "nvidia-%s: SXid
//     (PCI:%04x:%02x:%02x.%x): %05d, " then "Fatal, Link %02d ..." or
//     "Non-fatal, Link %02d ..." for the reported errors, or other data
//     lines ("Severity 1 Engine instance 00 ...", "SOE HALTED") that carry
//     no severity; those count as not fatal.
//   - Fallen off the bus, from open-gpu-kernel-modules
//     kernel-open/nvidia (RmInitAdapter's check of PMC_BOOT_0): one printk
//     "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\nNVRM: (PCI ID: %04x:%04x)
//     installed in this system has\nNVRM: fallen off the bus and is not
//     responding to commands.\n", one kernel record with embedded newlines
//     (NVSentinel's syslog-health-monitor, pkg/gpufallen, matches it as
//     one journal entry). A log that split it into records is handled
//     too: Parser remembers the GPU of the first line.
var (
	xidPattern = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): (\d+)(?:, (.*))?`)
	})
	sxidPattern = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): (\d+)(?:, (.*))?`)
	})
	fallenGPUPattern = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`NVRM: The NVIDIA GPU ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?`)
	})
)

// fallenText is the part of the fallen-off-the-bus message that says so.
const fallenText = "fallen off the bus and is not responding to commands"

// Parser turns record messages into events. It keeps the GPU named by a
// "The NVIDIA GPU" line for a fallen-off-the-bus message split over
// records; use one Parser per log.
type Parser struct {
	pendingFallen string
}

// Parse returns the event msg reports, if any.
func (p *Parser) Parse(msg string) (Event, bool) {
	if !strings.Contains(msg, "NVRM:") && !strings.Contains(msg, "SXid") {
		return Event{}, false
	}
	if m := xidPattern().FindStringSubmatch(msg); m != nil {
		code, err := strconv.ParseUint(m[4], 10, 64)
		if err != nil || code == 0 {
			return Event{}, false
		}
		e := Event{Kind: KindXID, BusID: strings.ToLower(m[1]), Code: code,
			GPUInstance: NoInstance, ComputeInstance: NoInstance, Text: strings.TrimSpace(m[5])}
		if m[2] != "" {
			e.GPUInstance = parseInstance(m[2])
		}
		if m[3] != "" {
			e.ComputeInstance = parseInstance(m[3])
		}
		return e, true
	}
	if m := sxidPattern().FindStringSubmatch(msg); m != nil {
		code, err := strconv.ParseUint(m[3], 10, 64)
		if err != nil || code == 0 {
			return Event{}, false
		}
		sw, _ := strconv.Atoi(m[1])
		text := strings.TrimSpace(m[4])
		return Event{Kind: KindSXID, BusID: strings.ToLower(m[2]), Code: code, Switch: sw,
			Fatal: strings.HasPrefix(text, "Fatal,") || text == "Fatal", Text: text}, true
	}
	if m := fallenGPUPattern().FindStringSubmatch(msg); m != nil {
		bus := strings.ToLower(m[1])
		if strings.Contains(msg, fallenText) {
			p.pendingFallen = ""
			return Event{Kind: KindFallenOffBus, BusID: bus, Text: msg}, true
		}
		p.pendingFallen = bus
		return Event{}, false
	}
	if p.pendingFallen != "" && strings.Contains(msg, fallenText) {
		bus := p.pendingFallen
		p.pendingFallen = ""
		return Event{Kind: KindFallenOffBus, BusID: bus, Text: msg}, true
	}
	return Event{}, false
}

func parseInstance(s string) uint32 {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return NoInstance
	}
	return uint32(v)
}

// BusIDOf is the "dddd:bb:dd" form of a PCI address as NVML or sysfs
// spell it ("00000000:3B:00.0", "0000:3b:00.0"), to compare with
// Event.BusID; "" if s does not parse.
func BusIDOf(s string) string {
	var dom, bus, dev uint64
	if _, err := fmt.Sscanf(strings.ToLower(strings.TrimSpace(s)), "%x:%x:%x", &dom, &bus, &dev); err != nil {
		return ""
	}
	return fmt.Sprintf("%04x:%02x:%02x", dom&0xffff, bus, dev)
}

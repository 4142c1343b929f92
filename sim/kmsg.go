package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// The simulated kernel log: <host-root>/dev/kmsg, a regular file of
// records in /dev/kmsg's format (kernlog.FormatKmsg), to which the
// simulator appends what the NVIDIA drivers write when it injects an XID,
// a GPU falling off the bus or an NVSwitch SXid. The agent's kernel-log
// check reads it as it reads the real device, so tests and the demo go
// through the same parser and cursor.

// kmsgLog appends records to the simulated /dev/kmsg.
type kmsgLog struct {
	mu   sync.Mutex
	path string
	seq  uint64
}

// kmsgPriority is the prio field of the driver's records: facility kern
// (0), level KERN_WARNING (4), the level NVRM's error prints are logged at
// (the record's level does not change what the agent makes of it).
const kmsgPriority = 4

// installKmsg creates <host-root>/dev/kmsg, or continues the one a
// simulator on the same host root left (its sequence numbers go on, as a
// real kernel's do within a boot).
func (n *Node) installKmsg() error {
	path := filepath.Join(n.hostRoot, "dev", "kmsg")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	k := &kmsgLog{path: path}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			if rec, err := kernlog.ParseKmsg(sc.Bytes()); err == nil {
				k.seq = max(k.seq, rec.Seq)
			}
		}
		f.Close()
	}
	n.kmsg = k
	return nil
}

// write appends one record per message, each in one write(2) on an
// O_APPEND file, so a reader never sees half a record it would keep.
func (k *kmsgLog) write(msgs ...string) error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	f, err := os.OpenFile(k.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, m := range msgs {
		k.seq++
		// Time stamped as printk does: time since boot (CLOCK_MONOTONIC,
		// which the simulated node shares with its host).
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return err
		}
		usec := uint64(ts.Nano() / 1000)
		if _, err := f.WriteString(kernlog.FormatKmsg(kmsgPriority, k.seq, usec, m)); err != nil {
			return err
		}
	}
	return nil
}

// xidTexts are the messages the driver prints after a few XIDs' numbers,
// from NVIDIA's XID catalog descriptions
// (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html); other
// XIDs get the catalog-less "Unspecified error".
var xidTexts = map[uint64]string{
	13:  "Graphics Exception",
	31:  "MMU Fault",
	43:  "Ch 00000010, intr 00000000",
	48:  "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
	74:  "NVLink: fatal error detected on link 0",
	79:  "GPU has fallen off the bus.",
	94:  "Contained ECC error.",
	95:  "Uncontained ECC error.",
	119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
}

// xidLine is the driver's Xid line (NVIDIA open-gpu-kernel-modules,
// src/nvidia/src/kernel/gpu/rc/kernel_rc.c): the GPU's domain:bus:device,
// the MIG instances the XID is attributed to, the number, the process
// (unknown for an XID no channel raised) and the message.
func xidLine(busID string, xid uint64, gi, ci uint32) string {
	inst := ""
	if gi != noInstance {
		inst = fmt.Sprintf(" GPU-I:%02d", gi)
		if ci != noInstance {
			inst += fmt.Sprintf(" GPU-CI:%02d", ci)
		}
	}
	text, ok := xidTexts[xid]
	if !ok {
		text = "Unspecified error"
	}
	return fmt.Sprintf("NVRM: Xid (PCI:%s%s): %d, pid='<unknown>', name=<unknown>, %s", kernlog.BusIDOf(busID), inst, xid, text)
}

// fallenOffBusMessage is the driver's message for a GPU whose registers
// read all ones (open-gpu-kernel-modules RmInitAdapter): one printk with
// embedded newlines, one kernel record. 10de:2330 is the H100 SXM5's PCI
// device ID (pci.ids).
func fallenOffBusMessage(busID string) string {
	return fmt.Sprintf("NVRM: The NVIDIA GPU %s\nNVRM: (PCI ID: 10de:2330) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.", busID)
}

// sxidSwitchBus is the PCI address the simulator gives NVSwitch 0 (the
// profiles model no switch devices).
const sxidSwitchBus = "0000:05:00.0"

// sxidLine is the NVSwitch driver's SXid line
// (open-gpu-kernel-modules src/common/nvswitch, NVSWITCH_PRINT_SXID:
// "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, " then the severity and
// link of a reported error). The texts are errors NVIDIA's NVSentinel
// tests quote (pkg/sxid/sxid_handler_test.go).
func sxidLine(sxid uint64, link int, fatal bool) string {
	if fatal {
		return fmt.Sprintf("nvidia-nvswitch0: SXid (PCI:%s): %05d, Fatal, Link %02d sourcetrack timeout error (First)", sxidSwitchBus, sxid, link)
	}
	return fmt.Sprintf("nvidia-nvswitch0: SXid (PCI:%s): %05d, Non-fatal, Link %02d RX Short Error Rate", sxidSwitchBus, sxid, link)
}

// logKmsg appends msgs to the simulated kernel log; a failure is logged,
// not returned: the NVML side of the fault has happened.
func (n *Node) logKmsg(msgs ...string) {
	if err := n.kmsg.write(msgs...); err != nil {
		n.log.Warn("simulated kernel log not written", "error", err)
	}
}

// injectSXID writes an SXid on NVSwitch 0: fault f's XID is the SXid
// number, Link its port, NonFatal its severity. Only a node whose GPUs
// sit on an NVSwitch fabric has one, and not a node of a multi-node NVLink
// domain: its NVSwitches are in the rack's switch trays, whose own kernel
// logs their SXids.
func (n *Node) injectSXID(f Fault) error {
	if f.XID == 0 {
		return fmt.Errorf("xid: required for fault kind %q (the SXid number)", f.Kind)
	}
	if len(n.gpus) == 0 || !n.onFabric(0) {
		return fmt.Errorf("kind: fault %q: this node has no NVSwitch (its GPUs are not on an NVSwitch fabric)", f.Kind)
	}
	if n.multiNodeNVLink() {
		return fmt.Errorf("kind: fault %q: this node's NVSwitches are off the node (a multi-node NVLink domain's switch trays log their SXids)", f.Kind)
	}
	n.logKmsg(sxidLine(f.XID, f.Link, !f.NonFatal))
	return nil
}

package remediate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/atomicfile"
)

// sentinelMarker starts the first line of a sentinel the agent wrote, so
// that it never removes one the OS or another tool wrote.
const sentinelMarker = "# written by gpu-node-agent"

// sentinel is a reboot request: the file kured checks for (its
// --reboot-sentinel, default /var/run/reboot-required: kured reboots the
// node once the file exists, os.Stat in its pkg/checkers/checker.go, and
// never removes it), written with the boot it was made in.
type sentinel struct {
	bootID  string
	reasons string
	// written says the file stands for this boot's request.
	written bool
}

// sentinelFile is the sentinel's path here: the configured host path
// under the host root.
func (r *Remediator) sentinelFile() string {
	return filepath.Join(r.opts.HostRoot, r.cfg.Reboot.SentinelPath)
}

// readSentinel reads the sentinel: nil when absent or not ours.
func (r *Remediator) readSentinel() (*sentinel, error) {
	b, err := os.ReadFile(r.sentinelFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(b, []byte(sentinelMarker)) {
		return nil, nil
	}
	s := &sentinel{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "boot_id="); ok {
			s.bootID = v
		}
		if v, ok := strings.CutPrefix(sc.Text(), "reason="); ok {
			s.reasons = v
		}
	}
	return s, nil
}

// restore picks up a reboot request made before the agent restarted: one
// made in this boot stands; one from an earlier boot was answered (the
// reboot happened; /var/run is a tmpfs on most hosts, but not all), so
// it is removed and the condition set False.
func (r *Remediator) restore() {
	s, err := r.readSentinel()
	if err != nil {
		r.log.Error("reboot sentinel unreadable", "path", r.sentinelFile(), "err", err)
		return
	}
	if s == nil {
		// No request stands; one made before a reboot may still show in
		// the condition (/var/run is a tmpfs on most hosts, so the file
		// went with the boot): settle sets it False, where it exists.
		r.reboot = &sentinel{}
		return
	}
	if boot := health.BootID(r.opts.HostRoot); boot != "" && s.bootID != boot {
		if err := os.Remove(r.sentinelFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Error("reboot sentinel of an earlier boot not removed", "path", r.sentinelFile(), "err", err)
			r.reboot = s
			return
		}
		r.log.Info("the node rebooted since the agent asked for it; reboot sentinel removed", "path", r.sentinelFile())
		r.opts.Cluster.Event(corev1.EventTypeNormal, "RebootCompleted", "the node rebooted as requested ("+s.reasons+"); sentinel "+r.cfg.Reboot.SentinelPath+" removed")
		r.reboot = &sentinel{} // the condition is set False by settle
		return
	}
	s.written = true
	r.reboot = s
}

// requestReboot asks for a reboot for reasons; it reports whether one is
// requested (now or before).
func (r *Remediator) requestReboot(ctx context.Context, reasons []string) bool {
	why := strings.Join(reasons, "; ")
	if !r.cfg.Reboot.Enabled {
		r.note(ctx, "reboot", "", "", corev1.EventTypeWarning, "GPURebootNeeded",
			"the node needs a reboot ("+why+"); remediation.reboot is not enabled: reboot it")
		return false
	}
	if r.reboot != nil && r.reboot.written {
		// Requested: keep the slot's claim and the condition current.
		if !r.slot(ctx, "reboot", ActionReboot, "reboot request kept") {
			return true
		}
		if err := r.setCondition(ctx, true, why); err != nil {
			r.log.Warn("reboot condition not set yet", "err", err)
		}
		return true
	}
	msg := fmt.Sprintf("writing %s (kured's sentinel) and setting Node condition %s=True", r.cfg.Reboot.SentinelPath, r.cfg.Reboot.ConditionType)
	if r.cfg.Reboot.DryRun {
		r.note(ctx, "reboot", ActionReboot, ResultDryRun, corev1.EventTypeNormal, "RebootRequested", "dry run: would ask for a reboot for "+why+": "+msg)
		return true
	}
	if !r.slot(ctx, "reboot", ActionReboot, "no reboot requested") {
		return true
	}
	boot := health.BootID(r.opts.HostRoot)
	content := fmt.Sprintf("%s: the node's GPUs need a reboot\nboot_id=%s\nreason=%s\n", sentinelMarker, boot, why)
	if err := atomicfile.Write(r.sentinelFile(), []byte(content)); err != nil {
		r.note(ctx, "reboot", ActionReboot, ResultFailed, corev1.EventTypeWarning, "RebootRequestFailed",
			fmt.Sprintf("the node needs a reboot (%s) but %s could not be written: %v", why, r.cfg.Reboot.SentinelPath, err))
		return true
	}
	r.reboot = &sentinel{bootID: boot, reasons: why, written: true}
	if err := r.setCondition(ctx, true, why); err != nil {
		r.log.Warn("reboot condition not set yet; retrying", "err", err)
	}
	delete(r.notes, "reboot")
	r.count(ActionReboot, ResultSuccess)
	r.opts.Cluster.Event(corev1.EventTypeWarning, "RebootRequested", "the node needs a reboot ("+why+"): "+msg+"; kured (or a NodeHealthCheck) drains and reboots it")
	r.log.Warn("reboot requested", "sentinel", r.sentinelFile(), "reasons", why)
	return true
}

// withdrawReboot removes our sentinel and sets the condition False.
func (r *Remediator) withdrawReboot(ctx context.Context, why string) error {
	s, err := r.readSentinel()
	if err != nil {
		return err
	}
	if s != nil {
		if err := os.Remove(r.sentinelFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove reboot sentinel: %w", err)
		}
		r.opts.Cluster.Event(corev1.EventTypeNormal, "RebootRequestWithdrawn", why+": "+r.cfg.Reboot.SentinelPath+" removed")
	}
	if err := r.setCondition(ctx, false, why); err != nil {
		return err
	}
	r.reboot = nil
	return nil
}

func (r *Remediator) setCondition(ctx context.Context, required bool, why string) error {
	if required {
		return r.opts.Cluster.SetCondition(ctx, r.cfg.Reboot.ConditionType, true, "GPUFault", "the node's GPUs need a reboot: "+why)
	}
	return r.opts.Cluster.SetCondition(ctx, r.cfg.Reboot.ConditionType, false, "NoRebootNeeded", why)
}

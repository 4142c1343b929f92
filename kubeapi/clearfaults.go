package kubeapi

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ClearFaultsAnnotation is the Node annotation an operator sets to clear
// held faults after fixing a GPU: a GPU or MIG UUID, or "all". The tainter
// sees it through the node informer (an update of the Node wakes it), acts
// on it once (health.Monitor.ClearFaults), removes it and posts an Event.
const ClearFaultsAnnotation = "gpu-node-agent.io/clear-faults"

// FaultClearer clears held faults on an operator's request
// (*health.Monitor).
type FaultClearer interface {
	ClearFaults(target string) (cleared []string, err error)
}

// clearFaults acts on the clear-faults annotation of node, if any: the
// faults are cleared once, then the annotation is removed with a JSON
// patch that first tests it still holds the value acted on, so a newer
// request written meanwhile is neither lost nor removed unseen (the patch
// fails, and the next reconcile acts on the new value). The result is
// posted as an Event. It returns the patched Node, nil when nothing was
// written. In dry-run mode nothing is cleared or written.
func (t *Tainter) clearFaults(ctx context.Context, node *corev1.Node) (*corev1.Node, error) {
	target, ok := node.Annotations[ClearFaultsAnnotation]
	if !ok || t.clearer == nil {
		return nil, nil
	}
	if t.w.dryRun("clear-faults", target) {
		return nil, nil
	}
	cleared, cerr := t.clearer.ClearFaults(target)
	patched, err := t.w.removeAnnotation(ctx, ClearFaultsAnnotation, target)
	if err != nil {
		// The cache may be behind the Node: read it afresh next time.
		// Cleared already; clearing again on the retry is harmless
		// (ClearFaults is idempotent).
		t.reader.conflicted(ctx, node.ResourceVersion)
		return nil, err
	}
	if cerr != nil {
		t.log.Warn("clear-faults request rejected", "node", t.node, "target", target, "err", cerr)
		t.w.event(ctx, patched, corev1.EventTypeWarning, "ClearFaultsRejected", cerr.Error())
		return patched, nil
	}
	msg := "operator cleared faults of " + target + ": "
	if len(cleared) == 0 {
		msg += "no held or recovering fault to clear"
	} else {
		msg += strings.Join(cleared, ", ")
	}
	t.log.Info("clear-faults request done", "node", t.node, "target", target, "cleared", cleared)
	t.w.event(ctx, patched, corev1.EventTypeNormal, "FaultsCleared", msg)
	return patched, nil
}

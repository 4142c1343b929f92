package safeguard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
)

// HolderLabel is the label every slot Lease carries beside SlotLabel: its
// holder's HolderValue, so that a node that does not know whether it
// holds a slot (after a restart) finds its own Leases with a LIST that
// reads only them. It is a lookup aid only: spec.holderIdentity says who
// holds a slot, and a Lease labelled with a node's value but held by
// another is not that node's.
const HolderLabel = "gpu-node-agent.io/taint-slot-holder"

// HolderValue is node's HolderLabel value: the node name itself when it
// is a valid label value (a node name, a DNS subdomain, is one when it
// has at most 63 characters), else "sha256-" and the first 40 hex digits
// of the SHA-256 of the name (47 characters). Two names sharing a value
// only make each read the other's Lease too.
func HolderValue(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "sha256-" + hex.EncodeToString(sum[:20])
}

// findOwn returns the slot Leases this node holds, sorted by index, for a
// node that does not know whether it holds one. Instead of listing all K
// slots (about 1 MB at K = 1,500, on every restart of every agent) it
// makes two LISTs that read only Leases that may be its own:
//
//   - SlotLabel=<prefix>,HolderLabel=<its HolderValue>: the Leases it
//     wrote (every Create, takeover and renew sets the label);
//   - SlotLabel=<prefix>,!HolderLabel: Leases written by an agent of an
//     older version, which set no holder label; during a rollout this
//     node's own Lease may be one of them. Once every agent is new (and
//     has renewed, released or lost its older Leases) this reads nothing.
//
// The two are disjoint. Of what they read, spec.holderIdentity says
// which Leases are ours: the label only narrows the read, and a Lease
// carrying our value but held by another node (a hash collision, or a
// takeover by an older agent, which keeps the labels it found) is not
// ours. The one Lease of ours it cannot find is one this node took over
// while it ran an older version from a node that had labelled it: that
// Lease carries the other node's value until renewed. This node then
// acts as holding nothing (a bucket it reads that shows the Lease gives
// it back, see adopt); it may take a second slot meanwhile, and the
// first stays occupied while its Node is tainted and is free after: a
// slot spent for nothing, never one past K.
func (s *Slots) findOwn(ctx context.Context) ([]*coordinationv1.Lease, error) {
	slot, err := labels.NewRequirement(SlotLabel, selection.Equals, []string{s.cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("taint slot prefix %q as a label value: %w", s.cfg.Prefix, err)
	}
	ours, err := labels.NewRequirement(HolderLabel, selection.Equals, []string{s.holder})
	if err != nil {
		return nil, fmt.Errorf("taint slot holder %q as a label value: %w", s.holder, err)
	}
	unlabelled, err := labels.NewRequirement(HolderLabel, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("taint slot holder label: %w", err)
	}
	var own []*coordinationv1.Lease
	for _, sel := range []labels.Selector{labels.NewSelector().Add(*slot, *ours), labels.NewSelector().Add(*slot, *unlabelled)} {
		list, err := s.client.CoordinationV1().Leases(s.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return nil, fmt.Errorf("list own taint slot leases %s in %s: %w", sel, s.cfg.Namespace, err)
		}
		for i := range list.Items {
			l := &list.Items[i]
			if slotIndex(s.cfg.Prefix, l.Name) >= 0 && leaseHolder(l) == s.node {
				own = append(own, l)
			}
		}
	}
	slices.SortFunc(own, func(a, b *coordinationv1.Lease) int {
		return slotIndex(s.cfg.Prefix, a.Name) - slotIndex(s.cfg.Prefix, b.Name)
	})
	return own, nil
}

// adopt makes the first of mine, Leases of ours that this node did not
// know it held (a bucket it read showed them, or findOwn found them),
// the one it holds, renewing it, and releases the others: one slot covers
// the node's taint, and more than one can only follow a write whose
// answer was lost. held is false when that Lease was taken over or
// deleted before the renew; on another error the node still holds it
// (its next Acquire renews it).
func (s *Slots) adopt(ctx context.Context, mine []*coordinationv1.Lease) (held bool, err error) {
	s.held = mine[0]
	for _, l := range mine[1:] {
		if err := s.deleteOurs(ctx, l); err != nil {
			s.log.Warn("releasing an extra taint slot failed", "node", s.node, "lease", l.Name, "err", err)
		}
	}
	err = s.renewLocked(ctx, mine[0])
	if errors.Is(err, ErrNotHeld) {
		return false, nil
	}
	return err == nil, err
}

package kubeapi

import "context"

// Safeguard is the fleet safeguard the Tainter asks before adding its
// taint, so that a correlated failure cannot cordon too much of the fleet.
// The Tainter's is Slots, which holds under any concurrency; tests may
// replace it (SetSafeguard).
type Safeguard interface {
	// Allow says whether this node may add the taint now. The tainter
	// calls it only when the node is unfit and does not carry the taint
	// yet, at most once per reconcile; refused, it asks again on the next
	// reconcile (health change, Node change, resync or retry).
	Allow(ctx context.Context) (bool, error)
	// Release says this node no longer carries the taint: after the
	// tainter removed it, and once at start if the node is fit and
	// untainted (what a previous run may have held). An error is retried
	// like any failed reconcile.
	Release(ctx context.Context) error
}

// RoomSignaller is a Safeguard that says when asking again may succeed
// after a refusal, so that a refused node takes a freed slot at once
// rather than on its next resync. safeguard.Slots, Shared and User are
// (Room: a slot of the bucket the refused node follows was freed); the
// Tainter reconciles on the signal.
type RoomSignaller interface {
	Room() <-chan struct{}
}

package safeguard

import (
	"context"
	"sync"
	"time"
)

// Shared is this node's one slot held for more than one reason (the
// taint while the node is unfit, remediation while a step takes capacity
// away), so that tainted and remediating nodes count against the same K
// through the same Leases. The Lease is given back only when no user
// holds it.
type Shared struct {
	slots *Slots
	// mu is held across the Slots calls too, so that one user's release
	// never deletes the Lease another user's acquire has just renewed or
	// taken (and not yet recorded in users).
	mu sync.Mutex
	// users are the users holding the slot, by when each last wrote its
	// Lease (acquired or renewed it).
	users map[string]time.Time
}

// NewShared shares s among users.
func NewShared(s *Slots) *Shared { return &Shared{slots: s, users: map[string]time.Time{}} }

// Acquire takes or renews the slot for user. A user that renewed it less
// than a third of the Lease duration ago holds it without a request: a
// step asked again every retry interval (a standing reboot request) costs
// the API server one LIST and one PUT per third of the Lease, not per
// retry.
func (s *Shared) Acquire(ctx context.Context, user string) (Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.users[user]; ok && s.slots.now().Sub(at) < s.slots.cfg.LeaseDuration/3 {
		return Decision{Held: true, Slot: -1}, nil
	}
	d, err := s.slots.Acquire(ctx)
	if err == nil && d.Held {
		s.users[user] = s.slots.now()
	}
	return d, err
}

// Release drops user's hold; the last user's release gives the slot back
// (Slots.Release).
func (s *Shared) Release(ctx context.Context, user string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.users, user)
	if len(s.users) > 0 {
		return nil
	}
	return s.slots.Release(ctx)
}

// Room is the slot's Room signal (Slots.Room).
func (s *Shared) Room() <-chan struct{} { return s.slots.Room() }

// User is one user's view of the shared slot, in the form the tainter
// asks its safeguard: Allow before adding the taint, Release after
// removing it.
func (s *Shared) User(name string) User { return User{s: s, name: name} }

// User is a Shared slot as one user holds it.
type User struct {
	s    *Shared
	name string
}

// Allow says whether the user holds the slot now (Shared.Acquire).
func (u User) Allow(ctx context.Context) (bool, error) {
	d, err := u.s.Acquire(ctx, u.name)
	return d.Held, err
}

// Release drops the user's hold (Shared.Release).
func (u User) Release(ctx context.Context) error { return u.s.Release(ctx, u.name) }

// Room is the slot's Room signal (Slots.Room).
func (u User) Room() <-chan struct{} { return u.s.Room() }

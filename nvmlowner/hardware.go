package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// ErrUnavailable is returned by Hardware.Discover while NVML cannot be
// initialised.
var ErrUnavailable = errors.New("nvml unavailable")

// Hardware is the NVML library's lifetime for the agent: Init (retried on
// every discovery until it succeeds, so a driver that loads after the agent
// is picked up by a rescan), discovery through one Discoverer, and the one
// Shutdown that balances a successful Init. It is safe for concurrent use.
type Hardware struct {
	owner    *Owner
	hostRoot string
	log      *slog.Logger

	mu sync.Mutex
	// ready says Init succeeded.
	ready bool
	// warned keeps a failing NVML to one error line, not one per rescan.
	warned bool
	// disc discovers through owner; created once NVML is initialised.
	disc *Discoverer
	// opts are disc's options (SetDiscoverOptions).
	opts DiscoverOptions
	// last is the last discovered node (nil until one succeeds, and after
	// a failed discovery): the links of the next discovery start from it,
	// and the gpu-missing check compares with it.
	last *topology.Node
	// closed says Close ran: no Init after it.
	closed bool
}

// NewHardware returns the hardware behind owner (over nvml.New() in
// production) with the host's / at hostRoot, and tries Init once. A
// library that fails to load is not an error here: it is logged once and
// every Discover retries it.
func NewHardware(owner *Owner, hostRoot string, log *slog.Logger) *Hardware {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hardware{owner: owner, hostRoot: hostRoot, log: log}
	_ = h.Init()
	return h
}

// Owner is the NVML owner every other NVML consumer (sampler, event set)
// calls through.
func (h *Hardware) Owner() *Owner { return h.owner }

// HostRoot is where the host's / is mounted.
func (h *Hardware) HostRoot() string { return h.hostRoot }

// Init initialises NVML unless it already is, bounded by the call timeout,
// and returns that attempt's error. The first failure is logged at error
// level, later ones at debug.
func (h *Hardware) Init() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.initLocked()
}

func (h *Hardware) initLocked() error {
	if h.ready {
		return nil
	}
	if h.closed {
		return fmt.Errorf("nvml init: %w", errClosed)
	}
	if err := h.owner.Init(context.Background()); err != nil {
		// Not a silent empty node: this is an error and no GPU is served.
		if !h.warned {
			h.log.Error("NVML unavailable: serving no GPU resources until it loads", "err", err)
			h.warned = true
		} else {
			h.log.Debug("NVML still unavailable", "err", err)
		}
		return err
	}
	h.ready = true
	h.log.Info("NVML initialised")
	return nil
}

var errClosed = errors.New("hardware closed")

// Discover reads the node's current topology through the owner: every call
// bounded by the call timeout (a hung GPU comes back Lost, "nvml-timeout:
// <call>"), the links reused from the last discovery while the GPU set is
// unchanged. While NVML cannot be initialised it returns ErrUnavailable.
func (h *Hardware) Discover() (*topology.Node, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.initLocked() != nil {
		h.last = nil
		return nil, ErrUnavailable
	}
	if h.disc == nil {
		h.disc = NewDiscoverer(h.owner, h.hostRoot, h.log.With("component", "discovery"))
		h.disc.SetOptions(h.opts)
	}
	n, err := h.disc.Discover(context.Background(), h.last)
	if err != nil {
		h.last = nil
		return nil, fmt.Errorf("discover: %w", err)
	}
	h.last = n
	return n, nil
}

// SetDiscoverOptions sets what the next discoveries read beyond the
// default (MIG profiles for a DRA driver that makes MIG devices on
// demand). The agent finds it by interface assertion.
func (h *Hardware) SetDiscoverOptions(opts DiscoverOptions) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.opts = opts
	if h.disc != nil {
		h.disc.SetOptions(opts)
	}
}

// LastNode is the last discovered node, nil if the last discovery failed.
func (h *Hardware) LastNode() *topology.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Close balances a successful Init with Shutdown (bounded: a hung driver
// does not hold up the agent's exit). Later calls do nothing.
func (h *Hardware) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	if !h.ready {
		return
	}
	h.ready = false
	if err := h.owner.Shutdown(context.Background()); err != nil {
		h.log.Warn("NVML shutdown failed", "err", err)
	}
}

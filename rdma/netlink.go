package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrLinkNotFound is returned by Links.Link when the interface is not in
// the handle's network namespace (e.g. a simulated netdev).
var ErrLinkNotFound = errors.New("link not found")

// LinkInfo is the netlink view of one interface.
type LinkInfo struct {
	Name      string
	OperState string // netlink.LinkOperState.String(): "up", "down"...
	AdminUp   bool
	MTU       int
}

// Links is the netlink surface rdma needs. Netlink implements it on a
// handle bound to one network namespace, so tests can pass a namespace
// they created.
type Links interface {
	// NetnsMode is the RDMA subsystem netns mode: "shared" or "exclusive".
	NetnsMode() (string, error)
	// Link returns the state of one interface, or ErrLinkNotFound.
	Link(name string) (LinkInfo, error)
	// Subscribe sends every link change to events until ctx is done or
	// the subscription fails; it returns once subscribed.
	Subscribe(ctx context.Context, events chan<- LinkInfo, onError func(error)) error
}

// Netlink implements Links with github.com/vishvananda/netlink.
type Netlink struct {
	ns     netns.NsHandle
	handle *netlink.Handle

	mu   sync.Mutex
	rdma *netlink.Handle // opened on first use: kernels without RDMA refuse it
}

// NewNetlink opens a netlink handle in ns; pass netns.None() for the
// agent's own namespace. Close it when done.
func NewNetlink(ns netns.NsHandle) (*Netlink, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink route handle: %w", err)
	}
	return &Netlink{ns: ns, handle: h}, nil
}

// Close releases the netlink sockets.
func (n *Netlink) Close() {
	n.handle.Close()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rdma != nil {
		n.rdma.Close()
	}
}

// NetnsMode implements Links.
func (n *Netlink) NetnsMode() (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rdma == nil {
		h, err := netlink.NewHandleAt(n.ns, unix.NETLINK_RDMA)
		if err != nil {
			return "", fmt.Errorf("open netlink rdma handle: %w", err)
		}
		n.rdma = h
	}
	mode, err := n.rdma.RdmaSystemGetNetnsMode()
	if err != nil {
		return "", fmt.Errorf("read rdma netns mode: %w", err)
	}
	return mode, nil
}

// Link implements Links.
func (n *Netlink) Link(name string) (LinkInfo, error) {
	l, err := n.handle.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return LinkInfo{}, fmt.Errorf("link %s: %w", name, ErrLinkNotFound)
		}
		return LinkInfo{}, fmt.Errorf("link %s: %w", name, err)
	}
	return linkInfo(l.Attrs()), nil
}

// resubscribeDelay is the pause before resubscribing after the netlink
// socket failed (e.g. ENOBUFS when events overflowed it).
const resubscribeDelay = time.Second

// Subscribe implements Links. If the subscription fails later, onError is
// told and it resubscribes after a second; errors from the socket being
// closed on shutdown are not reported.
func (n *Netlink) Subscribe(ctx context.Context, events chan<- LinkInfo, onError func(error)) error {
	report := func(err error) {
		if ctx.Err() == nil && onError != nil {
			onError(err)
		}
	}
	updates, done, err := n.subscribe(report)
	if err != nil {
		return fmt.Errorf("subscribe to link events: %w", err)
	}
	go func() {
		for {
			n.forward(ctx, updates, events)
			close(done)
			for range updates {
				// Drain until the library closes the channel, so its
				// receive goroutine never blocks on a send and leaks.
			}
			if ctx.Err() != nil {
				return
			}
			report(errors.New("link event subscription closed, resubscribing"))
			select {
			case <-ctx.Done():
				return
			case <-time.After(resubscribeDelay):
			}
			updates, done, err = n.subscribe(report)
			if err != nil {
				report(fmt.Errorf("resubscribe to link events: %w", err))
				updates, done = make(chan netlink.LinkUpdate), make(chan struct{})
				close(updates)
			}
		}
	}()
	return nil
}

func (n *Netlink) subscribe(onError func(error)) (chan netlink.LinkUpdate, chan struct{}, error) {
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	ns := n.ns
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		Namespace:     &ns,
		ErrorCallback: onError,
	})
	if err != nil {
		close(done)
		return nil, nil, err
	}
	return updates, done, nil
}

// forward converts updates to LinkInfo until ctx is done or the library
// closes updates (socket failure).
func (n *Netlink) forward(ctx context.Context, updates <-chan netlink.LinkUpdate, events chan<- LinkInfo) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-updates:
			if !ok {
				return
			}
			if u.Link == nil || u.Attrs() == nil {
				continue
			}
			info := linkInfo(u.Attrs())
			if u.Header.Type == unix.RTM_DELLINK {
				info.OperState = "not-present"
				info.AdminUp = false
			}
			select {
			case events <- info:
			case <-ctx.Done():
				return
			}
		}
	}
}

func linkInfo(a *netlink.LinkAttrs) LinkInfo {
	return LinkInfo{
		Name:      a.Name,
		OperState: a.OperState.String(),
		AdminUp:   a.Flags&net.FlagUp != 0,
		MTU:       a.MTU,
	}
}

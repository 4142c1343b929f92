// Package conntrack keeps the dialer API of github.com/mwitkow/go-conntrack
// that github.com/prometheus/common/config calls, without its connection
// metrics and without golang.org/x/net/trace. See README.md.
package conntrack

import (
	"context"
	"net"
)

type dialerContextFunc func(context.Context, string, string) (net.Conn, error)

type dialerOpts struct {
	name   string
	parent dialerContextFunc
}

type dialerOpt func(*dialerOpts)

// DialWithName names the dialer. The name is kept for the caller's
// context only: there are no per-name metrics.
func DialWithName(name string) dialerOpt {
	return func(o *dialerOpts) { o.name = name }
}

// DialWithTracing is accepted and has no effect: there is no tracing.
func DialWithTracing() dialerOpt {
	return func(*dialerOpts) {}
}

// DialWithDialer dials through parent.
func DialWithDialer(parent *net.Dialer) dialerOpt {
	return DialWithDialContextFunc(parent.DialContext)
}

// DialWithDialContextFunc dials through f.
func DialWithDialContextFunc(f func(context.Context, string, string) (net.Conn, error)) dialerOpt {
	return func(o *dialerOpts) { o.parent = f }
}

type nameKey struct{}

// DialNameToContext returns ctx carrying the dialer name.
func DialNameToContext(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, nameKey{}, name)
}

// DialNameFromContext returns the dialer name ctx carries, or "".
func DialNameFromContext(ctx context.Context) string {
	name, _ := ctx.Value(nameKey{}).(string)
	return name
}

// NewDialContextFunc returns a dial function that dials through the
// parent dialer (a zero net.Dialer unless an option sets one), with the
// dialer's name in the context it passes on.
func NewDialContextFunc(opts ...dialerOpt) func(ctx context.Context, network, addr string) (net.Conn, error) {
	o := dialerOpts{name: "default", parent: (&net.Dialer{}).DialContext}
	for _, opt := range opts {
		opt(&o)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return o.parent(DialNameToContext(ctx, o.name), network, addr)
	}
}

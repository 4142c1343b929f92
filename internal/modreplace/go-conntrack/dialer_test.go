package conntrack

import (
	"context"
	"errors"
	"net"
	"testing"
)

func TestNewDialContextFuncDialsThroughParent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()

	// The default parent dials for real.
	c, err := NewDialContextFunc(DialWithTracing(), DialWithName("x"))(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("default dialer: %v", err)
	}
	c.Close()

	// A parent set by option is used, with the name in its context.
	refused := errors.New("refused by parent")
	var gotName, gotAddr string
	dial := NewDialContextFunc(
		DialWithDialContextFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
			gotName, gotAddr = DialNameFromContext(ctx), addr
			return nil, refused
		}),
		DialWithTracing(),
		DialWithName("scrape"),
	)
	if _, err := dial(context.Background(), "tcp", "10.0.0.1:9400"); !errors.Is(err, refused) {
		t.Fatalf("err = %v, want the parent's", err)
	}
	if gotName != "scrape" || gotAddr != "10.0.0.1:9400" {
		t.Fatalf("parent saw name %q addr %q, want scrape 10.0.0.1:9400", gotName, gotAddr)
	}
	if DialNameFromContext(context.Background()) != "" {
		t.Fatal("a context without a name has one")
	}
}

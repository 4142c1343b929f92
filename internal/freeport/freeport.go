// Package freeport hands out loopback TCP ports for the components tests
// start, each of which binds its port itself a moment later.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// The range Get draws from: below the kernel's default ephemeral range.
const low, high = 20000, 32768

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Get returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before.
//
// The port is drawn at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default) and checked by
// binding it. A port from the ephemeral range (what listening on :0
// returns) can be taken as the source port of any outgoing connection
// between this check and the component's own bind, and clusters of
// parallel tests and packages make many connections; ports below the
// range are never handed out by connect(). Listening on :0 twice in a
// row can also return the same port twice, which two components of one
// test then both try to bind.
func Get() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		port := low + rand.IntN(high-low)
		if handed[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		handed[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("find a free port: none free in %d-%d after 1000 tries", low, high)
}

// Addr is a "127.0.0.1:<port>" address from Get, for a test: a failure
// ends the test.
func Addr(t interface {
	Helper()
	Fatal(args ...any)
}) string {
	t.Helper()
	port, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

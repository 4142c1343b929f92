package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestGetDistinctAndFree: ports handed out are never handed out twice,
// lie below the ephemeral range, and can be bound.
func TestGetDistinctAndFree(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p, err := Get()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < low || p >= high {
			t.Fatalf("port %d outside %d-%d", p, low, high)
		}
	}
	for p := range seen {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d handed out but not bindable: %v", p, err)
			continue
		}
		l.Close()
	}
}

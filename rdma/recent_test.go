package rdma

import (
	"slices"
	"testing"
	"time"
)

func TestRecent(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRecent(2 * time.Second)
	r.now = func() time.Time { return now }
	steps := []struct {
		name    string
		record  []string
		advance time.Duration
		want    []string
	}{
		{name: "nothing recorded"},
		{name: "just recorded", record: []string{"GPU-1", "GPU-2"}, want: []string{"GPU-1", "GPU-2"}},
		{name: "within ttl", advance: 2 * time.Second, want: []string{"GPU-1", "GPU-2"}},
		{name: "expired", advance: time.Millisecond},
		{name: "new record", record: []string{"GPU-3"}, want: []string{"GPU-3"}},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		if s.record != nil {
			r.Record(s.record)
		}
		if got := r.RecentAllocation(); !slices.Equal(got, s.want) {
			t.Errorf("%s: RecentAllocation = %v, want %v", s.name, got, s.want)
		}
	}
	var _ RecentGPUs = r
}

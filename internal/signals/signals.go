// Package signals merges change signals: channels of struct{} that say
// "something changed, look again", whose consumer re-reads everything.
package signals

import "context"

// FanIn merges signal channels into one that coalesces bursts: one pending
// signal stands for any number of changes. Nil channels are skipped; a
// closed one stops being read. Its goroutines end with ctx.
func FanIn(ctx context.Context, chans ...<-chan struct{}) <-chan struct{} {
	out := make(chan struct{}, 1)
	for _, c := range chans {
		if c == nil {
			continue
		}
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-c:
					if !ok {
						return
					}
					select {
					case out <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return out
}

package topology

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Options bound and shorten one discovery.
type Options struct {
	// CallTimeout bounds each GPU's reads: a GPU whose reads have not all
	// returned by then (a GSP timeout, XID 119, blocks NVML calls on that
	// GPU for tens of seconds) is kept as Lost with LostReason
	// "nvml-timeout: <call>", and the other GPUs are not held up by it.
	// Zero waits as long as NVML takes.
	CallTimeout time.Duration
	// Previous is the node of the last discovery. When the GPU set is the
	// same (UUIDs, bus IDs and lost flags, in the same order), its Links are
	// reused and the NVLink remote and PCIe common-ancestor queries (most
	// of a discovery's calls) are skipped.
	Previous *Node
}

// Discoverer discovers a node's topology again and again. It remembers the
// GPU reads still running from earlier discoveries (a hung GPU) so that it
// never starts a second read on a GPU whose last one has not returned: a
// hung GPU holds at most one goroutine. Discoveries are serialised.
type Discoverer struct {
	lib      nvml.Interface
	hostRoot string
	log      *slog.Logger

	// run serialises discoveries.
	run sync.Mutex

	mu sync.Mutex
	// inflight are the reads still running, by GPU index; a read removes
	// itself when it returns, however late.
	inflight map[int]*progress
}

// NewDiscoverer returns a Discoverer over lib (initialised) and the sysfs
// under hostRoot ("/" when empty). log may be nil.
func NewDiscoverer(lib nvml.Interface, hostRoot string, log *slog.Logger) *Discoverer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if hostRoot == "" {
		hostRoot = "/"
	}
	return &Discoverer{lib: lib, hostRoot: hostRoot, log: log, inflight: map[int]*progress{}}
}

// Inflight is the number of GPU reads still running from earlier
// discoveries (GPUs that timed out and have not answered since).
func (d *Discoverer) Inflight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.inflight)
}

// progress is what a GPU's read has got to, shared between the goroutine
// doing the read and the discovery that may give up waiting for it.
type progress struct {
	mu    sync.Mutex
	call  string
	uuid  string
	busID string
}

// at records the NVML call about to be made.
func (p *progress) at(call string) {
	p.mu.Lock()
	p.call = call
	p.mu.Unlock()
}

func (p *progress) identity(uuid, busID string) {
	p.mu.Lock()
	if uuid != "" {
		p.uuid = uuid
	}
	if busID != "" {
		p.busID = busID
	}
	p.mu.Unlock()
}

func (p *progress) snapshot() (call, uuid, busID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.call, p.uuid, p.busID
}

// outcome is one GPU's result from bounded: its value when the read
// returned in time, else what the read had got to.
type outcome[T any] struct {
	val T
	ok  bool
	// skipped says no read was started by request; busy that none was
	// started because an earlier read of this GPU is still running.
	skipped, busy     bool
	call, uuid, busID string
}

// lostReason is LostReason for a GPU whose read did not return in time.
func (o outcome[T]) lostReason() string {
	call := o.call
	if call == "" {
		call = "unknown call"
	}
	if o.busy {
		return fmt.Sprintf("nvml-timeout: %s (an earlier read of this gpu is still running)", call)
	}
	return "nvml-timeout: " + call
}

// bounded runs read(i) for GPU indexes 0..n-1 (except where skip says so)
// each on its own goroutine, and waits for them until timeout (zero: no
// limit). A read still running from an earlier call is not started again.
// Each read writes only to values local to its goroutine and hands its
// result back over a buffered channel, so a late result is dropped without
// a race.
func bounded[T any](d *Discoverer, n int, timeout time.Duration, skip func(int) bool, read func(i int, p *progress) T) []outcome[T] {
	type result struct {
		i int
		v T
	}
	out := make([]outcome[T], n)
	progs := make([]*progress, n)
	ch := make(chan result, n)
	running := 0
	for i := 0; i < n; i++ {
		if skip != nil && skip(i) {
			out[i].skipped = true
			continue
		}
		d.mu.Lock()
		if p := d.inflight[i]; p != nil {
			d.mu.Unlock()
			out[i].busy = true
			out[i].call, out[i].uuid, out[i].busID = p.snapshot()
			continue
		}
		p := &progress{}
		d.inflight[i] = p
		d.mu.Unlock()
		progs[i] = p
		running++
		go func() {
			v := read(i, p)
			// Leave the in-flight set before handing the result over, so
			// the next discovery never sees a finished read as running.
			d.mu.Lock()
			if d.inflight[i] == p {
				delete(d.inflight, i)
			}
			d.mu.Unlock()
			ch <- result{i, v}
		}()
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for running > 0 {
		select {
		case r := <-ch:
			out[r.i].val, out[r.i].ok = r.v, true
			running--
		case <-deadline:
			// Take what arrived together with the deadline first.
			for drained := false; !drained; {
				select {
				case r := <-ch:
					out[r.i].val, out[r.i].ok = r.v, true
				default:
					drained = true
				}
			}
			for i, p := range progs {
				if p != nil && !out[i].ok {
					out[i].call, out[i].uuid, out[i].busID = p.snapshot()
				}
			}
			running = 0
		}
	}
	return out
}

package safeguard

import (
	"context"
	"sync"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// follower is the watch a refused node keeps on one bucket of slots: a
// client-go informer on the bucket's labels, so its initial state is at
// most BucketSize Leases and its events are only those slots' changes.
// It lives from the refusal until the node holds a slot, releases, or the
// context of the Acquire that started it ends; a node follows one bucket
// at most.
type follower struct {
	bucket int
	// limit is K when the node last decided: slots of the bucket at or
	// above it are not looked at.
	limit atomic.Int64
	inf   cache.SharedIndexInformer
	// synced is set once the informer's handler has seen the initial
	// state; done is closed when the watch stops.
	synced atomic.Bool
	done   <-chan struct{}
	stop   func()

	mu sync.Mutex
	// signalled are the candidate slots (absent, or expired) last
	// signalled, by index, each with its Lease's resourceVersion ("" when
	// absent): a slot is signalled again only when it changes.
	signalled map[int]string
}

// Room is signalled when asking again may find a slot although the last
// Acquire was refused: a slot of the bucket this node follows was freed
// (its Lease deleted) or its Lease was seen expired. The tainter
// reconciles on it; one pending signal stands for any number.
func (s *Slots) Room() <-chan struct{} { return s.room }

// following is the live follower, nil when none (a follower whose
// context ended is dropped).
func (s *Slots) following() *follower {
	f := s.follow
	if f == nil {
		return nil
	}
	select {
	case <-f.done:
		s.unfollow()
		return nil
	default:
		return f
	}
}

// unfollow stops the follower, if any, and drops a Room signal it left.
func (s *Slots) unfollow() {
	if s.follow != nil {
		s.follow.stop()
		s.follow = nil
		select {
		case <-s.room:
		default:
		}
	}
}

// followBucket starts following bucket b (stopping another follower).
// seed, when not nil, is the LIST of that bucket this Acquire made: the
// watch starts from it (its resourceVersion) instead of listing the
// bucket again. The watch outlives this call: it stops with unfollow, or
// when ctx ends.
func (s *Slots) followBucket(ctx context.Context, b, k int, seed *coordinationv1.LeaseList) {
	s.unfollow()
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(ctx, cancel)
	sel := s.bucketSelector(b)
	leases := s.client.CoordinationV1().Leases(s.cfg.Namespace)
	lw := &seededList{ListWatch: &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return leases.Watch(ctx, o)
		},
	}}
	if seed != nil {
		lw.seed = seed.DeepCopy()
	}
	inf := cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
	f := &follower{bucket: b, inf: inf, done: wctx.Done()}
	f.limit.Store(int64(k))
	check := func(any) { s.check(f) }
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: check, UpdateFunc: func(_, o any) { check(o) }, DeleteFunc: check,
	})
	if err != nil {
		unhook()
		cancel()
		s.log.Warn("following a bucket of taint slots failed; asking again on the next change only", "node", s.node, "bucket", b, "err", err)
		return
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		inf.RunWithContext(wctx)
	}()
	go func() {
		if cache.WaitForCacheSync(wctx.Done(), reg.HasSynced) {
			f.synced.Store(true)
			s.check(f)
		}
	}()
	f.stop = func() {
		unhook()
		cancel()
		<-ran
	}
	s.follow = f
	s.log.Debug("following a bucket of taint slots", "node", s.node, "bucket", b, "limit", k, "seeded", seed != nil)
}

// seededList lists and watches one bucket of slot Leases; its first List
// answers with seed, the bucket as the refusal read it, when there is
// one, so that following the bucket reads no Lease twice. Later lists
// (the watch's resourceVersion too old, say) read the bucket again.
type seededList struct {
	*cache.ListWatch
	mu   sync.Mutex
	seed *coordinationv1.LeaseList
}

func (l *seededList) List(o metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), o)
}

func (l *seededList) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	l.mu.Lock()
	seed := l.seed
	l.seed = nil
	l.mu.Unlock()
	if seed != nil {
		return seed, nil
	}
	return l.ListWatch.ListWithContext(ctx, o)
}

// IsWatchListSemanticsUnSupported keeps client-go's reflector on List
// (see k8s.io/client-go/util/watchlist): a watch that streams its initial
// state (WatchListClient) would read the seeded bucket again.
func (l *seededList) IsWatchListSemanticsUnSupported() bool { return true }

func (f *follower) setLimit(k int) { f.limit.Store(int64(k)) }

// lease is slot i's Lease in the follower's cache, nil when absent.
func (f *follower) lease(cfg Config, i int) *coordinationv1.Lease {
	obj, ok, err := f.inf.GetStore().GetByKey(cfg.Namespace + "/" + slotName(cfg.Prefix, i))
	if err != nil || !ok {
		return nil
	}
	l, _ := obj.(*coordinationv1.Lease)
	return l
}

// addTo records the followed bucket in v from the cache, once it holds
// the initial state (false before).
func (f *follower) addTo(v *view, cfg Config, self string) bool {
	if !f.synced.Load() {
		return false
	}
	var leases []*coordinationv1.Lease
	for i := f.bucket * BucketSize; i < (f.bucket+1)*BucketSize; i++ {
		l := f.lease(cfg, i)
		switch {
		case l == nil:
		case leaseHolder(l) == self:
			v.mine = append(v.mine, l)
		default:
			leases = append(leases, l)
		}
	}
	v.addBucket(f.bucket, leases, cfg.Prefix)
	return true
}

// check signals Room when the followed bucket, as cached, has a slot
// under K that is absent or expired and was not signalled in that state
// before. It runs on the informer's goroutine and never takes s.mu
// (unfollow, under s.mu, waits for that goroutine).
func (s *Slots) check(f *follower) {
	select {
	case <-f.done:
		return
	default:
	}
	if !f.synced.Load() {
		return
	}
	k := int(f.limit.Load())
	cur := map[int]string{}
	for i := f.bucket * BucketSize; i < min((f.bucket+1)*BucketSize, k); i++ {
		l := f.lease(s.cfg, i)
		switch {
		case l == nil:
			cur[i] = ""
		case s.expired(l):
			cur[i] = l.ResourceVersion
		}
	}
	f.mu.Lock()
	news := false
	for i, rv := range cur {
		if old, seen := f.signalled[i]; !seen || old != rv {
			news = true
		}
	}
	f.signalled = cur
	f.mu.Unlock()
	if news {
		s.signalRoom()
	}
}

// signalRoom signals Room (one pending signal stands for any number).
func (s *Slots) signalRoom() {
	select {
	case s.room <- struct{}{}:
	default:
	}
}

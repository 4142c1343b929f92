package kubeapi

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// RetryBackoff is the delay between failed reconciles of the tainter and
// the labeler: 1s doubling up to 1m, each delay stretched at random by up
// to 100% (so at most 2m), so that agents refused or throttled together
// spread their retries out instead of returning in waves. Step it on a
// copy; start again from a fresh copy after a success.
func RetryBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 1, Cap: time.Minute, Steps: math.MaxInt32}
}

// conflictBackoff spaces the retries of one write refused with Conflict
// (each retry also waits for the informer to deliver the newer Node).
func conflictBackoff() wait.Backoff {
	return wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 5}
}

// reconcileLoop runs reconcile until ctx ends: at start, after every
// signal on changed or nodeChanged, and after a failure again, with
// jittered exponential backoff (a fresh copy of backoff after each
// success; failed logs the error and the delay). While it backs off,
// signals wait: the retry reads the latest of everything.
func reconcileLoop(ctx context.Context, backoff wait.Backoff, reconcile func(context.Context) error,
	failed func(err error, retry time.Duration), changed, nodeChanged <-chan struct{}) {
	b := backoff
	for {
		err := reconcile(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d := b.Step()
			failed(err, d)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		b = backoff
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-nodeChanged:
		}
	}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

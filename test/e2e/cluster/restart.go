package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// StopAPIServer stops kube-apiserver and leaves etcd, the PKI and the
// kubeconfig in place, so RestartAPIServer brings the same API back on
// the same address: what clients see during an apiserver upgrade or
// crash.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p == nil {
		return errors.New("stop kube-apiserver: not started")
	}
	return p.stop(15 * time.Second)
}

// RestartAPIServer starts kube-apiserver again with the arguments it had
// (same port, etcd, certificates) after StopAPIServer, and waits until it
// is ready.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	old := c.apiserver
	stopped := c.stopped
	c.mu.Unlock()
	if old == nil || stopped {
		return errors.New("restart kube-apiserver: cluster not running")
	}
	if gone, _ := old.exited(); !gone {
		return errors.New("restart kube-apiserver: still running (call StopAPIServer first)")
	}
	p, err := startProcess("kube-apiserver", c.LogDir, old.cmd.Path, old.cmd.Args[1:]...)
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()
	return waitFor(ctx, "restarted kube-apiserver /readyz", p, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(cctx)
		return err
	})
}

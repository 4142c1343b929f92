package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// registerTimeout bounds one Register call. The kubelet dials back our socket
// and asks for options before it answers, so this is more than a round trip.
const registerTimeout = 10 * time.Second

// newBackoff is the retry schedule after a failed registration: quick at
// first (kubelet.sock exists a moment before the kubelet listens on it, and
// a connect in that gap is refused), then at most every 30 s so an absent
// kubelet costs nothing. kubelet.sock being re-created resets it.
func newBackoff() wait.Backoff {
	return wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
}

// registerLoop registers the server with the kubelet now, again whenever
// requestRegistration is called, and retries failures with backoff until it
// succeeds. A failure streak is logged once, at its second attempt (a single
// refused connect right after kubelet.sock appears is routine and only
// logged at debug level), and its end once.
func (s *server) registerLoop(ctx context.Context, kubeletSocket string, watching <-chan struct{}) {
	defer close(s.loopDone)
	select {
	case <-watching:
	case <-ctx.Done():
		return
	}
	backoff := newBackoff()
	var retry <-chan time.Time
	failures := 0
	pending := true
	for {
		if pending {
			pending, retry = false, nil
			gen := s.kubeletGen.Load()
			err := s.register(ctx, kubeletSocket)
			if ctx.Err() != nil {
				return
			}
			s.metrics.registration(s.name, err)
			switch {
			case err == nil && s.kubeletGen.Load() != gen:
				// The kubelet we registered with went away meanwhile; the
				// next one's kubelet.sock will bring a new attempt.
				s.log.Debug("registered with a kubelet that has since gone")
			case err == nil:
				s.setRegistered(true)
				s.log.Info("registered with kubelet", "socket", filepath.Base(s.socket), "failedAttempts", failures)
				failures, backoff = 0, newBackoff()
			default:
				s.setRegistered(false)
				switch failures {
				case 0:
					s.log.Debug("registration with kubelet failed, retrying", "err", err)
				case 1:
					s.log.Warn("registration with kubelet failed, retrying with backoff", "err", err)
				}
				failures++
				retry = time.After(backoff.Step())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			// A new kubelet is listening: try at once and start the
			// backoff over.
			pending, backoff = true, newBackoff()
		case <-retry:
			pending = true
		}
	}
}

// register sends one RegisterRequest for this server to the kubelet.
func (s *server) register(ctx context.Context, kubeletSocket string) error {
	res, _ := s.resource()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet socket %s: %w", kubeletSocket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.name,
		Options:      options(res),
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", s.name, err)
	}
	return nil
}

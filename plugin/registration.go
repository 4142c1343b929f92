package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
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

// errNoKubelet marks a registration that failed because nothing listens on
// the kubelet's registration socket: the file is absent (no kubelet yet, as
// in the demo) or refuses the connection (a kubelet that is starting, or one
// that died and left its socket behind). It is a state to wait out, not a
// fault: kubelet.sock being created starts a new attempt at once.
var errNoKubelet = errors.New("no kubelet is listening")

// isNoKubelet says whether a dial error means nothing listens on the socket.
func isNoKubelet(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)
}

// kubeletAbsence reports an absent kubelet once for all of a Manager's
// servers: with five resources and no kubelet, one line says so rather
// than one per resource (and none per attempt). Once any server registers
// the kubelet counts as present again, so a later absence is reported anew.
type kubeletAbsence struct {
	log    *slog.Logger
	socket string

	mu       sync.Mutex
	reported bool
	// epoch counts successful registrations. An attempt that failed to
	// connect while another server registered (its dial raced the new
	// kubelet's listen) says nothing about the kubelet now.
	epoch uint64
}

func newKubeletAbsence(log *slog.Logger, socket string) *kubeletAbsence {
	return &kubeletAbsence{log: log, socket: socket}
}

// begin is called before an attempt; its result goes to absent.
func (a *kubeletAbsence) begin() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// absent notes an attempt, begun at epoch, that found no kubelet. Only the
// first since the kubelet was last present is logged, and it says so.
func (a *kubeletAbsence) absent(epoch uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reported || a.epoch != epoch {
		return false
	}
	a.reported = true
	a.log.Info("no kubelet is listening on its registration socket; will keep trying quietly (log level debug shows each attempt) and log when registration succeeds",
		"kubeletSocket", a.socket)
	return true
}

// present notes a successful registration.
func (a *kubeletAbsence) present() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.epoch++
	a.reported = false
}

// registerLoop registers the server with the kubelet now, again whenever
// requestRegistration is called, and retries failures with backoff until it
// succeeds. Each attempt's failure is logged at debug level; above it:
//   - no kubelet listening: one line for all servers (see kubeletAbsence),
//     at a server's second attempt, since one refused connect right after
//     kubelet.sock appears is routine;
//   - a kubelet that answers but fails the registration: one warning per
//     streak, at its second such failure;
//   - success: one line per resource, with the number of failed attempts.
func (s *server) registerLoop(ctx context.Context, kubeletSocket string, watching <-chan struct{}) {
	defer close(s.loopDone)
	select {
	case <-watching:
	case <-ctx.Done():
		return
	}
	absence := s.absence
	if absence == nil {
		// A server built outside a Manager reports for itself.
		absence = newKubeletAbsence(s.log, kubeletSocket)
	}
	backoff := newBackoff()
	var retry <-chan time.Time
	// failures counts every failed attempt of the streak, rejects those a
	// kubelet answered.
	failures, rejects := 0, 0
	pending := true
	for {
		if pending {
			pending, retry = false, nil
			gen, epoch := s.kubeletGen.Load(), absence.begin()
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
				absence.present()
				// Logged before Registered() says so, so that whoever
				// waits for that also finds the line.
				s.log.Info("registered with kubelet", "socket", filepath.Base(s.socket), "failedAttempts", failures)
				s.setRegistered(true)
				failures, rejects, backoff = 0, 0, newBackoff()
			default:
				s.setRegistered(false)
				failures++
				logged := false
				if errors.Is(err, errNoKubelet) {
					logged = failures > 1 && absence.absent(epoch)
				} else {
					rejects++
					if rejects == 2 {
						s.log.Warn("registration with kubelet failed, retrying with backoff", "err", err)
						logged = true
					}
				}
				if !logged {
					s.log.Debug("registration with kubelet failed, retrying", "attempt", failures, "err", err)
				}
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

// register sends one RegisterRequest for this server to the kubelet. A
// failure to connect because nothing listens on kubeletSocket wraps
// errNoKubelet.
func (s *server) register(ctx context.Context, kubeletSocket string) error {
	res, _ := s.resource()
	// gRPC turns dial errors into an Unavailable status that no longer says
	// why; the dialer keeps the cause to tell an absent kubelet from a
	// failing one.
	var dialErr atomic.Pointer[error]
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", kubeletSocket)
		if err != nil {
			dialErr.Store(&err)
		} else {
			dialErr.Store(nil)
		}
		return c, err
	}
	conn, err := grpc.NewClient("unix://"+kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
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
		if de := dialErr.Load(); de != nil && isNoKubelet(*de) {
			return fmt.Errorf("register %s with kubelet: %w: %w", s.name, errNoKubelet, *de)
		}
		return fmt.Errorf("register %s with kubelet: %w", s.name, err)
	}
	return nil
}

package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
)

// ServerConfig configures the metrics endpoint.
type ServerConfig struct {
	// Address is the listen address (--metrics-address), e.g. ":9400".
	Address string
	// WebConfigFile is exporter-toolkit's web config (TLS, basic auth);
	// empty serves plain HTTP (--web.config.file).
	WebConfigFile string
}

// Server serves /metrics, /healthz and /readyz on one listener.
type Server struct {
	listener net.Listener
	http     *http.Server
	flags    *web.FlagConfig
	log      *slog.Logger
}

// Listen validates the web config, binds cfg.Address and returns a Server
// ready to Serve. /metrics renders reg; /healthz answers 200 while the
// process runs; /readyz answers 200 when ready returns nil (nil ready
// means always ready) and 503 with the error otherwise.
func Listen(cfg ServerConfig, reg *prometheus.Registry, ready func() error, log *slog.Logger) (*Server, error) {
	if cfg.WebConfigFile != "" {
		if err := web.Validate(cfg.WebConfigFile); err != nil {
			return nil, fmt.Errorf("validate web config %s: %w", cfg.WebConfigFile, err)
		}
	}
	l, err := net.Listen("tcp", cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("listen on metrics address %s: %w", cfg.Address, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		// OpenMetrics stays off: its encoder appends _total to counter
		// names, which would rename dcgm-exporter's counters.
		EnableOpenMetrics: false,
	})))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("gpu-node-agent: /metrics /healthz /readyz\n"))
	})
	systemd := false
	addrs := []string{cfg.Address}
	return &Server{
		listener: l,
		http:     &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		flags:    &web.FlagConfig{WebListenAddresses: &addrs, WebSystemdSocket: &systemd, WebConfigFile: &cfg.WebConfigFile},
		log:      log,
	}, nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// Serve serves until ctx is done, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- web.Serve(s.listener, s.http, s.flags, s.log) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve metrics on %s: %w", s.listener.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down metrics server: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics on %s: %w", s.listener.Addr(), err)
	}
	return nil
}

// Serve is Listen followed by Server.Serve.
func Serve(ctx context.Context, cfg ServerConfig, reg *prometheus.Registry, ready func() error, log *slog.Logger) error {
	s, err := Listen(cfg, reg, ready, log)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

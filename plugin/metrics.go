package plugin

import (
	"context"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are the manager's Prometheus series. They are always created so
// the code never checks for nil; they are registered only when the caller
// passed a Registerer.
type metrics struct {
	registered    *prometheus.GaugeVec
	registrations *prometheus.CounterVec
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	streams       *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		registered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_plugin_registered",
			Help: "Whether the device plugin for a resource is registered with the kubelet (1) or not (0).",
		}, []string{"resource"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_plugin_registrations_total",
			Help: "Registration attempts with the kubelet, by resource and result (success or failure).",
		}, []string{"resource", "result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_plugin_requests_total",
			Help: "Device-plugin gRPC requests served, by resource, method and gRPC status code.",
		}, []string{"resource", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpu_node_agent_plugin_request_duration_seconds",
			Help: "Time to serve unary device-plugin gRPC requests, by resource and method.",
			// These calls take microseconds to a few milliseconds; the
			// default buckets (5ms..10s) would put them all in the first one.
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 9), // 10µs .. ~0.66s
		}, []string{"resource", "method"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_plugin_list_and_watch_streams",
			Help: "Open ListAndWatch streams, by resource.",
		}, []string{"resource"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.registered, m.registrations, m.requests, m.duration, m.streams} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// forget drops the gauges of a resource that is no longer served, so a MIG
// profile that disappeared does not linger as a stale series. Counters stay:
// they are history.
func (m *metrics) forget(resource string) {
	m.registered.DeleteLabelValues(resource)
	m.streams.DeleteLabelValues(resource)
}

func (m *metrics) registration(resource string, err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.registrations.WithLabelValues(resource, result).Inc()
}

func (m *metrics) setRegistered(resource string, ok bool) {
	v := 0.0
	if ok {
		v = 1
	}
	m.registered.WithLabelValues(resource).Set(v)
}

func (m *metrics) setStreams(resource string, n int) {
	m.streams.WithLabelValues(resource).Set(float64(n))
}

// unary counts and times every unary call of one resource's server.
func (m *metrics) unary(resource string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		method := path.Base(info.FullMethod)
		m.duration.WithLabelValues(resource, method).Observe(time.Since(start).Seconds())
		m.requests.WithLabelValues(resource, method, status.Code(err).String()).Inc()
		return resp, err
	}
}

// stream counts finished ListAndWatch streams; their duration is the
// lifetime of a kubelet connection, not a latency, so it is not observed.
// Open streams are counted by the server itself (setStreams).
func (m *metrics) stream(resource string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		m.requests.WithLabelValues(resource, path.Base(info.FullMethod), status.Code(err).String()).Inc()
		return err
	}
}

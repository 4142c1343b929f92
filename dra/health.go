package dra

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// The kubelet's DRA health service (KEP-4680), as kubelet v1.37.2 consumes
// it (k8s.io/kubernetes pkg/kubelet/cm/dra):
//
//   - plugin/dra_plugin_manager.go: it opens NodeWatchResources only when the
//     ResourceHealthStatus gate is on (beta, on by default since 1.36) and
//     GetInfo's supported versions name a health service it knows
//     (pickHealthService: "v1.DRAResourceHealth", else
//     "v1alpha1.DRAResourceHealth", the latter until 1.40), on the same
//     connection as the DRA service. When a stream ends it opens another
//     5 s later (wait.UntilWithContext); Unimplemented makes it stop for
//     good, so a served health service never answers that.
//   - manager.go HandleWatchResourcesStream: every response is reconciled
//     with its cache of this driver's devices (healthinfo.go
//     updateHealthInfo), taking its own receipt time as the device's last
//     update (last_updated_time is not used). When a stream ends, the whole
//     driver's cache is cleared: every device reads UNKNOWN until the next
//     stream reports it.
//   - healthinfo.go: a device not reported again within its
//     health_check_timeout_seconds (default DefaultHealthTimeout, 30 s)
//     reads UNKNOWN, and one missing from a response is dropped once that
//     timeout has passed. A response is therefore the complete list, as the
//     proto says, and it is re-sent before the timeout.
//   - manager.go UpdateAllocatedResourcesStatus: a pod's
//     status.containerStatuses[].allocatedResourcesStatus gets, per
//     claim (and request) of the container, one entry per allocated device
//     looked up by driver, pool and device name, its resourceID the first
//     CDI device ID the plugin returned from NodePrepareResources. The
//     message is copied only when ResourceHealthStatusMessage is on (beta,
//     on by default since 1.36) and is cut to 1024 bytes
//     (truncateHealthMessage).
//
// k8s.io/kubelet v0.36.3, our version, has only the v1alpha1 API; v1
// (k8s.io/kubelet v0.37) is the same messages under another package, and
// kubelet 1.37 reads a v1alpha1 server through V1Alpha1ClientWrapper. As
// k8s.io/dynamic-resource-allocation v0.36.3 kubeletplugin does
// (draplugin.go Start), the service is registered on the DRA socket's gRPC
// server and advertised in GetInfo's supported versions; that library
// version finds it by asserting drahealth.DRAResourceHealthServer on the
// driver, v0.37.2 always serves it (HealthService option).

// HealthService is the DRAResourceHealth gRPC service the plugin serves
// on DRASocket and advertises in GetInfo.
var HealthService = drahealth.DRAResourceHealth_ServiceDesc.ServiceName

const (
	// HealthCheckTimeout is sent as every device's
	// health_check_timeout_seconds: the kubelet reads a device as UNKNOWN
	// once it has not been reported for this long. It is the kubelet's
	// default, stated so a changed default cannot make healthy devices
	// flap to UNKNOWN.
	HealthCheckTimeout = 30 * time.Second
	// HealthResendInterval is how often each stream re-sends the current
	// state while nothing changes, so the kubelet's HealthCheckTimeout
	// never runs out: two re-sends may be late or lost before it does.
	HealthResendInterval = HealthCheckTimeout / 3
)

// DeviceHealth is one published device's health for the kubelet's DRA health service.
type DeviceHealth struct {
	Device  string // device name in this node's pool: gpu-0, gpu-1-mig-1g10gb-9-0, nic-mlx5-0
	Healthy bool
	Message string // why not healthy ("xid-79: ..."); empty when healthy
}

// healthState is one SetHealth's devices, sorted by name. It is never
// modified once published, so streams read it without a lock.
type healthState struct {
	gen     uint64 // 1 for the first state; bumped only when devices change
	devices []DeviceHealth
	at      time.Time // the last SetHealth that said so
}

// SetHealth replaces the health of all devices (latest wins). Never blocks; callable before Start, from any goroutine.
//
// Devices without a name are dropped and a name given twice keeps its
// last entry (both logged). A message is made valid UTF-8 (gRPC refuses
// to send a string that is not) and cut, on a character boundary, to the
// 1024 bytes the kubelet keeps. A state equal to the current one sends
// nothing; otherwise every stream sends the new full list, and a stream
// still sending an older one sends only the latest after it.
func (p *KubeletPlugin) SetHealth(devs []DeviceHealth) {
	devices := p.normaliseHealth(devs)
	now := p.clock.Now()

	p.healthMu.Lock()
	cur := p.health
	changed := cur == nil || !slices.Equal(cur.devices, devices)
	next := &healthState{devices: devices, at: now}
	if cur != nil {
		next.gen = cur.gen
	}
	if changed {
		next.gen++
	}
	p.health = next
	var subs []chan struct{}
	if changed {
		subs = make([]chan struct{}, 0, len(p.healthSubs))
		for c := range p.healthSubs {
			subs = append(subs, c)
		}
	}
	p.healthMu.Unlock()

	for _, c := range subs {
		select {
		case c <- struct{}{}:
		default: // the stream has a wake-up pending; it reads the latest state
		}
	}
	if changed {
		unhealthy := 0
		for _, d := range devices {
			if !d.Healthy {
				unhealthy++
			}
		}
		p.log.Debug("dra device health changed", "devices", len(devices), "unhealthy", unhealthy, "streams", len(subs))
	}
}

func (p *KubeletPlugin) normaliseHealth(devs []DeviceHealth) []DeviceHealth {
	byName := make(map[string]DeviceHealth, len(devs))
	for i, d := range devs {
		if d.Device == "" {
			p.log.Error("dra device health: device without a name dropped", "entry", i, "healthy", d.Healthy, "message", d.Message)
			continue
		}
		if _, dup := byName[d.Device]; dup {
			p.log.Error("dra device health: device given twice, the last entry wins", "device", d.Device)
		}
		d.Message = healthMessage(d.Message)
		byName[d.Device] = d
	}
	out := make([]DeviceHealth, 0, len(byName))
	for _, d := range byName {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DeviceHealth) int { return strings.Compare(a.Device, b.Device) })
	return out
}

// healthMessage is msg as valid UTF-8 of at most
// corev1.ResourceHealthMessageMaxLength bytes, cut as the kubelet cuts it
// (the first max-3 bytes and "...") but never inside a character.
func healthMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	const max = corev1.ResourceHealthMessageMaxLength
	if len(msg) <= max {
		return msg
	}
	cut := max - 3
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}

func (p *KubeletPlugin) currentHealth() *healthState {
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	return p.health
}

func (p *KubeletPlugin) subscribeHealth() (chan struct{}, func()) {
	c := make(chan struct{}, 1)
	p.healthMu.Lock()
	p.healthSubs[c] = struct{}{}
	p.healthMu.Unlock()
	return c, func() {
		p.healthMu.Lock()
		delete(p.healthSubs, c)
		p.healthMu.Unlock()
	}
}

// healthResponse is the complete list of st, in the plugin's pool.
func healthResponse(st *healthState, pool string) *drahealth.NodeWatchResourcesResponse {
	resp := &drahealth.NodeWatchResourcesResponse{Devices: make([]*drahealth.DeviceHealth, 0, len(st.devices))}
	for _, d := range st.devices {
		h := &drahealth.DeviceHealth{
			Device:                    &drahealth.DeviceIdentifier{PoolName: pool, DeviceName: d.Device},
			Health:                    drahealth.HealthStatus_HEALTHY,
			LastUpdatedTime:           st.at.Unix(),
			HealthCheckTimeoutSeconds: int64(HealthCheckTimeout / time.Second),
			Message:                   d.Message,
		}
		if !d.Healthy {
			h.Health = drahealth.HealthStatus_UNHEALTHY
		}
		resp.Devices = append(resp.Devices, h)
	}
	return resp
}

// healthServer serves NodeWatchResources for a KubeletPlugin.
type healthServer struct {
	p *KubeletPlugin
	drahealth.UnsafeDRAResourceHealthServer
}

var _ drahealth.DRAResourceHealthServer = healthServer{}

// NodeWatchResources sends the current state at once (nothing until the
// first SetHealth), then the full list after each change and every
// HealthResendInterval. It ends when the kubelet goes, the plugin stops
// or a send fails.
func (h healthServer) NodeWatchResources(_ *drahealth.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealth.NodeWatchResourcesResponse]) error {
	p := h.p
	ctx := stream.Context()
	p.healthStreams.Add(1)
	defer p.healthStreams.Add(-1)
	// Subscribed before the first read, so a change in between is not missed.
	wake, unsubscribe := p.subscribeHealth()
	defer unsubscribe()
	// The ticker exists before the first send, so a test that has seen the
	// first response can step a fake clock past it.
	resend := p.clock.NewTicker(HealthResendInterval)
	defer resend.Stop()
	pool := p.prep.cfg.NodeName
	log := p.log.With("pool", pool)
	log.Info("dra health stream opened")
	defer log.Info("dra health stream closed")

	var sent uint64 // generation last sent; 0: none
	send := func(again bool) error {
		st := p.currentHealth()
		if st == nil || (!again && st.gen == sent) {
			return nil
		}
		if err := stream.Send(healthResponse(st, pool)); err != nil {
			return fmt.Errorf("dra health stream: send %d devices: %w", len(st.devices), err)
		}
		sent = st.gen
		return nil
	}
	if err := send(false); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			if err := send(false); err != nil {
				return err
			}
		case <-resend.C():
			if err := send(true); err != nil {
				return err
			}
		}
	}
}

// healthStreamCount is the number of NodeWatchResources streams being served.
func (p *KubeletPlugin) healthStreamCount() int64 { return p.healthStreams.Load() }

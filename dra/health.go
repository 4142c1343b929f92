package dra

import (
	"context"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// The kubelet's DRA health service (KEP-4680), as kubelet v1.37.2 consumes
// it (k8s.io/kubernetes pkg/kubelet/cm/dra) through the library's
// DRAResourceHealth servers (kubeletplugin/health.go, which serves v1 and,
// for kubelets up to 1.36, v1alpha1 from the same WatchHealthStatus):
//
//   - plugin/dra_plugin_manager.go: it opens NodeWatchResources only when the
//     ResourceHealthStatus gate is on (beta, on by default since 1.36) and
//     GetInfo's supported versions name a health service it knows; when a
//     stream ends it opens another 5 s later.
//   - manager.go HandleWatchResourcesStream: every response is reconciled
//     with its cache of this driver's devices, taking its own receipt time
//     as the device's last update. When a stream ends, the whole driver's
//     cache is cleared: every device reads UNKNOWN until the next stream
//     reports it.
//   - healthinfo.go: a device not reported again within its
//     health_check_timeout_seconds (default 30 s) reads UNKNOWN. A report
//     is therefore the complete list, re-sent before the timeout: the
//     library does not re-send for the driver, on purpose, so that a wedged
//     monitor decays to UNKNOWN.
//   - manager.go UpdateAllocatedResourcesStatus: a pod's
//     status.containerStatuses[].allocatedResourcesStatus gets, per claim
//     (and request) of the container, one entry per allocated device, its
//     resourceID the first CDI device ID the plugin returned from
//     NodePrepareResources. The message is copied only when
//     ResourceHealthStatusMessage is on and is cut to 1024 bytes.

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

// healthReport is the complete list of st, in the plugin's pool.
func healthReport(st *healthState, pool string) kubeletplugin.DeviceHealthReport {
	r := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(st.devices))}
	for _, d := range st.devices {
		h := kubeletplugin.DeviceHealth{
			PoolName: pool, DeviceName: d.Device, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: st.at, HealthCheckTimeout: HealthCheckTimeout, Message: d.Message,
		}
		if !d.Healthy {
			h.Health = kubeletplugin.HealthStatusUnhealthy
		}
		r.Devices = append(r.Devices, h)
	}
	return r
}

// WatchHealthStatus serves one of the kubelet's health streams (the
// library calls it for each, v1 or v1alpha1): it sends the current state
// at once (nothing until the first SetHealth), then the full list after
// each change and every HealthResendInterval (the library never re-sends
// for the driver). It returns nil when ctx ends: the kubelet went, a send
// failed or the plugin stopped.
func (p *KubeletPlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	p.healthStreams.Add(1)
	defer p.healthStreams.Add(-1)
	// Subscribed before the first read, so a change in between is not missed.
	wake, unsubscribe := p.subscribeHealth()
	defer unsubscribe()
	// The ticker exists before the first send, so a test that has seen the
	// first report can step a fake clock past it.
	resend := p.clock.NewTicker(HealthResendInterval)
	defer resend.Stop()
	pool := p.cfg.NodeName
	log := p.log.With("pool", pool)
	log.Info("dra health stream opened")
	defer log.Info("dra health stream closed")

	var sent uint64 // generation last sent; 0: none
	send := func(again bool) bool {
		st := p.currentHealth()
		if st == nil || (!again && st.gen == sent) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case reports <- healthReport(st, pool):
		}
		sent = st.gen
		return true
	}
	if !send(false) {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			if !send(false) {
				return nil
			}
		case <-resend.C():
			if !send(true) {
				return nil
			}
		}
	}
}

// healthStreamCount is the number of health streams being served.
func (p *KubeletPlugin) healthStreamCount() int64 { return p.healthStreams.Load() }

package dra

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes/fake"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// guard bounds every wait of these tests; reaching it fails the test (a
// hang, not a timing). It is generous for a loaded machine under -race.
const guard = 30 * time.Second

var healthEpoch = time.Unix(1_750_000_000, 0)

// healthEnv is a KubeletPlugin on real unix sockets in a temporary
// kubelet dir, with a fake clock for the re-send ticker. Health needs no
// devices, so its preparer has an empty inventory.
type healthEnv struct {
	t          *testing.T
	clock      *clocktesting.FakeClock
	plugin     *KubeletPlugin
	kubeletDir string
}

func newHealthEnv(t *testing.T) *healthEnv {
	t.Helper()
	prep, err := NewPreparer(PreparerConfig{NodeName: testNode, StateDir: t.TempDir(), CDIDir: t.TempDir(),
		Inventory: func() Inventory { return Inventory{} }})
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are limited to 108 bytes; t.TempDir can be long.
	kd, err := os.MkdirTemp("", "kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(kd) })
	e := &healthEnv{t: t, clock: clocktesting.NewFakeClock(healthEpoch), kubeletDir: kd}
	e.plugin = NewKubeletPlugin(prep, PluginConfig{KubeletDir: kd, NodeName: testNode})
	e.plugin.clock = e.clock
	return e
}

func (e *healthEnv) start() {
	e.t.Helper()
	if err := e.plugin.Start(context.Background(), fake.NewClientset()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(e.plugin.Stop)
}

// healthStream is the kubelet's end of one NodeWatchResources stream.
type healthStream struct {
	t      *testing.T
	client grpc.ServerStreamingClient[drahealth.NodeWatchResourcesResponse]
	cancel context.CancelFunc
	msgs   chan *drahealth.NodeWatchResourcesResponse
	done   chan error // the Recv error that ended the stream
}

// watch does what kubelet 1.37 does (pkg/kubelet/cm/dra/plugin,
// dra_plugin_manager.go): GetInfo on the registration socket, pick the
// health service from the supported versions as pickHealthService does,
// and open NodeWatchResources on the endpoint GetInfo names. Unless
// paused, a goroutine receives every response.
func (e *healthEnv) watch(paused bool, opts ...grpc.DialOption) *healthStream {
	t := e.t
	t.Helper()
	reg := registerapi.NewRegistrationClient(dial(t, RegistrationSocket(e.kubeletDir)))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var chosen string
	for _, s := range []string{"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} {
		if slices.Contains(info.SupportedVersions, s) {
			chosen = s
			break
		}
	}
	if chosen != "v1.DRAResourceHealth" {
		t.Fatalf("kubelet 1.37 would pick health service %q from %v", chosen, info.SupportedVersions)
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("unix://"+info.Endpoint, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := drahealth.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s := &healthStream{t: t, client: c, cancel: cancel,
		msgs: make(chan *drahealth.NodeWatchResourcesResponse, 1000), done: make(chan error, 1)}
	if !paused {
		s.read()
	}
	return s
}

func (s *healthStream) read() {
	go func() {
		for {
			m, err := s.client.Recv()
			if err != nil {
				s.done <- err
				return
			}
			s.msgs <- m
		}
	}()
}

// next is the stream's next response.
func (s *healthStream) next() *drahealth.NodeWatchResourcesResponse {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case err := <-s.done:
		s.t.Fatalf("stream ended: %v", err)
	case <-time.After(guard):
		s.t.Fatal("no health response")
	}
	return nil
}

// ended is the error that ended the stream.
func (s *healthStream) ended() error {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		s.t.Fatalf("response %v where the stream should end", m)
	case err := <-s.done:
		return err
	case <-time.After(guard):
		s.t.Fatal("stream did not end")
	}
	return nil
}

// dev is a device's health as the kubelet reads it.
type dev struct {
	name    string
	health  drahealth.HealthStatus
	message string
}

func devs(t *testing.T, r *drahealth.NodeWatchResourcesResponse, at time.Time) []dev {
	t.Helper()
	var out []dev
	for _, d := range r.Devices {
		if d.Device.GetPoolName() != testNode {
			t.Errorf("device %s in pool %q, want %q", d.Device.GetDeviceName(), d.Device.GetPoolName(), testNode)
		}
		if d.HealthCheckTimeoutSeconds != 30 {
			t.Errorf("device %s health_check_timeout_seconds = %d, want 30", d.Device.GetDeviceName(), d.HealthCheckTimeoutSeconds)
		}
		if d.LastUpdatedTime != at.Unix() {
			t.Errorf("device %s last_updated_time = %d, want %d", d.Device.GetDeviceName(), d.LastUpdatedTime, at.Unix())
		}
		out = append(out, dev{d.Device.GetDeviceName(), d.Health, d.Message})
	}
	return out
}

func wantDevs(t *testing.T, r *drahealth.NodeWatchResourcesResponse, at time.Time, want ...dev) {
	t.Helper()
	if got := devs(t, r, at); !slices.Equal(got, want) {
		t.Errorf("devices\n got %v\nwant %v", got, want)
	}
}

var (
	healthy   = drahealth.HealthStatus_HEALTHY
	unhealthy = drahealth.HealthStatus_UNHEALTHY
)

// eightGPUs is a node's state with gpu-3 unhealthy.
func eightGPUs() []DeviceHealth {
	var out []DeviceHealth
	for i := range 8 {
		out = append(out, DeviceHealth{Device: fmt.Sprintf("gpu-%d", i), Healthy: i != 3})
	}
	out[3].Message = "xid-79: GPU has fallen off the bus"
	return append(out, DeviceHealth{Device: "nic-mlx5-0", Healthy: true})
}

func eightGPUsWant() []dev {
	var out []dev
	for i := range 8 {
		d := dev{fmt.Sprintf("gpu-%d", i), healthy, ""}
		if i == 3 {
			d = dev{"gpu-3", unhealthy, "xid-79: GPU has fallen off the bus"}
		}
		out = append(out, d)
	}
	return append(out, dev{"nic-mlx5-0", healthy, ""})
}

func TestHealthInitialState(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth(eightGPUs())
	s := e.watch(false)
	wantDevs(t, s.next(), healthEpoch, eightGPUsWant()...)
}

func TestHealthSetBeforeStart(t *testing.T) {
	e := newHealthEnv(t)
	e.plugin.SetHealth([]DeviceHealth{{Device: "gpu-0", Healthy: false, Message: "nvml: unknown error"}})
	e.start()
	s := e.watch(false)
	wantDevs(t, s.next(), healthEpoch, dev{"gpu-0", unhealthy, "nvml: unknown error"})
}

// A stream opened before the first SetHealth sends nothing (not an empty
// list, which would make the kubelet drop devices it already knows)
// until there is a state, and the re-send ticker does not either.
func TestHealthStreamBeforeFirstSet(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	s := e.watch(false)
	testutil.WaitFor(t, "the stream to be served", func() bool { return e.plugin.healthStreamCount() == 1 })
	e.clock.Step(HealthResendInterval)
	e.plugin.SetHealth([]DeviceHealth{{Device: "gpu-0", Healthy: true}})
	wantDevs(t, s.next(), healthEpoch.Add(HealthResendInterval), dev{"gpu-0", healthy, ""})
}

func TestHealthChange(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth(eightGPUs())
	s := e.watch(false)
	wantDevs(t, s.next(), healthEpoch, eightGPUsWant()...)

	// The same state again, in another order and later: nothing is sent.
	// The next response is the change below, so nothing came in between;
	// and no stream was even woken (a stream woken by both would coalesce
	// them and hide a duplicate on the wire).
	wake, unsubscribe := e.plugin.subscribeHealth()
	defer unsubscribe()
	gen := e.plugin.currentHealth().gen
	e.clock.Step(time.Second)
	same := eightGPUs()
	slices.Reverse(same)
	e.plugin.SetHealth(same)
	e.plugin.SetHealth(eightGPUs())
	if g := e.plugin.currentHealth().gen; g != gen {
		t.Errorf("an equal state made generation %d of %d", g, gen)
	}
	select {
	case <-wake:
		t.Error("an equal state woke the streams")
	default:
	}

	// gpu-3 recovers, gpu-5 fails: the full list, with the time of the
	// Set that changed it.
	e.clock.Step(time.Second)
	st := eightGPUs()
	st[3] = DeviceHealth{Device: "gpu-3", Healthy: true}
	st[5] = DeviceHealth{Device: "gpu-5", Healthy: false, Message: "ecc: 3 uncorrectable volatile errors"}
	e.plugin.SetHealth(st)
	want := eightGPUsWant()
	want[3] = dev{"gpu-3", healthy, ""}
	want[5] = dev{"gpu-5", unhealthy, "ecc: 3 uncorrectable volatile errors"}
	wantDevs(t, s.next(), healthEpoch.Add(2*time.Second), want...)

	// Only the message changes: sent (the kubelet shows it).
	st[5].Message = "ecc: 4 uncorrectable volatile errors"
	e.plugin.SetHealth(st)
	want[5].message = st[5].Message
	wantDevs(t, s.next(), healthEpoch.Add(2*time.Second), want...)

	// A device gone from the node is left out of the list (the kubelet
	// reads it UNKNOWN once its timeout passes); no devices at all is an
	// empty list.
	e.plugin.SetHealth(st[:8])
	wantDevs(t, s.next(), healthEpoch.Add(2*time.Second), want[:8]...)
	e.plugin.SetHealth(nil)
	wantDevs(t, s.next(), healthEpoch.Add(2*time.Second))
}

// The kubelet reads a device UNKNOWN when it has not been reported within
// its timeout (healthinfo.go getHealthInfo), so an unchanged state is
// re-sent before that, with two re-sends to spare.
func TestHealthResentBeforeKubeletTimeout(t *testing.T) {
	if 3*HealthResendInterval > HealthCheckTimeout {
		t.Fatalf("re-send interval %s leaves no margin under the kubelet's timeout %s", HealthResendInterval, HealthCheckTimeout)
	}
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth(eightGPUs())
	s := e.watch(false)
	wantDevs(t, s.next(), healthEpoch, eightGPUsWant()...)

	// Not yet due: nothing; the next response is the re-send.
	e.clock.Step(HealthResendInterval - time.Second)
	e.clock.Step(time.Second)
	wantDevs(t, s.next(), healthEpoch, eightGPUsWant()...)
	// Re-sends carry the time of the last SetHealth, also an equal one.
	e.plugin.SetHealth(eightGPUs())
	e.clock.Step(HealthResendInterval)
	wantDevs(t, s.next(), healthEpoch.Add(HealthResendInterval), eightGPUsWant()...)
}

func TestHealthTwoStreams(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth(eightGPUs())
	a, b := e.watch(false), e.watch(false)
	for _, s := range []*healthStream{a, b} {
		wantDevs(t, s.next(), healthEpoch, eightGPUsWant()...)
	}
	if n := e.plugin.healthStreamCount(); n != 2 {
		t.Errorf("%d streams served, want 2", n)
	}
	st := eightGPUs()
	st[0].Healthy, st[0].Message = false, "nvlink: link 3 down"
	e.plugin.SetHealth(st)
	want := eightGPUsWant()
	want[0] = dev{"gpu-0", unhealthy, "nvlink: link 3 down"}
	for _, s := range []*healthStream{a, b} {
		wantDevs(t, s.next(), healthEpoch, want...)
	}

	// The kubelet drops one stream: its goroutine ends, the other stream
	// goes on.
	a.cancel()
	testutil.WaitFor(t, "the cancelled stream's handler to end", func() bool { return e.plugin.healthStreamCount() == 1 })
	e.plugin.SetHealth(eightGPUs())
	wantDevs(t, b.next(), healthEpoch, eightGPUsWant()...)
}

// A kubelet that never reads must not hold up SetHealth nor the other
// streams; once it reads it gets the latest state, not every state.
func TestHealthSlowStreamDoesNotBlock(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	// Each state is ~200 KB. The slow client's flow-control window is
	// fixed at gRPC's minimum, 64 KB (setting it turns off the dynamic
	// window), so its handler blocks in Send on the first or second state.
	const states, devices = 20, 200
	state := func(i int) []DeviceHealth {
		var out []DeviceHealth
		for d := range devices {
			out = append(out, DeviceHealth{Device: fmt.Sprintf("gpu-%03d", d), Message: fmt.Sprintf("state %02d %s", i, strings.Repeat("x", 1000))})
		}
		return out
	}
	stateOf := func(r *drahealth.NodeWatchResourcesResponse) int {
		var i int
		if _, err := fmt.Sscanf(r.Devices[0].Message, "state %02d", &i); err != nil {
			t.Fatalf("response without a state: %v", err)
		}
		return i
	}
	e.plugin.SetHealth(state(0))
	slow := e.watch(true, grpc.WithInitialWindowSize(64*1024), grpc.WithInitialConnWindowSize(64*1024))
	fast := e.watch(false)
	if got := stateOf(fast.next()); got != 0 {
		t.Fatalf("fast stream starts with state %d", got)
	}
	testutil.WaitFor(t, "both streams to be served", func() bool { return e.plugin.healthStreamCount() == 2 })

	set := make(chan int)
	go func() {
		defer close(set)
		for i := 1; i < states; i++ {
			e.plugin.SetHealth(state(i))
			set <- i
		}
	}()
	// Each SetHealth returns, and the fast stream sees each state (or a
	// later one) while the slow stream reads nothing.
	for i, seen := 1, 0; i < states; i++ {
		select {
		case <-set:
		case <-time.After(guard):
			t.Fatalf("SetHealth of state %d blocked behind a stream that does not read", i)
		}
		for seen < i {
			seen = stateOf(fast.next())
		}
	}

	slow.read()
	var got []int
	for last := -1; last != states-1; {
		last = stateOf(slow.next())
		got = append(got, last)
	}
	t.Logf("the slow stream got states %v of 0..%d", got, states-1)
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("slow stream got states %v: an older state after a newer one, or one twice", got)
	}
	if len(got) >= states {
		t.Errorf("slow stream got all %d states %v, want only the latest once it reads", states, got)
	}
}

func TestHealthStopEndsStreams(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth(eightGPUs())
	a, b := e.watch(false), e.watch(true) // b never reads: Stop must not wait for it
	wantDevs(t, a.next(), healthEpoch, eightGPUsWant()...)
	testutil.WaitFor(t, "both streams to be served", func() bool { return e.plugin.healthStreamCount() == 2 })

	e.plugin.Stop()
	// Stop ends every stream: WatchHealthStatus returns for each.
	testutil.WaitFor(t, "the health streams to end after Stop", func() bool { return e.plugin.healthStreamCount() == 0 })
	// The kubelet sees the connection go (and opens a new stream 5 s later).
	if err := a.ended(); status.Code(err) != codes.Unavailable {
		t.Errorf("stream ended with %v, want Unavailable", err)
	}
	// b's first response may sit in its client's buffer; after it, the end.
	b.read()
drain:
	for {
		select {
		case <-b.msgs:
		case err := <-b.done:
			if status.Code(err) != codes.Unavailable {
				t.Errorf("unread stream ended with %v, want Unavailable", err)
			}
			break drain
		case <-time.After(guard):
			t.Fatal("unread stream did not end")
		}
	}

	// SetHealth while stopped; a restarted plugin serves the latest state.
	st := eightGPUs()
	st[7].Healthy = false
	e.plugin.SetHealth(st)
	e.start()
	want := eightGPUsWant()
	want[7].health = unhealthy
	wantDevs(t, e.watch(false).next(), healthEpoch, want...)
}

func TestHealthMessage(t *testing.T) {
	long := strings.Repeat("a", 2000)
	// 2-byte characters: the kubelet's cut at byte 1021 would split one.
	wide := strings.Repeat("é", 1000)
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "xid-79: GPU has fallen off the bus", "xid-79: GPU has fallen off the bus"},
		{"exactly 1024 bytes", long[:1024], long[:1024]},
		{"long, cut as the kubelet cuts it", long, long[:1021] + "..."},
		{"multibyte, cut on a character", wide, wide[:1020] + "..."},
		{"invalid UTF-8", "dcgm: \xff\xfe field", "dcgm: \uFFFD field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := healthMessage(c.in)
			if got != c.want {
				t.Errorf("healthMessage = %q (%d bytes), want %q", got, len(got), c.want)
			}
			if len(got) > 1024 || !utf8.ValidString(got) {
				t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
	if w := wide[:1021]; utf8.ValidString(w) {
		t.Fatal("the multibyte case does not test a split character")
	}

	// Through the stream: gRPC refuses to send invalid UTF-8, so without
	// the repair this device would end every stream.
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth([]DeviceHealth{
		{Device: "gpu-0", Healthy: false, Message: "dcgm: \xff\xfe field"},
		{Device: "gpu-1", Healthy: false, Message: long},
		{Device: "gpu-2", Healthy: true},
	})
	wantDevs(t, e.watch(false).next(), healthEpoch,
		dev{"gpu-0", unhealthy, "dcgm: \uFFFD field"}, dev{"gpu-1", unhealthy, long[:1021] + "..."}, dev{"gpu-2", healthy, ""})
}

// Bad entries do not reach the kubelet: a device without a name is
// dropped, a name given twice keeps its last entry.
func TestHealthBadInput(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	e.plugin.SetHealth([]DeviceHealth{
		{Device: "gpu-1", Healthy: true},
		{Device: "", Healthy: false, Message: "lost"},
		{Device: "gpu-0", Healthy: true},
		{Device: "gpu-1", Healthy: false, Message: "xid-48: double-bit ECC error"},
	})
	wantDevs(t, e.watch(false).next(), healthEpoch, dev{"gpu-0", healthy, ""}, dev{"gpu-1", unhealthy, "xid-48: double-bit ECC error"})
}

// TestHealthServedOnDRASocket: both health API versions the library
// serves (v1 for kubelet 1.37, v1alpha1 for kubelets up to 1.36) are
// advertised and answer on the socket GetInfo names.
func TestHealthServedOnDRASocket(t *testing.T) {
	e := newHealthEnv(t)
	e.start()
	reg := registerapi.NewRegistrationClient(dial(t, RegistrationSocket(e.kubeletDir)))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} {
		if !slices.Contains(info.SupportedVersions, s) {
			t.Errorf("GetInfo's supported versions %v lack %s", info.SupportedVersions, s)
		}
	}
	if info.Endpoint != DRASocket(e.kubeletDir) {
		t.Errorf("GetInfo names endpoint %s, want %s", info.Endpoint, DRASocket(e.kubeletDir))
	}
	e.plugin.SetHealth([]DeviceHealth{{Device: "gpu-0", Healthy: true}, {Device: "gpu-1", Healthy: false, Message: "xid-79"}})
	conn := dial(t, DRASocket(e.kubeletDir))
	v1, err := drahealth.NewDRAResourceHealthClient(conn).NodeWatchResources(context.Background(), &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := v1.Recv()
	if err != nil {
		t.Fatalf("v1 NodeWatchResources on %s: %v", DRASocket(e.kubeletDir), err)
	}
	wantDevs(t, r, healthEpoch, dev{"gpu-0", healthy, ""}, dev{"gpu-1", unhealthy, "xid-79"})
	old, err := drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(context.Background(), &drahealthv1alpha1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ra, err := old.Recv()
	if err != nil {
		t.Fatalf("v1alpha1 NodeWatchResources: %v", err)
	}
	if len(ra.Devices) != 2 || ra.Devices[1].Device.DeviceName != "gpu-1" || ra.Devices[1].Health != drahealthv1alpha1.HealthStatus_UNHEALTHY || ra.Devices[1].Message != "xid-79" {
		t.Errorf("v1alpha1 response %v", ra.Devices)
	}
}

package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"

	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
)

// SlicePublisher keeps this node's ResourceSlices of one DRA driver equal
// to the devices it was last given: one pool named after the node, the
// devices cut by dra.Split into slices in order, each slice owned by the
// Node object (so the garbage collector removes them with the Node).
//
// It follows k8s.io/dynamic-resource-allocation v0.36.3's resourceslice
// controller (resourceslicecontroller.go, syncPool) for behaviour, without
// linking it (that would link client-go's clientset; docs/dra.md): an
// informer on this node's slices of the driver (field selectors
// spec.nodeName and spec.driver), slices named by generateName
// "<index as 5+ hex digits>-<driver>-<node>-" and matched to the desired
// slices by that index, the pool generation bumped unless the change is at
// most one update of an existing slice, obsolete slices (older generation,
// unmatched index) deleted with UID and resourceVersion preconditions, and
// a taint's TimeAdded kept as the server set it.
//
// It writes only when a slice's content differs (semantic comparison;
// server-set fields and a server-set taint TimeAdded ignored): at steady
// state it makes no request besides the informer's watch. After a restart
// it adopts the slices it finds, rewriting none that are already right.
// A slice deleted or changed by someone else is written again.
type SlicePublisher struct {
	client kubernetes.Interface
	slices resourcev1client.ResourceSliceInterface
	node   string
	driver string
	log    *slog.Logger

	informer cache.SharedIndexInformer
	writes   *prometheus.CounterVec
	failures *prometheus.CounterVec
	backoff  wait.Backoff

	wake chan struct{}

	mu sync.Mutex
	// desired is the latest Set; version counts Sets, done is the version
	// the last successful reconcile published.
	desired     []resourcev1.Device
	haveDesired bool
	version     uint64
	done        uint64
	// written holds our last write of each slice until the informer
	// delivers it (or a newer version, or its deletion), so a reconcile in
	// between neither creates a slice twice nor updates from stale
	// content; deleted hides the slices we deleted until the informer
	// delivers their deletion.
	written map[string]*resourcev1.ResourceSlice
	deleted map[string]bool

	// Publisher goroutine only.
	ownerUID types.UID
	// dropped records, per slice index, devices the API server stored
	// differently than written (a field it does not know, or a disabled
	// feature's): while we want the same again, the stored form counts as
	// equal, so we do not rewrite it forever (the library's sliceStored).
	dropped map[int]droppedDevices
}

type droppedDevices struct{ want, got []resourcev1.Device }

// SlicePublisherConfig says whose slices a SlicePublisher owns.
type SlicePublisherConfig struct {
	// NodeName is this node: the pool's name, spec.nodeName and the owner.
	NodeName string
	// Driver is the DRA driver name; dra.DriverName when empty.
	Driver string
}

// NewSlicePublisher builds the publisher of cfg.NodeName's slices over
// client; nothing is requested until Run. reg may be nil.
func NewSlicePublisher(client kubernetes.Interface, cfg SlicePublisherConfig, log *slog.Logger, reg prometheus.Registerer) (*SlicePublisher, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("resourceslice publisher: no node name")
	}
	if cfg.Driver == "" {
		cfg.Driver = dra.DriverName
	}
	p := &SlicePublisher{
		client: client, slices: client.ResourceV1().ResourceSlices(), node: cfg.NodeName, driver: cfg.Driver, log: log,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_dra_resourceslice_writes_total",
			Help: "ResourceSlice writes the DRA slice publisher made to the Kubernetes API, by verb (create, update, delete).",
		}, []string{"verb"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_dra_resourceslice_write_failures_total",
			Help: "ResourceSlice writes of the DRA slice publisher the Kubernetes API refused or did not answer, by verb.",
		}, []string{"verb"}),
		backoff: RetryBackoff(),
		wake:    make(chan struct{}, 1),
		written: map[string]*resourcev1.ResourceSlice{},
		deleted: map[string]bool{},
		dropped: map[int]droppedDevices{},
	}
	for _, verb := range []string{"create", "update", "delete"} {
		p.writes.WithLabelValues(verb)
		p.failures.WithLabelValues(verb)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{p.writes, p.failures} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("resourceslice publisher metrics: %w", err)
			}
		}
	}

	selector := fields.Set{
		resourcev1.ResourceSliceSelectorNodeName: p.node,
		resourcev1.ResourceSliceSelectorDriver:   p.driver,
	}.AsSelector().String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return p.slices.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return p.slices.Watch(ctx, o)
		},
	}, client)
	p.informer = cache.NewSharedIndexInformerWithOptions(lw, &resourcev1.ResourceSlice{}, cache.SharedIndexInformerOptions{
		Identifier: (*cache.InformerName)(nil).WithResource(resourcev1.SchemeGroupVersion.WithResource("resourceslices")),
	})
	_, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.delivered(obj, false) },
		UpdateFunc: func(_, obj any) { p.delivered(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p.delivered(obj, true)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("resourceslice informer: %w", err)
	}
	return p, nil
}

// Set makes devs (dra.Build's devices, in order) what the publisher
// publishes. The latest call wins; calls between reconciles coalesce, and
// equal content writes nothing. Set(nil) removes the node's slices. Until
// the first Set the publisher writes nothing, so a starting agent does not
// delete the slices a previous run left before it knows its devices.
func (p *SlicePublisher) Set(devs []resourcev1.Device) {
	cp := make([]resourcev1.Device, len(devs))
	for i := range devs {
		devs[i].DeepCopyInto(&cp[i])
	}
	p.mu.Lock()
	p.desired, p.haveDesired = cp, true
	p.version++
	p.mu.Unlock()
	p.signal()
}

func (p *SlicePublisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// delivered is the informer's event handler: it retires our record of a
// write once the informer has it (or something newer, or its deletion)
// and wakes the publisher, which repairs a slice changed or deleted by
// someone else.
func (p *SlicePublisher) delivered(obj any, gone bool) {
	s, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	p.mu.Lock()
	if w, ok := p.written[s.Name]; ok && (gone || !olderVersion(s.ResourceVersion, w.ResourceVersion)) {
		delete(p.written, s.Name)
	}
	if gone {
		delete(p.deleted, s.Name)
	}
	p.mu.Unlock()
	p.signal()
}

// olderVersion says resourceVersion a is older than b. They are opaque
// to clients, but etcd's are integers, which client-go's mutation cache
// relies on too; anything else counts as not older.
func olderVersion(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}

// Run publishes until ctx ends: it starts the informer, waits for its
// first list, then reconciles after every Set and every change of the
// node's slices, retrying failures with jittered exponential backoff
// (RetryBackoff) and conflicts at once with a short one.
func (p *SlicePublisher) Run(ctx context.Context) {
	go p.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return
	}
	backoff := p.backoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		err := p.reconcile(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = p.backoff
			continue
		}
		d := backoff.Step()
		p.log.Warn("publishing ResourceSlices failed; retrying", "node", p.node, "err", err, "retry", d)
		if !sleep(ctx, d) {
			return
		}
		p.signal()
	}
}

// current is the node's slices of our pool as we know them: the
// informer's cache, with our writes it has not delivered yet in place of
// what it holds, and without the slices we deleted.
func (p *SlicePublisher) current() []*resourcev1.ResourceSlice {
	byName := map[string]*resourcev1.ResourceSlice{}
	// The store is read under p.mu, as stored and delete read it: the
	// informer updates its store before its handler (delivered, which
	// holds p.mu) retires our record of a write, so under the lock every
	// write is in the store or still recorded. Read before the lock, a
	// slice delivered in between would be in neither, and the pool would
	// look half-written (a needless generation bump and a second create).
	p.mu.Lock()
	for _, obj := range p.informer.GetStore().List() {
		if s, ok := obj.(*resourcev1.ResourceSlice); ok {
			byName[s.Name] = s
		}
	}
	for name, w := range p.written {
		if s, ok := byName[name]; !ok || olderVersion(s.ResourceVersion, w.ResourceVersion) {
			byName[name] = w
		}
	}
	for name := range p.deleted {
		delete(byName, name)
	}
	p.mu.Unlock()
	var out []*resourcev1.ResourceSlice
	for _, s := range byName {
		// The field selectors scope the informer; the pool name is not
		// selectable, so it is checked here, as the library does.
		if s.Spec.Pool.Name == p.node {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *resourcev1.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// reconcile makes the API server hold the desired slices once, retrying
// at once (briefly) when a write meets a newer or deleted slice: the
// informer delivers the change and the next attempt compares with it.
func (p *SlicePublisher) reconcile(ctx context.Context) error {
	p.mu.Lock()
	desired, have, version := p.desired, p.haveDesired, p.version
	p.mu.Unlock()
	if !have {
		return nil
	}
	err := retry.OnError(conflictBackoff(), func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsNotFound(err)
	}, func() error { return p.sync(ctx, dra.Split(desired)) })
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.done = max(p.done, version)
	p.mu.Unlock()
	return nil
}

// sync is the library's syncPool for our one pool.
func (p *SlicePublisher) sync(ctx context.Context, want [][]resourcev1.Device) error {
	existing := p.current()

	var generation int64
	for _, s := range existing {
		generation = max(generation, s.Spec.Pool.Generation)
	}
	indexLen := indexLength(len(want))
	matched := map[int]*resourcev1.ResourceSlice{}
	var obsolete []*resourcev1.ResourceSlice
	for _, s := range existing {
		i, ok := decodeIndex(s.Name, indexLen)
		if s.Spec.Pool.Generation < generation || !ok || i >= len(want) || matched[i] != nil {
			obsolete = append(obsolete, s)
			continue
		}
		matched[i] = s
	}

	pool := resourcev1.ResourcePool{Name: p.node, Generation: generation, ResourceSliceCount: int64(len(want))}
	changed := map[int]bool{}
	for i, s := range matched {
		if !apiequality.Semantic.DeepEqual(s.Spec.Pool, pool) || !p.devicesEqual(i, s.Spec.Devices, want[i]) ||
			s.Spec.NodeSelector != nil || s.Spec.AllNodes != nil || s.Spec.SharedCounters != nil ||
			s.Spec.PerDeviceNodeSelection != nil {
			changed[i] = true
		}
	}
	// The library's rule: a change that is at most one update of an
	// existing slice keeps the generation (the scheduler sees either the
	// old or the new slice, both complete); anything else bumps it, so the
	// scheduler ignores a pool seen half-written. A first publish starts
	// at generation 1.
	bumped := false
	if len(matched) < len(want) || len(changed) > 1 || generation == 0 && len(want) > 0 {
		generation++
		bumped = true
	}
	pool.Generation = generation

	// Obsolete slices go first: devices the node no longer has leave even
	// if the new ones cannot be written.
	for _, s := range obsolete {
		if err := p.delete(ctx, s); err != nil {
			return err
		}
	}
	for i := 0; i < len(want); i++ {
		s, ok := matched[i]
		if !ok {
			if err := p.create(ctx, i, indexLen, pool, want[i]); err != nil {
				return err
			}
			continue
		}
		if !changed[i] && !bumped {
			continue
		}
		u := s.DeepCopy()
		u.Spec.Pool = pool
		u.Spec.NodeSelector, u.Spec.AllNodes, u.Spec.SharedCounters, u.Spec.PerDeviceNodeSelection = nil, nil, nil, nil
		u.Spec.Devices = keepTaintTimeAdded(s.Spec.Devices, want[i])
		stored, err := p.slices.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			p.failures.WithLabelValues("update").Inc()
			return fmt.Errorf("update ResourceSlice %s: %w", s.Name, err)
		}
		p.writes.WithLabelValues("update").Inc()
		p.stored(i, want[i], stored)
	}
	return nil
}

func (p *SlicePublisher) create(ctx context.Context, i, indexLen int, pool resourcev1.ResourcePool, devs []resourcev1.Device) error {
	if p.ownerUID == "" {
		// Read once: the owner reference needs the Node's UID, which does
		// not change while the agent runs (the library does the same).
		n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s for the ResourceSlices' owner: %w", p.node, err)
		}
		p.ownerUID = n.UID
	}
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: encodeIndex(i, indexLen) + "-" + p.driver + "-" + p.node + "-",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: p.node, UID: p.ownerUID, Controller: ptr.To(true),
			}},
		},
		Spec: resourcev1.ResourceSliceSpec{Driver: p.driver, Pool: pool, NodeName: ptr.To(p.node), Devices: devs},
	}
	stored, err := p.slices.Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		p.failures.WithLabelValues("create").Inc()
		return fmt.Errorf("create ResourceSlice %d of node %s: %w", i, p.node, err)
	}
	p.writes.WithLabelValues("create").Inc()
	p.stored(i, devs, stored)
	return nil
}

func (p *SlicePublisher) delete(ctx context.Context, s *resourcev1.ResourceSlice) error {
	err := p.slices.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{
		UID: ptr.To(s.UID), ResourceVersion: ptr.To(s.ResourceVersion)}})
	switch {
	case err == nil:
		p.writes.WithLabelValues("delete").Inc()
	case apierrors.IsNotFound(err):
		// Gone already (someone else, or our earlier delete).
	default:
		p.failures.WithLabelValues("delete").Inc()
		return fmt.Errorf("delete ResourceSlice %s: %w", s.Name, err)
	}
	p.mu.Lock()
	delete(p.written, s.Name)
	// The informer may have delivered the deletion already; its handler
	// holds p.mu, so it either ran before this check or runs after it.
	if _, ok, _ := p.informer.GetStore().GetByKey(s.Name); ok {
		p.deleted[s.Name] = true
	}
	p.mu.Unlock()
	return nil
}

// stored records the API server's answer to a write of slice i.
func (p *SlicePublisher) stored(i int, want []resourcev1.Device, s *resourcev1.ResourceSlice) {
	p.mu.Lock()
	// Only if the informer has not delivered this version (or a newer)
	// yet: its store is updated before its handler runs, and the handler
	// (delivered) holds p.mu, so it either ran before this check or will
	// retire the record after it.
	if obj, ok, _ := p.informer.GetStore().GetByKey(s.Name); !ok ||
		olderVersion(obj.(*resourcev1.ResourceSlice).ResourceVersion, s.ResourceVersion) {
		p.written[s.Name] = s
	}
	p.mu.Unlock()
	delete(p.dropped, i)
	if !devicesEqual(s.Spec.Devices, want) {
		p.log.Warn("the API server stored ResourceSlice devices other than written (a field it does not support?); not rewriting them",
			"node", p.node, "slice", s.Name)
		p.dropped[i] = droppedDevices{want: want, got: s.Spec.Devices}
	}
}

// devicesEqual compares slice i's stored devices with the wanted ones,
// taking what the server stored for an earlier, equal want as equal.
func (p *SlicePublisher) devicesEqual(i int, stored, want []resourcev1.Device) bool {
	if d, ok := p.dropped[i]; ok && devicesEqual(d.want, want) && devicesEqual(d.got, stored) {
		return true
	}
	return devicesEqual(stored, want)
}

// devicesEqual is apiequality.Semantic.DeepEqual, except that a taint's
// TimeAdded left unset (the API server sets it) equals any time, and times
// within a second are equal (round trips drop sub-seconds): the library's
// DevicesDeepEqual, which is not used because its package links the
// clientset.
func devicesEqual(a, b []resourcev1.Device) bool { return devicesSemantic.DeepEqual(a, b) }

var devicesSemantic = func() conversion.Equalities {
	e := apiequality.Semantic.Copy()
	if err := e.AddFunc(func(a, b resourcev1.DeviceTaint) bool {
		if a.TimeAdded != nil && b.TimeAdded != nil {
			if d := a.TimeAdded.Sub(b.TimeAdded.Time); d < -time.Second || d > time.Second {
				return false
			}
		}
		return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
	}); err != nil {
		panic(err) // only if the function's signature were wrong
	}
	return e
}()

// keepTaintTimeAdded is want with each taint that has no TimeAdded given
// the one of the same taint (key, value, effect) of the same device in
// stored, so an update does not restart a taint's clock.
func keepTaintTimeAdded(stored, want []resourcev1.Device) []resourcev1.Device {
	out := make([]resourcev1.Device, len(want))
	for i := range want {
		want[i].DeepCopyInto(&out[i])
		j := slices.IndexFunc(stored, func(d resourcev1.Device) bool { return d.Name == want[i].Name })
		if j < 0 {
			continue
		}
		for k := range out[i].Taints {
			t := &out[i].Taints[k]
			if t.TimeAdded != nil {
				continue
			}
			if l := slices.IndexFunc(stored[j].Taints, func(s resourcev1.DeviceTaint) bool {
				return s.Key == t.Key && s.Value == t.Value && s.Effect == t.Effect
			}); l >= 0 {
				t.TimeAdded = stored[j].Taints[l].TimeAdded.DeepCopy()
			}
		}
	}
	return out
}

// minIndexLength is the library's resourceSliceIndexMinLength: slice
// names start with their index as at least 5 hex digits.
const minIndexLength = 5

func indexLength(slices int) int {
	return max(minIndexLength, len(strconv.FormatInt(int64(slices-1), 16)))
}

func encodeIndex(i, length int) string { return fmt.Sprintf("%0*x", length, i) }

// decodeIndex reads the index a slice's name starts with; a name of
// another length or form is no slice of the current layout.
func decodeIndex(name string, length int) (int, bool) {
	if strings.Index(name, "-") != length {
		return 0, false
	}
	i, err := strconv.ParseInt(name[:length], 16, 0)
	return int(i), err == nil
}

// Published says the API server holds the devices of the last Set (the
// reconcile after it succeeded), for callers that wait for a change to
// reach the API server.
func (p *SlicePublisher) Published() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.haveDesired && p.done == p.version
}

package kubeapi

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// MoveAdviceAnnotation is the Node annotation that names the pods whose
// moving elsewhere would free a larger NVLink block on the node
// (topology.AdviseMoves), for operators and deschedulers. Its value is
// compact JSON (MoveAdvice):
//
//	{"blockNow":4,"blockIfMoved":6,"wholeNode":true,"gpus":[2,3,4,5,6,7],
//	 "pods":[{"namespace":"ml","name":"a","priority":0,"ownerKind":"Job","gpus":[2]}]}
//
// The annotation is absent while there is no advice (the node's GPUs are
// all free, or none can be). It is advice only: the agent never evicts a
// pod for it.
const MoveAdviceAnnotation = "gpu-node-agent.io/move-advice"

// MoveAdviceInterval is the least time between two changes of
// MoveAdviceAnnotation the agent writes: advice changes within it (pods
// starting and ending many times a second) coalesce into one write of the
// latest advice when it ends, so pod churn never becomes a PATCH per pod.
// A change after a quiet interval is written at once.
const MoveAdviceInterval = 5 * time.Second

// podLookupTimeout bounds the GET of one pod the advice names.
const podLookupTimeout = 5 * time.Second

// MoveAdvice is MoveAdviceAnnotation's value.
type MoveAdvice struct {
	// BlockNow is the largest free NVLink block now (GPUs).
	BlockNow int `json:"blockNow"`
	// BlockIfMoved is the largest free NVLink block once Pods moved.
	BlockIfMoved int `json:"blockIfMoved"`
	// WholeNode says every GPU of the node that can serve a whole-GPU
	// pod is free once Pods moved.
	WholeNode bool `json:"wholeNode"`
	// GPUs are the indices (nvidia-smi's, ascending) of the GPUs that
	// would be free as one block.
	GPUs []int `json:"gpus"`
	// Pods are the pods to move, by namespace then name.
	Pods []MoveAdvicePod `json:"pods"`
}

// MoveAdvicePod is one pod of a MoveAdvice.
type MoveAdvicePod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Priority is the pod's spec.priority (0 when the API server set
	// none); absent when the pod could not be read.
	Priority *int32 `json:"priority,omitempty"`
	// OwnerKind is the kind of the pod's controller (its ownerReference
	// with controller true: Job, ReplicaSet, StatefulSet, ...; "Node" for
	// a static pod's mirror; "" for a bare pod); absent when the pod
	// could not be read.
	OwnerKind *string `json:"ownerKind,omitempty"`
	// GPUs are the indices of the node's GPUs the pod holds (whole, a
	// replica of one, or a MIG device on one), ascending.
	GPUs []int `json:"gpus"`
}

// adviceInput is one advice as the fragmentation collector computed it.
type adviceInput struct {
	node   *topology.Node
	advice topology.MoveAdvice
	uids   map[string]string
}

// podDetail is what a pod's GET told: its UID (to tell a pod of the same
// name apart), priority and controller kind.
type podDetail struct {
	uid       string
	priority  int32
	ownerKind string
}

// moveAdvisor turns the move advice into MoveAdviceAnnotation's value
// for the labeler: it reads each pod newly in the advice from the API
// server once (priority, owner), keeps that while the pod stays in the
// advice, and hands on a changed value no sooner than interval after the
// one before.
type moveAdvisor struct {
	log      *slog.Logger
	clock    clock.Clock
	interval time.Duration
	// notify tells the labeler that value changed; it must not block.
	notify func()

	input atomic.Pointer[adviceInput]
	kick  chan struct{}
	// value is the annotation's value to keep: nil until the first
	// advice is rendered (the labeler then leaves the annotation as an
	// earlier run left it), "" for none.
	value atomic.Pointer[string]

	// The state below is the run goroutine's.
	// handed says a value was rendered; changed is when value last
	// changed.
	handed  bool
	changed time.Time
	// shape is the last rendered value without pod details: a change of
	// it (not of a detail) is a new advice.
	shape string
	// details are the pods of the last advice read from the API server,
	// by namespace/name.
	details map[string]podDetail
	// missing says a pod of the last value could not be read: the next
	// advice reads it again.
	missing bool

	// rounds counts the advices handled (a round ends after a write, or
	// after deciding there is none to make), so a test can tell the
	// advisor has caught up.
	rounds atomic.Int64
}

func newMoveAdvisor(log *slog.Logger, clk clock.Clock, interval time.Duration, notify func()) *moveAdvisor {
	return &moveAdvisor{log: log, clock: clk, interval: interval, notify: notify,
		kick: make(chan struct{}, 1), details: map[string]podDetail{}}
}

// set takes the latest advice; it never blocks.
func (m *moveAdvisor) set(in adviceInput) {
	m.input.Store(&in)
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// current is the annotation's value and whether it is known yet.
func (m *moveAdvisor) current() (string, bool) {
	v := m.value.Load()
	if v == nil {
		return "", false
	}
	return *v, true
}

// run renders every new advice until ctx ends, reading pods with client.
func (m *moveAdvisor) run(ctx context.Context, client kubernetes.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		}
		if !m.round(ctx, client) {
			return
		}
		m.rounds.Add(1)
	}
}

// round handles the latest advice; false when ctx ended.
func (m *moveAdvisor) round(ctx context.Context, client kubernetes.Interface) bool {
	in := m.input.Load()
	if in == nil {
		return true
	}
	shape := renderAdvice(in, nil)
	if m.handed && shape == m.shape && !m.missing {
		return true // the same advice: nothing to read, nothing to write
	}
	if m.handed {
		if d := m.interval - m.clock.Since(m.changed); d > 0 {
			t := m.clock.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C():
			}
			// The latest advice once the interval is over: those in
			// between are never written.
			in = m.input.Load()
			shape = renderAdvice(in, nil)
		}
	}
	value := renderAdvice(in, m.lookup(ctx, client, in))
	m.shape, m.handed = shape, true
	old := m.value.Load()
	if old != nil && *old == value {
		return true
	}
	if old != nil || value != "" {
		// (The first value after a start, no advice, writes nothing
		// unless an earlier run left an advice: the first real advice
		// need not wait for the interval.)
		m.changed = m.clock.Now()
	}
	m.value.Store(&value)
	m.notify()
	return true
}

// lookup returns the details of in's pods: those of the last advice
// from memory, the others read from the API server now. A pod that cannot
// be read (gone, forbidden, the API server down) has none this time and
// is read again with the next advice; it never holds the advice back.
func (m *moveAdvisor) lookup(ctx context.Context, client kubernetes.Interface, in *adviceInput) map[string]podDetail {
	keep := map[string]podDetail{}
	m.missing = false
	for _, p := range in.advice.Pods {
		key := p.Namespace + "/" + p.Name
		uid := in.uids[key]
		if d, ok := m.details[key]; ok && (uid == "" || d.uid == uid) {
			keep[key] = d
			continue
		}
		d, err := m.get(ctx, client, p.Namespace, p.Name)
		if err != nil {
			m.missing = true
			m.log.Debug("pod of the move advice not read: its priority and owner left out", "pod", key, "err", err)
			continue
		}
		keep[key] = d
	}
	m.details = keep
	return keep
}

// get reads one pod's details.
func (m *moveAdvisor) get(ctx context.Context, client kubernetes.Interface, namespace, name string) (podDetail, error) {
	ctx, cancel := context.WithTimeout(ctx, podLookupTimeout)
	defer cancel()
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return podDetail{}, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	if err != nil {
		return podDetail{}, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return podDetail{uid: string(pod.UID), priority: podPriority(pod), ownerKind: ownerKind(pod)}, nil
}

// podPriority is the pod's priority as the scheduler takes it: 0 when
// the API server set none (no Priority admission).
func podPriority(pod *corev1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// ownerKind is the kind of the pod's controller: its ownerReference with
// controller true; "Node" for a mirror pod (a static pod's, whose
// controller reference the kubelet sets to its Node, or a mirror pod
// without one); "" for a bare pod.
func ownerKind(pod *corev1.Pod) string {
	if ref := metav1.GetControllerOf(pod); ref != nil {
		return ref.Kind
	}
	if pod.Annotations[mirrorPodAnnotation] != "" {
		return "Node"
	}
	return ""
}

// renderAdvice is in's annotation value ("" when it advises nothing),
// with the pods' details where details has them.
func renderAdvice(in *adviceInput, details map[string]podDetail) string {
	if in == nil || in.node == nil || len(in.advice.Pods) == 0 {
		return ""
	}
	gpuOf := map[string]int{} // GPU or MIG UUID → GPU index
	for _, g := range in.node.GPUs {
		gpuOf[g.UUID] = g.Index
		for _, mig := range g.MIG {
			gpuOf[mig.UUID] = g.Index
		}
	}
	v := MoveAdvice{
		BlockNow: in.advice.BlockNow, BlockIfMoved: in.advice.BlockIfMoved, WholeNode: in.advice.WholeNode,
		GPUs: slices.Clone(in.advice.Block),
	}
	if v.GPUs == nil {
		v.GPUs = []int{}
	}
	for _, p := range in.advice.Pods {
		mp := MoveAdvicePod{Namespace: p.Namespace, Name: p.Name, GPUs: []int{}}
		for _, id := range p.Devices {
			base, _, _ := strings.Cut(id, "::")
			if idx, ok := gpuOf[base]; ok && !slices.Contains(mp.GPUs, idx) {
				mp.GPUs = append(mp.GPUs, idx)
			}
		}
		slices.Sort(mp.GPUs)
		if d, ok := details[p.Namespace+"/"+p.Name]; ok {
			prio, kind := d.priority, d.ownerKind
			mp.Priority, mp.OwnerKind = &prio, &kind
		}
		v.Pods = append(v.Pods, mp)
	}
	slices.SortFunc(v.Pods, func(a, b MoveAdvicePod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	// Cannot fail: ints, strings, bools and slices of them.
	b, _ := json.Marshal(v)
	return string(b)
}

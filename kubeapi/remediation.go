package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
)

// ErrNotReady is returned by the RemediationAPI until the node informer
// runs (the API client is built in the background).
var ErrNotReady = errors.New("the Kubernetes API is not reachable yet")

// mirrorPodAnnotation marks a static pod's mirror in the API server.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// RemediationAPI is what the remediation (package remediate) asks of the
// API server, as its Cluster: the pause annotation from the node
// informer's cache, the fleet safeguard's slot shared with the tainter,
// evictions through the Eviction API, the reboot condition and Events.
// NodeObject.Run makes it ready.
type RemediationAPI struct {
	ownPod types.UID
	events *NodeEvents
	log    *slog.Logger

	changes chan struct{}

	mu     sync.Mutex
	client kubernetes.Interface
	watch  *NodeWatch
	reader *nodeReader
	writer *nodeWriter
	slot   *safeguard.Shared
}

// Paused implements remediate.Cluster.
func (a *RemediationAPI) Paused(ctx context.Context) (bool, error) {
	_, w, _, _, err := a.ready()
	if err != nil {
		return false, err
	}
	if err := w.WaitSynced(ctx); err != nil {
		return false, err
	}
	n, err := w.Node()
	if err != nil {
		return false, err
	}
	return n.Annotations[remediate.PauseAnnotation] == "true", nil
}

// AcquireSlot implements remediate.Cluster.
func (a *RemediationAPI) AcquireSlot(ctx context.Context) (bool, string, error) {
	_, _, _, s, err := a.ready()
	if err != nil {
		return false, "", err
	}
	d, err := s.Acquire(ctx, slotUserRemediation)
	if err != nil || d.Held {
		return d.Held, "", err
	}
	return false, refusal(d), nil
}

// refusal says why the safeguard refused d, from what it read.
func refusal(d safeguard.Decision) string {
	switch {
	case d.Limit == 0:
		return "every slot is taken"
	case d.Seen >= d.Limit:
		return fmt.Sprintf("%d of %d slots are taken by other nodes (fleet size %d)", d.Occupied, d.Limit, d.Fleet)
	case d.Seen == 0:
		// A node refused moments ago asks again without a read: it
		// waits for its bucket watch or its next read (docs/fleet.md).
		return fmt.Sprintf("no slot of %d was free when this node last read them; it reads again shortly (fleet size %d)", d.Limit, d.Fleet)
	default:
		return fmt.Sprintf("%d of the %d slots read (of %d) are taken by other nodes (fleet size %d)", d.Occupied, d.Seen, d.Limit, d.Fleet)
	}
}

// ReleaseSlot implements remediate.Cluster.
func (a *RemediationAPI) ReleaseSlot(ctx context.Context) error {
	_, _, _, s, err := a.ready()
	if err != nil {
		return err
	}
	return s.Release(ctx, slotUserRemediation)
}

// Evict implements remediate.Cluster: it reads the pod first and never
// evicts the agent's own pod, a DaemonSet's pod, a static pod or a pod of
// another node; the eviction carries the pod's UID as a precondition.
func (a *RemediationAPI) Evict(ctx context.Context, namespace, name, uid string, grace *time.Duration) error {
	c, _, _, _, err := a.ready()
	if err != nil {
		return err
	}
	pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if uid != "" && string(pod.UID) != uid {
		return nil // the pod that held the GPU is gone; one of the same name is another
	}
	if why := unevictable(pod, a.ownPod, a.watchName()); why != "" {
		return fmt.Errorf("%w: %s", remediate.ErrNotEvictable, why)
	}
	uidPre := pod.UID
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uidPre}}}
	if grace != nil {
		s := int64(grace.Seconds())
		ev.DeleteOptions.GracePeriodSeconds = &s
	}
	err = c.PolicyV1().Evictions(namespace).Evict(ctx, ev)
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsTooManyRequests(err):
		return fmt.Errorf("%w: %v", remediate.ErrDisruptionBudget, err)
	}
	return fmt.Errorf("evict pod %s/%s: %w", namespace, name, err)
}

// unevictable says why pod is one the agent never evicts ("" when it may).
func unevictable(pod *corev1.Pod, own types.UID, node string) string {
	switch {
	case own != "" && pod.UID == own:
		return "it is the agent's own pod"
	case pod.Annotations[mirrorPodAnnotation] != "":
		return "it is a static pod"
	case pod.Spec.NodeName != node:
		return "it runs on node " + pod.Spec.NodeName
	}
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
		return "it is a DaemonSet's pod (" + ref.Name + "), which would come back at once"
	}
	return ""
}

// SetCondition implements remediate.Cluster.
func (a *RemediationAPI) SetCondition(ctx context.Context, typ string, required bool, reason, message string) error {
	_, _, r, _, err := a.ready()
	if err != nil {
		return err
	}
	node, err := r.read(ctx)
	if err != nil {
		return err
	}
	status := corev1.ConditionFalse
	if required {
		status = corev1.ConditionTrue
	} else if findCondition(node, typ) == nil {
		return nil
	}
	patched, _, err := a.writer.setCondition(ctx, node, typ, status, reason, message, time.Time{})
	if patched != nil {
		r.wrote(ctx, patched)
	}
	return err
}

// Event implements remediate.Cluster.
func (a *RemediationAPI) Event(eventType, reason, message string) {
	a.events.Event(eventType, reason, message)
}

// Changes implements remediate.Cluster.
func (a *RemediationAPI) Changes() <-chan struct{} { return a.changes }

func (a *RemediationAPI) ready() (kubernetes.Interface, *NodeWatch, *nodeReader, *safeguard.Shared, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.watch == nil {
		return nil, nil, nil, nil, ErrNotReady
	}
	return a.client, a.watch, a.reader, a.slot, nil
}

func (a *RemediationAPI) watchName() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.watch.Name()
}

// start makes the API ready on the running informer and forwards its
// change signals until ctx ends.
func (a *RemediationAPI) start(ctx context.Context, c kubernetes.Interface, watch *NodeWatch, slot *safeguard.Shared, writes *prometheus.CounterVec, eventNamespace string) {
	a.mu.Lock()
	a.client, a.watch, a.slot = c, watch, slot
	a.reader = newNodeReader(watch, c, a.log)
	a.writer = newNodeWriter(c, watch.Name(), eventNamespace, "gpu-node-agent.io/remediation", false, writes, a.log)
	a.mu.Unlock()
	signal := func() {
		select {
		case a.changes <- struct{}{}:
		default:
		}
	}
	signal()
	sub := watch.Subscribe()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-sub:
				signal()
			}
		}
	}()
}

// Slot users: the taint and remediation share this node's one slot.
const (
	slotUserTaint       = "taint"
	slotUserRemediation = "remediation"
)

package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// The preflight gate's defaults.
const (
	// DefaultPreflightTaintKey is the preflight taint's key (effect
	// NoSchedule, value "pending" or "failed"): the key the kubelet is
	// told to register the node with (--register-with-taints).
	DefaultPreflightTaintKey = "gpu-node-agent.io/preflight"
	// DefaultPreflightCondition is the Node condition that mirrors the
	// preflight: True once it passed.
	DefaultPreflightCondition = "GPUPreflight"
)

// The preflight taint's values and the condition's reasons.
const (
	preflightTaintPending = "pending"
	preflightTaintFailed  = "failed"

	reasonPreflightPending = "PreflightPending"
	reasonPreflightFailed  = "PreflightFailed"
	reasonPreflightPassed  = "PreflightPassed"
)

// PreflightRerunAnnotation is the Node annotation an operator sets to have
// the preflight run again on a node that passed, without a reboot (after
// reseating a cable, say); its value says why. The gate taints the node
// pending with the condition False/PreflightPending naming the request,
// removes the annotation, posts an Event PreflightRerun and has the agent
// run every item as on a new node (NodeObject.PreflightRerun).
const PreflightRerunAnnotation = "gpu-node-agent.io/preflight-rerun"

// PreflightVerdict is the agent's preflight state, mirrored on the Node.
type PreflightVerdict struct {
	// Ran says a preflight finished on this run of the agent (false:
	// pending).
	Ran bool
	// Passed says it passed; it decides alone (Ran is not looked at).
	Passed bool
	// Message is the failed items with their GPUs and links
	// (preflight.Report.Summary), or what is pending; truncated to 1 KiB
	// on the Node.
	Message string
}

// PreflightGateConfig configures the preflight gate (NodeObjectConfig's
// Preflight).
type PreflightGateConfig struct {
	// TaintKey is the preflight taint's key. Default
	// DefaultPreflightTaintKey.
	TaintKey string
	// ConditionType is the Node condition set. Default
	// DefaultPreflightCondition.
	ConditionType string
	// EventNamespace is where the gate's Events are posted, as
	// TaintConfig's. Default "default".
	EventNamespace string
	// DryRun logs the writes only (taint.mode dry-run).
	DryRun bool
	// BootTime is when the host last booted. A pass recorded before it
	// (the condition True since an earlier time) proves nothing of the
	// node as it is now: a reboot follows a GPU or NIC replaced, a driver
	// or firmware upgraded, or the reset an XID asked for. Such a node is
	// gated again, as a new one. Zero: a pass proves the node for good.
	BootTime time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PreflightGateConfig) WithDefaults() PreflightGateConfig {
	if c.TaintKey == "" {
		c.TaintKey = DefaultPreflightTaintKey
	}
	if c.ConditionType == "" {
		c.ConditionType = DefaultPreflightCondition
	}
	if c.EventNamespace == "" {
		c.EventNamespace = "default"
	}
	return c
}

// Validate reports every invalid field of c (after defaults), and a taint
// key or condition type that is also the health tainter's (taint, after
// defaults): each writer replaces everything of its key and type, so the
// two would undo each other.
func (c PreflightGateConfig) Validate(taint TaintConfig) error {
	c, taint = c.WithDefaults(), taint.WithDefaults()
	var errs []error
	for _, msg := range validation.IsQualifiedName(c.TaintKey) {
		errs = append(errs, fmt.Errorf("preflight.taintKey %q: %s", c.TaintKey, msg))
	}
	if c.TaintKey == taint.Key {
		errs = append(errs, fmt.Errorf("preflight.taintKey %q: the health taint's key (taint.key); the preflight taint needs its own", c.TaintKey))
	}
	for _, msg := range validation.IsQualifiedName(c.ConditionType) {
		errs = append(errs, fmt.Errorf("preflight.conditionType %q: %s", c.ConditionType, msg))
	}
	if c.ConditionType == taint.ConditionType {
		errs = append(errs, fmt.Errorf("preflight.conditionType %q: the health condition's type (taint.conditionType); the preflight condition needs its own", c.ConditionType))
	}
	for _, msg := range validation.IsDNS1123Label(c.EventNamespace) {
		errs = append(errs, fmt.Errorf("preflight event namespace %q: %s", c.EventNamespace, msg))
	}
	return errors.Join(errs...)
}

// preflightProven says whether node carries condition typ True since
// boot (any time when boot is zero): a preflight passed on it since the
// host booted, in this run of the agent or an earlier one.
func preflightProven(node *corev1.Node, typ string, boot time.Time) bool {
	c := findCondition(node, typ)
	return c != nil && c.Status == corev1.ConditionTrue && !passedBeforeBoot(c, boot)
}

// passedBeforeBoot says whether condition c's state dates from before
// boot (never when boot is zero). The condition's times are written by
// the agent on this host (nodeWriter.setCondition), on the clock the
// kernel's boot time is read against.
func passedBeforeBoot(c *corev1.NodeCondition, boot time.Time) bool {
	return !boot.IsZero() && c.LastTransitionTime.Time.Before(boot)
}

// preflightGate keeps the preflight taint and condition on the Node in
// step with the agent's preflight verdict. Until a verdict arrives, a node
// not proven (condition not True, or True since before the host booted:
// BootTime) is tainted key=pending:NoSchedule with the condition
// False/PreflightPending, and a proven one is left as it is (a restarted
// agent neither taints it again nor waits for the disruptive items); a
// verdict then decides: not passed, taint pending or failed and
// the condition False/PreflightPending or PreflightFailed with the
// verdict's message; passed, the taint removed and the condition
// True/PreflightPassed. An operator's re-run request
// (PreflightRerunAnnotation) makes the node pending until the next
// verdict, whatever the one held said. An Event (PreflightFailed Warning,
// PreflightPassed Normal) marks a change of the condition's status or
// reason to failed or passed. Like the tainter it compares with the NodeWatch's cache and
// writes only what differs, touches no other taint (the health taint is
// independent of it), and is not under the fleet safeguard: a node not
// yet proven is not capacity. Use it from one goroutine.
type preflightGate struct {
	cfg    PreflightGateConfig
	watch  *NodeWatch
	reader *nodeReader
	w      *nodeWriter
	log    *slog.Logger
	// backoff spaces run's retries while the API server fails.
	backoff wait.Backoff
	// rerun is called once the gate has taken an operator's re-run
	// request (the Node tainted pending, the annotation removed): it
	// drops the verdict the gate holds and has the agent run again. Nil:
	// requests are not taken.
	rerun func()
	// rerunning says a request (the annotation's value rerunRequest) was
	// taken and no verdict has come since: the node stays pending (gate
	// goroutine only).
	rerunning    bool
	rerunRequest string
}

// newPreflightGate returns the gate of the node watch follows; cfg is
// used with its defaults; writes counts its writes.
func newPreflightGate(client kubernetes.Interface, watch *NodeWatch, cfg PreflightGateConfig, writes *prometheus.CounterVec, log *slog.Logger) *preflightGate {
	cfg = cfg.WithDefaults()
	return &preflightGate{
		cfg: cfg, watch: watch, reader: newNodeReader(watch, client, log), log: log, backoff: RetryBackoff(),
		w: newNodeWriter(client, watch.Name(), cfg.EventNamespace, "gpu-node-agent.io/preflight", cfg.DryRun, writes, log),
	}
}

// run reconciles the Node with verdict() (nil until there is one) until
// ctx ends: at start, on every signal of changed (a new verdict), on
// every event of the node informer (our taint removed by someone, or the
// resync: a cache read, no request), and with jittered backoff while the
// API server fails.
func (g *preflightGate) run(ctx context.Context, changed <-chan struct{}, verdict func() *PreflightVerdict) {
	reconcileLoop(ctx, g.backoff, func(ctx context.Context) error { return g.reconcile(ctx, verdict()) },
		func(err error, retry time.Duration) {
			g.log.Warn("updating the node's preflight taint/condition failed; retrying", "node", g.watch.Name(), "err", err, "retry", retry)
		}, changed, g.watch.Subscribe())
}

// gateState is what the gate wants on the Node.
type gateState struct {
	// taint is the taint's value, "" for none.
	taint           string
	status          corev1.ConditionStatus
	reason, message string
}

// want is what the Node should carry for verdict v (nil: none yet); ok
// false leaves the Node as it is.
func (g *preflightGate) want(node *corev1.Node, v *PreflightVerdict) (s gateState, ok bool) {
	msg := func(m, otherwise string) string {
		if m == "" {
			return otherwise
		}
		return m
	}
	passed := findCondition(node, g.cfg.ConditionType)
	if passed != nil && passed.Status != corev1.ConditionTrue {
		passed = nil
	}
	switch {
	case v == nil && passed != nil && !passedBeforeBoot(passed, g.cfg.BootTime):
		return gateState{}, false
	case v == nil && passed != nil:
		return gateState{preflightTaintPending, corev1.ConditionFalse, reasonPreflightPending,
			"the node rebooted since its preflight passed; preflight has not run since"}, true
	case v == nil:
		return gateState{preflightTaintPending, corev1.ConditionFalse, reasonPreflightPending, "preflight has not run yet"}, true
	case v.Passed:
		return gateState{"", corev1.ConditionTrue, reasonPreflightPassed, msg(v.Message, "preflight passed")}, true
	case !v.Ran:
		return gateState{preflightTaintPending, corev1.ConditionFalse, reasonPreflightPending, msg(v.Message, "preflight has not finished yet")}, true
	default:
		return gateState{preflightTaintFailed, corev1.ConditionFalse, reasonPreflightFailed, msg(v.Message, "preflight failed")}, true
	}
}

// taints are the gate's taints for s.
func (g *preflightGate) taints(s gateState) []corev1.Taint {
	if s.taint == "" {
		return nil
	}
	return []corev1.Taint{{Key: g.cfg.TaintKey, Value: s.taint, Effect: corev1.TaintEffectNoSchedule}}
}

// reconcile makes the Node reflect v once: the taint first (so a node
// whose verdict turned is closed before its condition says why, and a
// crash between the two writes never leaves a failed node untainted),
// then the condition, then the Event. Conflicts are retried as the
// tainter's; before returning it waits (briefly) for the informer to
// deliver its writes.
func (g *preflightGate) reconcile(ctx context.Context, v *PreflightVerdict) error {
	var (
		s       gateState
		act     bool
		request string
		taken   bool
	)
	node, written, err := g.w.syncTaints(ctx, g.reader, g.cfg.TaintKey, func(node *corev1.Node) (*corev1.Node, []corev1.Taint, bool, error) {
		request, taken = node.Annotations[PreflightRerunAnnotation]
		taken = taken && g.rerun != nil && !g.cfg.DryRun
		switch {
		case taken:
			// The verdict held is of a run before the request.
			g.rerunning, g.rerunRequest = true, request
		case v != nil:
			g.rerunning = false
		}
		if g.rerunning {
			s, act = gateState{preflightTaintPending, corev1.ConditionFalse, reasonPreflightPending,
				"preflight re-run requested (" + PreflightRerunAnnotation + "=" + g.rerunRequest + "); it has not finished yet"}, true
		} else if s, act = g.want(node, v); !act {
			return nil, nil, false, nil
		}
		return nil, withTaints(node.Spec.Taints, g.cfg.TaintKey, g.taints(s)...), true, nil
	})
	defer func() {
		if written != nil {
			g.reader.wrote(ctx, written)
		}
	}()
	if err != nil || !act {
		return err
	}
	old := findCondition(node, g.cfg.ConditionType)
	patched, wrote, err := g.w.setCondition(ctx, node, g.cfg.ConditionType, s.status, s.reason, s.message, g.cfg.BootTime)
	if err != nil {
		return err
	}
	if patched != nil {
		written, node = patched, patched
	}
	if taken {
		// Tainted and marked pending first: an agent that stops here
		// finds the annotation again, or a node not proven.
		if patched, err = g.takeRerun(ctx, node, request); err != nil {
			return err
		}
		written = patched
	}
	if !wrote || (old != nil && old.Status == s.status && old.Reason == s.reason) {
		return nil
	}
	switch s.reason {
	case reasonPreflightFailed:
		g.w.event(ctx, node, corev1.EventTypeWarning, reasonPreflightFailed, s.message)
	case reasonPreflightPassed:
		g.w.event(ctx, node, corev1.EventTypeNormal, reasonPreflightPassed, s.message)
	}
	return nil
}

// takeRerun removes the re-run annotation of node, which holds request,
// with a JSON patch that first tests it still holds that value (a newer
// request is neither lost nor removed unseen: the patch fails and the
// next reconcile takes it), posts an Event PreflightRerun and calls
// rerun. It returns the patched Node.
func (g *preflightGate) takeRerun(ctx context.Context, node *corev1.Node, request string) (*corev1.Node, error) {
	patched, err := g.w.removeAnnotation(ctx, PreflightRerunAnnotation, request)
	if err != nil {
		g.reader.conflicted(ctx, node.ResourceVersion)
		return nil, err
	}
	g.log.Info("preflight re-run requested; running it again", "node", g.watch.Name(), "request", request)
	g.w.event(ctx, patched, corev1.EventTypeNormal, "PreflightRerun",
		"preflight re-run requested ("+PreflightRerunAnnotation+"="+request+"); the node is tainted pending until it passes")
	g.rerun()
	return patched, nil
}

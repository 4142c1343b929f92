package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/internal/atomicfile"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// ServedFileName is the file in the state directory that records which
// device kinds the agent serves through DRA, so that a restart with a
// changed configuration knows what it is switching from.
const ServedFileName = "dra-served.json"

// servedFile is ServedFileName's content.
type servedFile struct {
	Version int      `json:"version"`
	DRA     []string `json:"dra"`
}

const servedFileVersion = 1

// readServed reads the kinds an earlier run served through DRA: none when
// there is no file (the agent served everything through the device
// plugin before DRA existed). A file that cannot be read is an error:
// guessing could offer a device through both APIs.
func readServed(path string) (map[string]bool, error) {
	out := map[string]bool{}
	if path == "" {
		return out, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var f servedFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s is corrupt (remove it only if no pod on this node holds a device through DRA): %w", path, err)
	}
	if f.Version != servedFileVersion {
		return nil, fmt.Errorf("%s has version %d, this agent reads %d", path, f.Version, servedFileVersion)
	}
	if err := validateKinds(f.DRA); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, k := range f.DRA {
		out[k] = true
	}
	return out, nil
}

// holders lists who holds devices of a kind through one API
// ("pod <uid> container <name>: <device>"); an error means it cannot be
// known, which counts as held.
type holders func(kind string) ([]string, error)

// apiSplit decides, per device kind, which API serves it: one device, one
// API. The configuration says what is wanted; a kind moves only while no
// device of it is held through the API it leaves (a device-plugin
// allocation of a running pod, or a prepared DRA claim). A move is
// refused while one is (logged, an Event on the Node, the
// gpu_node_agent_dra_switch_blocked gauge) and tried again every
// interval, the old API serving meanwhile. A move in a running agent takes
// two steps an interval apart: the kind is first withdrawn from the old
// API (offered by neither), then, if still nobody holds one of its
// devices, offered by the new one; an allocation that raced the
// withdrawal sends it back. At start nothing is offered yet, so a free
// kind moves at once.
type apiSplit struct {
	path       string
	want       map[string]bool
	log        *slog.Logger
	dpHolders  holders
	draHolders holders
	// event posts an Event on the Node; nil without one.
	event   func(eventType, reason, message string)
	changed chan struct{}
	blocked *prometheus.GaugeVec

	mu        sync.Mutex
	dra       map[string]bool
	withdrawn map[string]bool
	refused   map[string]string
}

// newAPISplit starts from prev (readServed) and wants want.
func newAPISplit(path string, prev map[string]bool, want []string, log *slog.Logger, reg prometheus.Registerer) (*apiSplit, error) {
	s := &apiSplit{
		path: path, want: map[string]bool{}, log: log,
		changed: make(chan struct{}, 1),
		blocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_dra_switch_blocked",
			Help: "1 while moving a device kind (gpu, mig, nic) between the device plugin and DRA is refused because a device of it is held through the API it would leave.",
		}, []string{"kind"}),
		dra: maps.Clone(prev), withdrawn: map[string]bool{}, refused: map[string]string{},
	}
	for _, k := range want {
		s.want[k] = true
	}
	for _, k := range allKinds() {
		s.blocked.WithLabelValues(k)
	}
	if reg != nil {
		if err := reg.Register(s.blocked); err != nil {
			return nil, fmt.Errorf("dra switch metrics: %w", err)
		}
	}
	return s, nil
}

// active reports whether DRA serves or should serve any kind.
func (s *apiSplit) active() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.want) > 0 || len(s.dra) > 0
}

// draKinds are the kinds DRA offers now.
func (s *apiSplit) draKinds() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for k := range s.dra {
		if !s.withdrawn[k] {
			out[k] = true
		}
	}
	return out
}

// dpServes reports whether the device plugin offers kind now.
func (s *apiSplit) dpServes(kind string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.dra[kind] && !s.withdrawn[kind]
}

// pending reports whether some kind is not where it is wanted yet.
func (s *apiSplit) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range allKinds() {
		if s.dra[k] != s.want[k] || s.withdrawn[k] {
			return true
		}
	}
	return false
}

// step moves every kind that is not where it is wanted as far as it may;
// initial is the first step at start, before anything is offered.
func (s *apiSplit) step(initial bool) {
	moved := false
	for _, k := range allKinds() {
		s.mu.Lock()
		toDRA, cur, withdrawn := s.want[k], s.dra[k], s.withdrawn[k]
		s.mu.Unlock()
		if cur == toDRA && !withdrawn {
			s.clearRefusal(k)
			continue
		}
		from, to, held := "the device plugin", "DRA", s.dpHolders
		if !toDRA {
			from, to, held = "DRA", "the device plugin", s.draHolders
		}
		who, err := held(k)
		if err != nil {
			who = append(who, "unknown: "+err.Error())
		}
		if len(who) > 0 {
			s.mu.Lock()
			s.withdrawn[k] = false
			s.mu.Unlock()
			if withdrawn {
				moved = true // offered by the old API again
			}
			s.refuse(k, fmt.Sprintf("%s devices stay with %s, not %s as configured, while held through it: %s", k, from, to, summarize(who)))
			continue
		}
		s.mu.Lock()
		if withdrawn || initial {
			s.withdrawn[k] = false
			if toDRA {
				s.dra[k] = true
			} else {
				delete(s.dra, k)
			}
		} else {
			s.withdrawn[k] = true
		}
		done := !s.withdrawn[k]
		s.mu.Unlock()
		moved = true
		s.clearRefusal(k)
		if done {
			s.persist()
			s.log.Info("device kind moved", "kind", k, "from", from, "to", to)
			if s.event != nil && !initial {
				s.event(corev1.EventTypeNormal, "DeviceAPISwitched", fmt.Sprintf("%s devices are now served through %s", k, to))
			}
		} else {
			s.log.Info("device kind withdrawn from its old API before the move", "kind", k, "from", from, "to", to)
		}
	}
	if moved {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// refuse records that kind cannot move; the log line and Event come once
// per refusal, not every retry.
func (s *apiSplit) refuse(kind, why string) {
	s.mu.Lock()
	_, again := s.refused[kind]
	s.refused[kind] = why
	s.mu.Unlock()
	s.blocked.WithLabelValues(kind).Set(1)
	if again {
		s.log.Debug("device kind still cannot move", "kind", kind, "reason", why)
		return
	}
	s.log.Warn("device kind not moved", "kind", kind, "reason", why)
	if s.event != nil {
		s.event(corev1.EventTypeWarning, "DeviceAPISwitchRefused", why+"; retried until they are free")
	}
}

func (s *apiSplit) clearRefusal(kind string) {
	s.mu.Lock()
	_, was := s.refused[kind]
	delete(s.refused, kind)
	s.mu.Unlock()
	if was {
		s.blocked.WithLabelValues(kind).Set(0)
	}
}

// persist records the kinds DRA serves; a failure is logged (the next
// start then moves from the older record, checking holders again).
func (s *apiSplit) persist() {
	if s.path == "" {
		return
	}
	s.mu.Lock()
	f := servedFile{Version: servedFileVersion, DRA: slices.Sorted(maps.Keys(s.dra))}
	s.mu.Unlock()
	if f.DRA == nil {
		f.DRA = []string{}
	}
	b, err := json.Marshal(f)
	if err == nil {
		err = atomicfile.Write(s.path, append(b, '\n'))
	}
	if err != nil {
		s.log.Error("served device kinds not recorded", "file", s.path, "err", err)
	}
}

// run retries pending moves every interval until ctx ends.
func (s *apiSplit) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.pending() {
				s.step(false)
			}
		}
	}
}

// summarize lists at most three holders and how many more.
func summarize(who []string) string {
	if len(who) <= 3 {
		return strings.Join(who, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(who[:3], "; "), len(who)-3)
}

// dpKindOf is the kind of a device-plugin device: every RDMA resource's
// devices are NICs; a GPU resource's ID is a GPU or MIG UUID (a replica
// "<uuid>::<n>" counts as its device), which NVML prefixes "GPU-" and
// "MIG-" (nvml.h, nvmlDeviceGetUUID: "GPU-" or "MIG-" followed by the
// UUID; the pre-R470 "MIG-GPU-<uuid>/<gi>/<ci>" form starts alike).
func dpKindOf(resource, id string) string {
	if strings.HasPrefix(resource, rdma.ResourcePrefix) {
		return dra.TypeNIC
	}
	base, _, _ := strings.Cut(id, "::")
	switch {
	case strings.HasPrefix(base, "MIG-"):
		return dra.TypeMIG
	case strings.HasPrefix(base, "GPU-"):
		return dra.TypeGPU
	}
	return ""
}

// resourceKind is the kind of a device-plugin resource's devices (all of
// one kind: whole GPUs, MIG devices or NICs). An empty resource goes by
// its name: RDMA's are NICs, the mixed strategy's nvidia.com/mig-<profile>
// MIG devices, anything else whole GPUs.
func resourceKind(r plugin.Resource) string {
	for _, d := range r.Devices() {
		if k := dpKindOf(r.Name(), d.ID); k != "" {
			return k
		}
	}
	switch {
	case strings.HasPrefix(r.Name(), rdma.ResourcePrefix):
		return dra.TypeNIC
	case gpu.IsMIGResource(r.Name()):
		return dra.TypeMIG
	}
	return dra.TypeGPU
}

// kubeletHolders lists the device-plugin allocations of kind that the
// kubelet's device-manager checkpoint records for pods it still runs
// (their log directories exist). Entries of deleted pods stay in the
// checkpoint until the kubelet's next allocation, so the running pods
// filter them; without log directories every entry counts.
func kubeletHolders(devicePluginDir, hostRoot string) holders {
	return func(kind string) ([]string, error) {
		entries, err := usage.ReadCheckpoint(usage.CheckpointPath(devicePluginDir))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		running, err := usage.RunningPodUIDs(hostRoot)
		if err != nil {
			running = nil
		}
		var out []string
		for _, e := range entries {
			if running != nil && !running[e.PodUID] {
				continue
			}
			for _, id := range e.DeviceIDs {
				if dpKindOf(e.Resource, id) == kind {
					out = append(out, fmt.Sprintf("pod %s container %s: %s (%s)", e.PodUID, e.Container, id, e.Resource))
				}
			}
		}
		return out, nil
	}
}

// preparedHolders lists the prepared DRA claims holding devices of kind.
func preparedHolders(prep *dra.Preparer) holders {
	return func(kind string) ([]string, error) {
		var out []string
		claims := prep.PreparedDevices()
		for _, claim := range slices.Sorted(maps.Keys(claims)) {
			for _, d := range claims[claim] {
				if dra.TypeOf(d) == kind {
					out = append(out, fmt.Sprintf("claim %s: %s", claim, d))
				}
			}
		}
		return out, nil
	}
}

package usage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// podResourcesMaxMsgSize matches the kubelet's own pod-resources client
// limit; a node with many pods can exceed gRPC's 4 MiB default.
const podResourcesMaxMsgSize = 16 << 20

// PodResourcesTimeout bounds one kubelet pod-resources List call.
const PodResourcesTimeout = 5 * time.Second

// PodResourcesSocketPath is where the kubelet serves the pod-resources API
// under hostRoot (the host's / as mounted in the agent's container).
func PodResourcesSocketPath(hostRoot string) string {
	return filepath.Join(hostRoot, "var/lib/kubelet/pod-resources/kubelet.sock")
}

// errNoSocket is a List with the kubelet's socket absent.
var errNoSocket = errors.New("kubelet pod-resources socket absent")

// Assignment is one container a device is assigned to, through the
// device plugin or through DRA.
type Assignment struct {
	// PodUID is the pod's UID, empty when not known. A device-plugin
	// assignment has it from the device manager's checkpoint (absent when
	// the checkpoint is unreadable or does not hold the assignment yet).
	// The pod-resources API names pods without UIDs and DRA has no such
	// checkpoint, so a DRA assignment has its pod's UID from a checkpoint
	// entry of the same pod, else from the pod's only log directory
	// (<namespace>_<name>_<uid>); none, or two (a pod of the same name
	// deleted and created again, the old directory not yet removed), is
	// unknown.
	PodUID    string
	Pod       string
	Namespace string
	Container string
	// Resource is the extended resource the device was allocated as
	// (e.g. nvidia.com/gpu); for a DRA device, the driver
	// (dra.DriverName).
	Resource string
	// DeviceID is the ID as the kubelet assigned it (a replica keeps its
	// "::<n>"); for a DRA device, the ID its name resolved to (GPU or MIG
	// UUID, RDMA device name), so both kinds are looked up alike.
	DeviceID string
	// Claim is the ResourceClaim (namespace/name) a DRA device was
	// allocated through; empty for a device-plugin assignment.
	Claim string
	// DRADevice is a DRA device's name in this node's pool (gpu-0,
	// gpu-1-mig-1g10gb-9-0, nic-mlx5-0); empty for a device-plugin
	// assignment.
	DRADevice string
	// Pool is the DRA pool the kubelet named the device in (this node's
	// pool, Config.DRAPool); empty for a device-plugin assignment.
	Pool string
}

// Assignments are the devices the kubelet has assigned to its running
// pods' containers, from one pod-resources List: the device plugin's
// (each container's devices) and, when the tracker knows this node's DRA
// pool, our DRA driver's (each container's dynamic resources). The API's
// ListPodResources answers for the pods the kubelet considers active, so
// a pod that is gone is not in it (while its device-manager checkpoint
// entry may linger until the kubelet reuses the device). A nil
// *Assignments is "unknown": the List failed. Immutable once built.
type Assignments struct {
	// byBase holds every assignment by the device's base ID (a
	// replica's "::<n>" cut), in List order.
	byBase map[string][]Assignment
	// ids are the device IDs as the kubelet assigned them (DRA devices:
	// as resolved).
	ids map[string]bool
	// pods are the running pods' namespace/name.
	pods map[string]bool
	// dpDevices says the List names a device-plugin device (of any
	// resource), which only the checkpoint gives a pod UID.
	dpDevices bool
	// unresolved are the DRA devices of our pool the List named that
	// the node does not have, each name once (with the first claim
	// naming it), sorted by name.
	unresolved []draDevice
	// uses are, by device (GPU or MIG UUID), what each holding
	// container's processes used in the cycle (holders.go); set by the
	// tracker before the Assignments are published.
	uses map[string]map[holderKey]*Use
	// listed is when the tracker began the List these come from (zero:
	// not known, as for NewAssignments).
	listed time.Time
}

// Listed is when the List these assignments come from was begun: a
// device given to a pod after it is not in them. Zero when not known.
func (a *Assignments) Listed() time.Time {
	if a == nil {
		return time.Time{}
	}
	return a.listed
}

// WithListed returns a copy of a that says it was listed at t (Listed).
func (a *Assignments) WithListed(t time.Time) *Assignments {
	if a == nil {
		return nil
	}
	c := *a
	c.listed = t
	return &c
}

// Container returns the first container (in the kubelet's List order)
// assigned device id or, for a time-sliced GPU, one of its replicas. A
// shared device has more than one: see Holders.
func (a *Assignments) Container(id string) (Assignment, bool) {
	if a == nil {
		return Assignment{}, false
	}
	l := a.byBase[baseID(id)]
	if len(l) == 0 {
		return Assignment{}, false
	}
	return l[0], true
}

// Of returns every container assigned device id (a whole GPU, a MIG
// device, or any replica of a time-sliced GPU).
func (a *Assignments) Of(id string) []Assignment {
	if a == nil {
		return nil
	}
	return a.byBase[baseID(id)]
}

// Allocated is the set of device IDs the kubelet has assigned, as it
// assigned them (replicas "<uuid>::<n>"; DRA devices by the ID their name
// resolved to). The caller must not modify it.
func (a *Assignments) Allocated() map[string]bool {
	if a == nil {
		return nil
	}
	return a.ids
}

// Holds lists, for the move advice (topology.AdviseMoves), each pod
// holding a device with every device ID it holds as the kubelet assigned
// it (replicas keep their "::<n>"; DRA devices by the ID their name
// resolved to; RDMA devices too, which the advice ignores), each ID once
// and sorted; pods sorted by namespace then name.
func (a *Assignments) Holds() []topology.PodHold {
	if a == nil {
		return nil
	}
	byPod := map[podName]map[string]bool{}
	for _, l := range a.byBase {
		for _, as := range l {
			p := podName{namespace: as.Namespace, name: as.Pod}
			if byPod[p] == nil {
				byPod[p] = map[string]bool{}
			}
			byPod[p][as.DeviceID] = true
		}
	}
	out := make([]topology.PodHold, 0, len(byPod))
	for p, ids := range byPod {
		out = append(out, topology.PodHold{Namespace: p.namespace, Name: p.name, Devices: slices.Sorted(maps.Keys(ids))})
	}
	slices.SortFunc(out, func(x, y topology.PodHold) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	return out
}

// PodUID is the UID of the running pod namespace/name as the assignments
// know it ("" when unknown: see Assignment.PodUID).
func (a *Assignments) PodUID(namespace, name string) string {
	if a == nil {
		return ""
	}
	for _, l := range a.byBase {
		for _, as := range l {
			if as.Namespace == namespace && as.Pod == name && as.PodUID != "" {
				return as.PodUID
			}
		}
	}
	return ""
}

// Pods is the number of running pods the kubelet listed.
func (a *Assignments) Pods() int {
	if a == nil {
		return 0
	}
	return len(a.pods)
}

// baseID is a device ID without a replica suffix: time-sliced plugins
// advertise "<uuid>::<n>" for the replicas of one GPU.
func baseID(id string) string {
	if base, _, ok := strings.Cut(id, "::"); ok {
		return base
	}
	return id
}

// NewAssignments indexes a pod-resources List answer's device-plugin
// devices by device, filling each assignment's pod UID from the
// checkpoint entries (nil: unknown) that hold the same device for the same
// container and resource. A checkpoint entry for a pod the List does not
// have (a terminated pod whose entry the kubelet has not dropped yet) is
// never used. Dynamic resources are ignored (the tracker also counts its
// DRA pool's: see Config.DRAPool).
func NewAssignments(resp *podresourcesv1.ListPodResourcesResponse, checkpoint []CheckpointEntry) *Assignments {
	return newAssignments(resp, checkpoint, nil, nil)
}

// newAssignments is NewAssignments that also counts the devices of our DRA
// driver in devs' pool (nil: none) named in each container's dynamic
// resources as assigned to that container. A DRA device's pod UID is the
// one the checkpoint gives the same pod's device-plugin devices, else the
// only one logUIDs (the pod log directories; nil: unread) has for the pod.
func newAssignments(resp *podresourcesv1.ListPodResourcesResponse, checkpoint []CheckpointEntry, devs *draDevices,
	logUIDs map[podName][]string) *Assignments {
	type key struct{ container, resource, id string }
	uids := map[key]string{}
	for _, e := range checkpoint {
		for _, id := range e.DeviceIDs {
			uids[key{e.Container, e.Resource, id}] = e.PodUID
		}
	}
	a := &Assignments{byBase: map[string][]Assignment{}, ids: map[string]bool{}, pods: map[string]bool{}}
	add := func(as Assignment) {
		a.byBase[baseID(as.DeviceID)] = append(a.byBase[baseID(as.DeviceID)], as)
		a.ids[as.DeviceID] = true
	}
	unresolved := map[string]draDevice{}
	for _, pod := range resp.GetPodResources() {
		a.pods[pod.GetNamespace()+"/"+pod.GetName()] = true
		// The pod's UID as the checkpoint has it (from any of its
		// device-plugin assignments), for its DRA assignments.
		podUID := ""
		for _, ctr := range pod.GetContainers() {
			for _, dev := range ctr.GetDevices() {
				for _, id := range dev.GetDeviceIds() {
					as := Assignment{
						PodUID: uids[key{ctr.GetName(), dev.GetResourceName(), id}],
						Pod:    pod.GetName(), Namespace: pod.GetNamespace(), Container: ctr.GetName(),
						Resource: dev.GetResourceName(), DeviceID: id,
					}
					if podUID == "" {
						podUID = as.PodUID
					}
					a.dpDevices = true
					add(as)
				}
			}
		}
		if devs == nil {
			continue
		}
		if l := logUIDs[podName{namespace: pod.GetNamespace(), name: pod.GetName()}]; podUID == "" && len(l) == 1 {
			podUID = l[0]
		}
		for _, ctr := range pod.GetContainers() {
			for _, d := range devs.of(ctr) {
				if d.id == "" {
					if _, ok := unresolved[d.name]; !ok {
						unresolved[d.name] = d
					}
					continue
				}
				add(Assignment{
					PodUID: podUID, Pod: pod.GetName(), Namespace: pod.GetNamespace(), Container: ctr.GetName(),
					Resource: dra.DriverName, DeviceID: d.id, Claim: d.claim, DRADevice: d.name, Pool: devs.pool,
				})
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(unresolved)) {
		a.unresolved = append(a.unresolved, unresolved[name])
	}
	return a
}

// runningPods lists the namespace/name of every pod in a List answer.
func runningPods(resp *podresourcesv1.ListPodResourcesResponse) []podName {
	out := make([]podName, 0, len(resp.GetPodResources()))
	for _, pod := range resp.GetPodResources() {
		out = append(out, podName{namespace: pod.GetNamespace(), name: pod.GetName()})
	}
	return out
}

// podName is a pod's namespace and name.
type podName struct{ namespace, name string }

func (p podName) String() string { return p.namespace + "/" + p.name }

// podResourcesClient asks the kubelet which containers hold which
// devices. It is used from one goroutine (the tracker's).
type podResourcesClient struct {
	socket string
	log    *slog.Logger
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
	// missing is set while the socket is absent, so its absence is
	// logged once rather than every cycle.
	missing bool
	errors  prometheus.Counter
}

func newPodResourcesClient(socket string, log *slog.Logger) *podResourcesClient {
	return &podResourcesClient{
		socket: socket,
		log:    log,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_pod_resources_errors_total",
			Help: "Failed kubelet pod-resources List calls (pod attribution).",
		}),
	}
}

// list asks the kubelet for its pods' resources. Any failure is returned
// (and counted, except an absent socket); the next cycle tries again.
func (p *podResourcesClient) list(ctx context.Context, timeout time.Duration) (*podresourcesv1.ListPodResourcesResponse, error) {
	if _, err := os.Stat(p.socket); err != nil {
		if !p.missing {
			if errors.Is(err, fs.ErrNotExist) {
				p.log.Info("pod attribution disabled until the kubelet pod-resources socket appears", "socket", p.socket)
			} else {
				p.log.Warn("pod attribution disabled", "socket", p.socket, "err", err)
			}
			p.missing = true
		}
		p.close()
		return nil, fmt.Errorf("%w: %s", errNoSocket, p.socket)
	}
	if p.missing {
		p.log.Info("pod attribution enabled", "socket", p.socket)
		p.missing = false
	}
	if p.conn == nil {
		conn, err := grpc.NewClient("unix://"+p.socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(podResourcesMaxMsgSize)))
		if err != nil {
			return nil, p.fail(fmt.Errorf("dial kubelet pod-resources %s: %w", p.socket, err))
		}
		p.conn, p.client = conn, podresourcesv1.NewPodResourcesListerClient(conn)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, p.fail(fmt.Errorf("list kubelet pod resources: %w", err))
	}
	return resp, nil
}

func (p *podResourcesClient) fail(err error) error {
	p.errors.Inc()
	p.log.Debug("pod attribution failed", "err", err)
	return err
}

// close drops the connection (socket gone, or the tracker stopping); a
// kubelet restart re-creates the socket and the next list redials.
func (p *podResourcesClient) close() {
	if p == nil || p.conn == nil {
		return
	}
	_ = p.conn.Close()
	p.conn, p.client = nil, nil
}

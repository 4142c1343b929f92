package metrics

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResourcesMaxMsgSize matches the kubelet's own pod-resources client
// limit; a node with many pods can exceed gRPC's 4 MiB default.
const podResourcesMaxMsgSize = 16 << 20

// PodResourcesSocketPath is where the kubelet serves the pod-resources API
// under hostRoot (the host's / as mounted in the agent's container).
func PodResourcesSocketPath(hostRoot string) string {
	return filepath.Join(hostRoot, "var/lib/kubelet/pod-resources/kubelet.sock")
}

// owner is the pod, namespace and container a device is allocated to.
type owner struct{ pod, namespace, container string }

// podMap maps device IDs (GPU and MIG UUIDs) to the container holding them.
type podMap map[string]owner

// fill writes the pod, namespace and container labels for id into lv
// (left empty when the device is not allocated or attribution is off).
func (m podMap) fill(id string, lv []string) {
	if o, ok := m[id]; ok {
		lv[0], lv[1], lv[2] = o.pod, o.namespace, o.container
	}
}

// podAttributor asks the kubelet which containers hold which devices.
type podAttributor struct {
	socket string
	log    *slog.Logger
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
	// missing is set while the socket is absent, so its absence is
	// logged once rather than every cycle.
	missing bool
	errors  prometheus.Counter
}

func newPodAttributor(socket string, log *slog.Logger) *podAttributor {
	return &podAttributor{
		socket: socket,
		log:    log,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_pod_resources_errors_total",
			Help: "Failed kubelet pod-resources List calls (pod attribution).",
		}),
	}
}

// refresh lists the kubelet's pod resources. Any failure leaves this cycle
// unattributed (nil map); the next cycle tries again.
func (p *podAttributor) refresh(ctx context.Context, timeout time.Duration) podMap {
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
		return nil
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
			p.fail(fmt.Errorf("dial kubelet pod-resources %s: %w", p.socket, err))
			return nil
		}
		p.conn, p.client = conn, podresourcesv1.NewPodResourcesListerClient(conn)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		p.fail(fmt.Errorf("list kubelet pod resources: %w", err))
		return nil
	}
	return buildPodMap(resp)
}

func (p *podAttributor) fail(err error) {
	p.errors.Inc()
	p.log.Debug("pod attribution failed", "err", err)
}

// close drops the connection (socket gone, or the collector stopping); a
// kubelet restart re-creates the socket and the next refresh redials.
func (p *podAttributor) close() {
	if p == nil || p.conn == nil {
		return
	}
	_ = p.conn.Close()
	p.conn, p.client = nil, nil
}

// buildPodMap indexes a List response by device ID. Replicated IDs
// ("<uuid>::<n>", as time-sliced plugins advertise them) map to the UUID.
func buildPodMap(resp *podresourcesv1.ListPodResourcesResponse) podMap {
	m := podMap{}
	for _, pod := range resp.GetPodResources() {
		for _, ctr := range pod.GetContainers() {
			for _, dev := range ctr.GetDevices() {
				for _, id := range dev.GetDeviceIds() {
					if base, _, ok := strings.Cut(id, "::"); ok {
						id = base
					}
					if _, seen := m[id]; !seen {
						m[id] = owner{pod.GetName(), pod.GetNamespace(), ctr.GetName()}
					}
				}
			}
		}
	}
	return m
}

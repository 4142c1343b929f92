// Package usage says who uses each GPU and MIG device, and whether they
// should: the processes NVML lists on a device (from the NVML owner's
// sampler, never read on a scrape or gRPC path), each process's pod and
// container from its cgroup under the host root, and the pod the kubelet
// assigned the device to (the pod-resources API: device-plugin devices,
// with the device manager's checkpoint for pod UIDs, and our DRA driver's
// devices in this node's pool, with the pod log directories for pod
// UIDs). It owns the kubelet pod-resources client the GPU metrics
// label their series from (and hands each cycle's allocations to the
// fragmentation collector, which also computes the move advice and hands
// a changed one to the node object), and the GPU process check: processes of gone
// pods or of the host holding memory on a device no running pod is
// assigned (zombie), memory held with no process at all (leaked), another
// pod's or the host's process on an assigned device (foreign), reported
// as health observations, node Events and metrics once they last a grace
// period, and, when configured, zombie processes killed.
package usage

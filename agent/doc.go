// Package agent is the running agent: it opens every part (health monitor,
// NVML sampler, metrics, device-plugin manager, RDMA, the Node object) on
// the given hardware, keeps the served resources in step with it (the
// reconciler) and runs the parts until its context ends.
package agent

// Package rdma owns RDMA NICs: discovery, selectors, device specs and port
// health. It reads /sys/class/infiniband (via procfs/sysfs) and netlink
// under a configurable host root, turns configured selectors into
// "rdma/<name>" device-plugin resources, and watches port and netdev state.
package rdma

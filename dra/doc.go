// Package dra owns what the agent publishes through Dynamic Resource
// Allocation (resource.k8s.io/v1): the ResourceSlice devices of this node
// (GPUs, static MIG devices and RDMA NICs) built from the same
// topology.Node the device plugin serves, their names and attributes, the
// NVLink islands, and the device taints of unhealthy devices. It is pure:
// it reads the model (and, for the PCIe root, sysfs under the host root)
// and makes no API call; the kubelet plugin that publishes and prepares
// is built on it.
package dra

// Package dra is the agent's Dynamic Resource Allocation driver
// (resource.k8s.io/v1): the ResourceSlice devices of this node (GPUs,
// static MIG devices and RDMA NICs) built from the same topology.Node the
// device plugin serves, their names and attributes, the NVLink islands
// and the device taints of unhealthy devices (pure functions of the
// model); the Preparer (a CDI spec per claim, a checkpoint); and the
// KubeletPlugin that runs them on k8s.io/dynamic-resource-allocation's
// kubeletplugin helper, which serves the kubelet and publishes the slices.
package dra

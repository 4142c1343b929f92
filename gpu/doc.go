// Package gpu is GPU resources: whole GPUs, MIG devices and their
// time-sliced replicas as kubelet resources. It turns the topology model
// into plugin.Resources under a MIG strategy (none, single, mixed) and a
// sharing.timeSlicing section the way NVIDIA's device plugin names and
// numbers them, reads NVIDIA's config file, and builds the Allocate
// responses (env, volume mounts, CDI, device specs) and preferred
// allocations.
package gpu

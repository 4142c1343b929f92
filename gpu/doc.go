// Package gpu is GPU resources: whole GPUs and MIG devices as kubelet
// resources. It turns the topology model into plugin.Resources under a MIG
// strategy (none, single, mixed) the way NVIDIA's device plugin names them,
// and builds the Allocate responses (env, volume mounts, CDI, device specs).
package gpu

package dra

import (
	resourceapi "k8s.io/api/resource/v1"
)

// MaxDevicesPerSlice is how many devices one ResourceSlice of ours holds:
// resource/v1 allows ResourceSliceMaxDevices (128) per slice, but only
// ResourceSliceMaxDevicesWithAdvancedFeatures (64) once any device has a
// taint. Taints come and go with health, and a device moving to another
// slice when one appears would rewrite two slices for one fault, so we
// always split at the lower bound.
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// Split cuts a node's devices into the slices of its pool, in order, each
// at most MaxDevicesPerSlice long. A DGX node (8 GPUs fully in MIG mode
// with 7 devices each, 10 NICs) is 66 devices: two slices. No devices
// is no slice.
func Split(devs []resourceapi.Device) [][]resourceapi.Device {
	var out [][]resourceapi.Device
	for len(devs) > MaxDevicesPerSlice {
		out = append(out, devs[:MaxDevicesPerSlice:MaxDevicesPerSlice])
		devs = devs[MaxDevicesPerSlice:]
	}
	if len(devs) > 0 {
		out = append(out, devs)
	}
	return out
}

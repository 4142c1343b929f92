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
	return chunks(devs, MaxDevicesPerSlice)
}

// chunks cuts s into pieces of at most n, in order; none for an empty s.
func chunks[T any](s []T, n int) [][]T {
	var out [][]T
	for len(s) > n {
		out = append(out, s[:n:n])
		s = s[n:]
	}
	if len(s) > 0 {
		out = append(out, s)
	}
	return out
}

// MaxCounterSetsPerSlice is how many counter sets one ResourceSlice holds
// (resource/v1 ResourceSliceMaxCounterSets). Counter sets go in slices of
// their own: resource/v1 allows a slice Devices or SharedCounters, not
// both.
const MaxCounterSetsPerSlice = resourceapi.ResourceSliceMaxCounterSets

// SplitCounters cuts the node's counter sets (Result.CounterSets) into
// slices of at most MaxCounterSetsPerSlice, in order: one slice for a
// node of up to eight GPUs in MIG mode.
func SplitCounters(sets []resourceapi.CounterSet) [][]resourceapi.CounterSet {
	return chunks(sets, MaxCounterSetsPerSlice)
}

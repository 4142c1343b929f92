// Package health decides whether each device, and the node, is fit for work.
// Checks (one per file) turn NVML events, polled readings and DCGM incidents
// into observations; a per-device state machine with hysteresis turns those
// into health; the tainter mirrors node fitness onto the Node object.
package health

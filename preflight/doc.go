// Package preflight proves a node's GPUs and NICs before it takes work:
// active checks (items) over what NVML (through nvmlowner), sysfs, DCGM's
// diagnostic and an operator's command say, each item switchable and with
// its thresholds, each result pass, fail or skipped with a message naming
// the GPU or port and what was seen against what was expected. It says
// whether the node passed; it does not call the API server (the node API
// package taints and sets the condition from a Report).
package preflight

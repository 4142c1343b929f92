// Package metrics is the agent's Prometheus endpoint: dcgm-exporter
// compatible GPU and MIG metrics rendered from the NVML owner's sampler
// (nvmlowner; this package calls no NVML and nothing here runs on the
// scrape path), labelled with the pods holding the devices (package usage
// asks the kubelet), the agent's own metrics, and the HTTP server that
// serves /metrics, /healthz and /readyz through exporter-toolkit.
package metrics

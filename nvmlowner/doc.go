// Package nvmlowner is the only code that calls NVML. It owns the library's
// lifetime (Init/Shutdown), looks GPUs up by UUID (never by a stale index),
// runs every call on a per-GPU lane bounded by a timeout so one hung GPU
// never delays another, discovers the node's topology (Discoverer), samples each counter once per interval for health
// and metrics alike, keeps the XID event set across unchanged rescans,
// reads what the preflight judges (ReadPreflight), and makes and destroys
// MIG devices on demand (MakeMIG, UnmakeMIG).
package nvmlowner

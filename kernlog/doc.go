// Package kernlog reads the kernel log for GPU faults the NVIDIA drivers
// write there: NVRM Xid lines, NVSwitch SXid lines and "fallen off the bus"
// messages. It reads /dev/kmsg under the host root (a character device, or
// a regular file in the kmsg record format, which it follows as it grows);
// where /dev/kmsg cannot be opened (an unprivileged container's device
// cgroup refuses it), the ring buffer through the syslog(2) system call
// (SYSLOG_ACTION_READ_ALL, polled; CAP_SYSLOG under dmesg_restrict); where
// that is refused too, the host's systemd journal through the host's own
// journalctl. A cursor file in the state dir says where it stopped, so a
// restart neither repeats nor loses records.
//
// It never calls NVML: it keeps reporting while NVML calls hang or the
// library is gone.
package kernlog

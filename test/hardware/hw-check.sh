#!/usr/bin/env bash
# hw-check.sh — the hardware check kit's one script (test/hardware/README.md).
#
# Captures, read-only, what a GPU machine says about itself (nvidia-smi,
# /proc/driver/nvidia, the PCI tree, glibc, sandbox hints) and what the
# prebuilt gpu-node-agent says and serves on it (version, topology dump,
# preflight, NVML census, a run with a fake kubelet and /metrics, one short
# run per device-list strategy), into one capture directory, within a time
# budget (5 minutes by default).
#
# Usage: hw-check.sh --kit DIR --out DIR [--simulate PROFILE] [--sim-bin FILE]
#                    [--sim-smi FILE] [--agent-seconds N] [--budget N]
#
# --sim-smi (with --simulate) names simsmi, which stands in for nvidia-smi
# on the simulated node: a wrapper that runs it goes first on PATH.
#
# Nothing here changes the machine: no MIG mode, reset, clocks, persistence
# mode or CUDA application; the agent runs with a temporary plugin and
# state directory, no API server and no DCGM diagnostic. Every step records
# its output and exit code and the kit goes on: what could not be done is
# one line of unavailable.txt. Exit status: 0 when the capture was written,
# 2 on a bad command line or an unusable --out.

set -u
export LC_ALL=C
PATH=$PATH:/usr/sbin:/sbin

usage() {
	echo "usage: $0 --kit DIR --out DIR [--simulate PROFILE] [--sim-bin FILE] [--sim-smi FILE] [--agent-seconds N] [--budget N]" >&2
	exit 2
}

KIT="" OUT="" SIMULATE="" SIM_BIN="" SIM_SMI="" AGENT_SECONDS=60 BUDGET=300
while (($#)); do
	case $1 in
	--kit) KIT=${2:-} && shift ;;
	--out) OUT=${2:-} && shift ;;
	--simulate) SIMULATE=${2:-} && shift ;;
	--sim-bin) SIM_BIN=${2:-} && shift ;;
	--sim-smi) SIM_SMI=${2:-} && shift ;;
	--agent-seconds) AGENT_SECONDS=${2:-} && shift ;;
	--budget) BUDGET=${2:-} && shift ;;
	-h | --help) usage ;;
	*) echo "$0: unknown argument $1" >&2 && usage ;;
	esac
	shift
done
[[ -n $KIT && -n $OUT ]] || usage
[[ $AGENT_SECONDS =~ ^[0-9]+$ && $BUDGET =~ ^[0-9]+$ ]] || { echo "$0: --agent-seconds and --budget take whole seconds" >&2 && usage; }
[[ -z $SIM_SMI || -n $SIMULATE ]] || { echo "$0: --sim-smi needs --simulate" >&2 && usage; }
if [[ -e $OUT && -n $(ls -A "$OUT" 2>/dev/null) ]]; then
	echo "$0: --out $OUT exists and is not empty" >&2
	exit 2
fi
mkdir -p "$OUT"/{references,agent,run/strategies} || exit 2
KIT=$(cd "$KIT" && pwd) || { echo "$0: --kit $KIT is not a directory" >&2 && exit 2; }
OUT=$(cd "$OUT" && pwd)

# STEP_SECONDS bounds each external command, so a hung driver costs one
# step, not the window.
STEP_SECONDS=30
KITTXT=$OUT/kit.txt
UNAVAIL=$OUT/unavailable.txt
: >"$UNAVAIL"

# now_ms is the wall clock in milliseconds.
now_ms() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		local t=${EPOCHREALTIME/./}
		echo $((t / 1000))
	else
		date +%s%3N
	fi
}
T0=$(now_ms)
elapsed_ms() { echo $(($(now_ms) - T0)); }
# budget_left is what is left of the budget, in whole seconds.
budget_left() { echo $(((BUDGET * 1000 - $(elapsed_ms)) / 1000)); }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# unavail THING WHY: one line of unavailable.txt.
unavail() { printf '%s: %s\n' "$1" "$2" >>"$UNAVAIL"; }
# record NAME RC MS OUTPUT: one step line of kit.txt.
record() { printf 'step %-34s rc=%-4s %8ss  %s\n' "$1" "$2" "$(secs "$3")" "${4#"$OUT"/}" >>"$KITTXT"; }
have() { command -v "$1" >/dev/null 2>&1; }

HAVE_TIMEOUT=0
have timeout && HAVE_TIMEOUT=1
bounded() {
	local s=$1
	shift
	if ((HAVE_TIMEOUT)); then
		timeout -k 5 "$s" "$@"
	else
		"$@"
	fi
}

# why_failed RC STDERR_FILE SECONDS: the reason a command failed.
why_failed() {
	local rc=$1 err=$2 s=$3 first=""
	[[ -s $err ]] && first=$(grep -m1 -v '^[[:space:]]*$' "$err")
	case $rc in
	124 | 137) echo "timed out after ${s}s" && return ;;
	126) echo "cannot execute: ${first:-permission denied}" && return ;;
	127) echo "command not found${first:+: $first}" && return ;;
	esac
	if [[ -s $err ]] && grep -qiE 'NO_PERMISSION|Insufficient Permissions|Permission denied|Operation not permitted' "$err"; then
		echo "NO_PERMISSION (exit $rc): $first"
	elif [[ -s $err ]] && grep -q 'GLIBC_' "$err"; then
		echo "binary needs a newer glibc (exit $rc): $first"
	else
		echo "exit $rc${first:+: $first}"
	fi
}

# step [-d|-q] NAME OUTFILE CMD...: runs CMD bounded by STEP_SECONDS (or
# what is left of the budget), stdout to OUTFILE, stderr to OUTFILE.stderr
# (removed when empty), and records its exit code and time in kit.txt. A
# failure is a line of unavailable.txt, unless -d says that exit codes 1
# and 2 are data (the preflight's 1 is a verdict) or -q that the caller
# judges (STEP_WHY holds the reason). It returns the command's exit code.
STEP_WHY=""
step() {
	local data=0 quiet=0
	case $1 in
	-d) data=1 && shift ;;
	-q) quiet=1 && shift ;;
	esac
	local name=$1 out=$2
	shift 2
	local left s=$STEP_SECONDS
	left=$(budget_left)
	if ((left < 3)); then
		unavail "${out#"$OUT"/}" "skipped: the kit's ${BUDGET}s budget is spent"
		record "$name" skip 0 "$out"
		return 125
	fi
	((s > left)) && s=$left
	local t rc
	t=$(now_ms)
	bounded "$s" "$@" >"$out" 2>"$out.stderr" </dev/null
	rc=$?
	record "$name" "$rc" $(($(now_ms) - t)) "$out"
	STEP_WHY=""
	((rc != 0)) && STEP_WHY=$(why_failed "$rc" "$out.stderr" "$s")
	if ((rc != 0 && quiet == 0 && (data == 0 || rc > 2))); then
		unavail "${out#"$OUT"/}" "$STEP_WHY"
	fi
	[[ -s $out.stderr ]] || rm -f "$out.stderr"
	return "$rc"
}

# Background processes this script started, stopped at exit.
PIDS=()
WORK=""
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	for p in "${PIDS[@]}"; do
		wait "$p" 2>/dev/null
	done
	[[ -n $WORK ]] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# stop_pid PID SECONDS: SIGTERM, then SIGKILL after SECONDS, of a child
# this script started; sets STOP_RC to its exit status and forgets it.
stop_pid() {
	local p=$1 s=$2 i q keep=()
	kill -TERM "$p" 2>/dev/null
	for ((i = 0; i < s * 10; i++)); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
	wait "$p" 2>/dev/null
	STOP_RC=$?
	for q in "${PIDS[@]}"; do
		[[ $q == "$p" ]] || keep+=("$q")
	done
	PIDS=("${keep[@]}")
}

# ---------------------------------------------------------------------
# The kit: binaries and versions.

{
	echo "# hw-check capture: $(date -u +%Y-%m-%dT%H:%M:%SZ 2>/dev/null)"
	if [[ -n $SIMULATE ]]; then echo "mode: simulate $SIMULATE"; else echo "mode: real"; fi
	echo "budget: ${BUDGET}s, agent run: ${AGENT_SECONDS}s, step bound: ${STEP_SECONDS}s"
	echo "host: $(uname -n 2>/dev/null)"
	if [[ -r $KIT/versions.txt ]]; then
		cp "$KIT/versions.txt" "$OUT/kit-versions.txt"
		grep -E '^(kit-built|git-describe|go|agent-needs-glibc|built-on-glibc):' "$KIT/versions.txt" | sed 's/^/kit /'
	fi
} >"$KITTXT"
[[ -r $KIT/versions.txt ]] || unavail "kit-versions.txt" "no versions.txt in the kit $KIT"
((HAVE_TIMEOUT)) || unavail "timeout" "command not found: external commands run unbounded"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hwkit.XXXXXX" 2>/dev/null) || WORK=$(mktemp -d "$OUT/../.hwkit.XXXXXX") || {
	echo "$0: cannot create a work directory" >&2
	exit 2
}

# On a simulated node, nvidia-smi is simsmi answering from the same
# simulated node (--sim-smi): a wrapper first on PATH, for every step.
if [[ -n $SIM_SMI ]]; then
	if [[ -x $SIM_SMI && ! -d $SIM_SMI ]]; then
		SIM_SMI=$(cd "$(dirname "$SIM_SMI")" && pwd)/$(basename "$SIM_SMI")
		mkdir -p "$WORK/smi-bin"
		# shellcheck disable=SC2016 # "$@" is the wrapper's
		printf '#!/usr/bin/env bash\nexec %q --simulate %q "$@"\n' "$SIM_SMI" "$SIMULATE" >"$WORK/smi-bin/nvidia-smi"
		chmod 0755 "$WORK/smi-bin/nvidia-smi"
		PATH=$WORK/smi-bin:$PATH
		echo "nvidia-smi: simsmi $SIM_SMI --simulate $SIMULATE" >>"$KITTXT"
	else
		unavail "nvidia-smi" "--sim-smi $SIM_SMI is not an executable file: no references from a simulated nvidia-smi"
	fi
fi

HWK=$KIT/hwkubelet
HAVE_HWK=0
if [[ -x $HWK ]] && "$HWK" freeport >/dev/null 2>&1; then
	HAVE_HWK=1
else
	unavail "hwkubelet" "$HWK missing or does not run: no fake kubelet, no device-plugin calls"
fi

# unpack NAME: the kit's binary NAME (or NAME.gz, unpacked into WORK);
# prints its path.
unpack() {
	local n=$1
	if [[ -x $KIT/$n ]]; then
		echo "$KIT/$n"
	elif [[ -r $KIT/$n.gz ]]; then
		if have gzip; then
			gzip -dc "$KIT/$n.gz" >"$WORK/$n" && chmod 0755 "$WORK/$n" && echo "$WORK/$n"
		elif ((HAVE_HWK)); then
			"$HWK" gunzip "$KIT/$n.gz" "$WORK/$n" && echo "$WORK/$n"
		fi
	fi
}

if [[ -n $SIMULATE ]]; then
	AGENT=""
	if [[ -n $SIM_BIN ]]; then
		[[ -x $SIM_BIN ]] && AGENT=$SIM_BIN
	else
		AGENT=$(unpack gpu-node-agent-sim)
	fi
	AGENT_NAME=gpu-node-agent-sim
	SIMARGS=(--simulate "$SIMULATE")
else
	AGENT=$(unpack gpu-node-agent)
	AGENT_NAME=gpu-node-agent
	SIMARGS=()
fi
HAVE_AGENT=0
if [[ -z $AGENT ]]; then
	unavail "agent" "no $AGENT_NAME in the kit $KIT${SIM_BIN:+ (--sim-bin $SIM_BIN)}"
else
	HAVE_AGENT=1
	echo "agent: $AGENT_NAME" >>"$KITTXT"
fi

# The agent's configuration for every run: no DCGM diagnostic (it may run
# CUDA work), no operator command, zombie processes only reported.
AGENT_CONFIG=$WORK/agent.yaml
cat >"$AGENT_CONFIG" <<'EOF'
preflight:
  disabledItems: [dcgm-diag, command]
health:
  zombies:
    action: report
EOF
cp "$AGENT_CONFIG" "$OUT/agent/agent-config.yaml"

# ---------------------------------------------------------------------
# references/: what the machine says without the agent.

R=$OUT/references
step uname-a "$R/uname-a.txt" uname -a
step os-release "$R/os-release.txt" cat /etc/os-release
step glibc-ldd "$R/glibc-ldd-version.txt" ldd --version
step glibc-getconf "$R/glibc-getconf.txt" getconf GNU_LIBC_VERSION
step cpuinfo-head "$R/cpuinfo-head.txt" head -n 30 /proc/cpuinfo
step nproc "$R/nproc.txt" nproc
if have free; then
	step free-m "$R/free-m.txt" free -m
else
	unavail "free-m" "command not found; references/meminfo-head.txt instead"
	step meminfo-head "$R/meminfo-head.txt" head -n 20 /proc/meminfo
fi

if have nvidia-smi; then
	step nvidia-smi-q-xml "$R/nvidia-smi-q.xml" nvidia-smi -q -x
	step nvidia-smi-q "$R/nvidia-smi-q.txt" nvidia-smi -q
	step nvidia-smi-topo-m "$R/nvidia-smi-topo-m.txt" nvidia-smi topo -m
	step nvidia-smi-nvlink-s "$R/nvidia-smi-nvlink-s.txt" nvidia-smi nvlink -s
	step nvidia-smi-L "$R/nvidia-smi-L.txt" nvidia-smi -L
else
	for f in nvidia-smi-q.xml nvidia-smi-q.txt nvidia-smi-topo-m.txt nvidia-smi-nvlink-s.txt nvidia-smi-L.txt; do
		unavail "references/$f" "nvidia-smi: command not found"
	done
fi

if [[ -e /proc/driver/nvidia/version ]]; then
	step proc-driver-version "$R/proc-driver-nvidia-version.txt" cat /proc/driver/nvidia/version
	step proc-driver-params "$R/proc-driver-nvidia-params.txt" cat /proc/driver/nvidia/params
else
	unavail "references/proc-driver-nvidia-version.txt" "no /proc/driver/nvidia/version (no NVIDIA driver loaded, or a sandbox that hides it)"
fi
gpus=(/proc/driver/nvidia/gpus/*/information)
if [[ -e ${gpus[0]} ]]; then
	for f in "${gpus[@]}"; do
		# The bus id's colons are left out of file names: not every
		# transfer of the capture keeps them.
		bdf=$(basename "$(dirname "$f")")
		bdf=${bdf//:/_}
		mkdir -p "$R/proc-driver-nvidia-gpus/$bdf"
		step "proc-gpu-$bdf" "$R/proc-driver-nvidia-gpus/$bdf/information" cat "$f"
	done
else
	unavail "references/proc-driver-nvidia-gpus" "no /proc/driver/nvidia/gpus/*/information"
fi

devs=(/dev/nvidia*)
if [[ -e ${devs[0]} ]]; then
	step dev-nvidia-ls "$R/dev-nvidia-ls.txt" ls -l "${devs[@]}"
	[[ -d /dev/nvidia-caps ]] && step dev-nvidia-caps-ls "$R/dev-nvidia-caps-ls.txt" ls -l /dev/nvidia-caps
else
	unavail "references/dev-nvidia-ls.txt" "no /dev/nvidia* device nodes"
fi
if have ldconfig; then
	step libnvidia-ml "$R/ldconfig-nvidia.txt" bash -c 'ldconfig -p | grep -E "libnvidia-ml|libcuda|libdcgm" || echo "(no libnvidia-ml, libcuda or libdcgm in the ldconfig cache)"'
fi

# pci_nvidia: every PCI function of vendor 0x10de, one block each. The
# resolved path is the chain of bridges up to the root port.
# shellcheck disable=SC2317 # run by bash -c, under timeout
pci_nvidia() {
	local d f n=0 v
	for d in /sys/bus/pci/devices/*; do
		[[ $(cat "$d/vendor" 2>/dev/null) == 0x10de ]] || continue
		n=$((n + 1))
		echo "[$(basename "$d")]"
		echo "path=$(readlink -f "$d")"
		for f in vendor device subsystem_vendor subsystem_device class numa_node local_cpulist current_link_speed current_link_width max_link_speed max_link_width driver; do
			if [[ $f == driver ]]; then
				v=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)
			else
				v=$(cat "$d/$f" 2>&1)
			fi
			echo "$f=${v:-<absent>}"
		done
		echo
	done
	((n > 0)) || { echo "no PCI function with vendor 0x10de under /sys/bus/pci/devices" >&2 && return 3; }
}
if [[ -d /sys/bus/pci/devices ]]; then
	export -f pci_nvidia
	step pci-nvidia "$R/pci-nvidia.txt" bash -c pci_nvidia
else
	unavail "references/pci-nvidia.txt" "no PCI tree: /sys/bus/pci/devices is absent (a sandbox?)"
fi

# sandbox: gVisor hides the host kernel: uname says 4.4.0 with a fixed
# version string and dmesg is its own boot story.
if have dmesg; then
	# shellcheck disable=SC2016 # expanded by that bash
	step dmesg-head "$R/dmesg-head.txt" bash -c 'out=$(dmesg) || exit; printf "%s\n" "$out" | head -n 40'
else
	unavail "references/dmesg-head.txt" "dmesg: command not found"
fi
{
	echo "uname -r: $(uname -r 2>&1)"
	echo "uname -v: $(uname -v 2>&1)"
	echo "/proc/version: $(cat /proc/version 2>&1)"
	verdict="no sign of gVisor"
	if grep -qi gvisor "$R/dmesg-head.txt" 2>/dev/null; then
		verdict="gVisor (dmesg)"
	elif [[ $(uname -v 2>/dev/null) == "#1 SMP Sun Jan 10 15:06:54 PST 2016" ]]; then
		verdict="gVisor (uname -v is runsc's fixed string)"
	fi
	echo "sandbox: $verdict"
	echo "--- /proc/self/status (selected)"
	grep -E '^(Name|Uid|Gid|CapEff|CapBnd|NoNewPrivs|Seccomp|Seccomp_filters|Cpus_allowed_list|Mems_allowed_list):' /proc/self/status 2>&1
	echo "--- /proc/1/cgroup"
	head -n 5 /proc/1/cgroup 2>&1
	echo "--- writable by us? (the kit writes none of them)"
	for p in /proc/driver/nvidia /usr/lib/x86_64-linux-gnu /var/lib; do
		[[ -e $p ]] && { [[ -w $p ]] && echo "$p: writable" || echo "$p: read-only for us"; }
	done
} >"$R/sandbox.txt" 2>&1
record sandbox 0 0 "$R/sandbox.txt"

# ---------------------------------------------------------------------
# agent/: the agent's own subcommands.

A=$OUT/agent
if ((HAVE_AGENT)); then
	if ! step agent-version "$A/version.txt" "$AGENT" version; then
		step agent-dash-version "$A/version-flag.txt" "$AGENT" --version
	fi
	if [[ -s $A/version.txt.stderr ]] && grep -q GLIBC_ "$A/version.txt.stderr"; then
		HAVE_AGENT=0
		unavail "agent" "$AGENT_NAME does not run on this glibc: $(head -n1 "$A/version.txt.stderr")"
	fi
fi
if ((HAVE_AGENT)); then
	step agent-topology-dump "$A/topology.json" "$AGENT" topology dump "${SIMARGS[@]}" --log-level info
	step -d agent-preflight "$A/preflight.txt" "$AGENT" preflight "${SIMARGS[@]}" --sim-control-address= --config "$AGENT_CONFIG" --state-dir "$WORK/preflight-state" --node-name "" --log-level info
	echo "$?" >"$A/preflight.rc"
	step -q agent-nvml-census "$A/census.log" "$AGENT" nvml census "${SIMARGS[@]}" -o "$A/census.json" --log-level info
	rc=$?
	if ((rc == 2)) && grep -qs 'unknown command' "$A/census.log.stderr"; then
		unavail "agent/census.json" "this agent has no \"nvml census\" subcommand"
	elif ((rc != 0)); then
		unavail "agent/census.json" "$STEP_WHY"
	fi
	[[ -s $A/census.log ]] || rm -f "$A/census.log"
else
	for f in version.txt topology.json preflight.txt census.json; do
		unavail "agent/$f" "no runnable agent binary"
	done
fi

# ---------------------------------------------------------------------
# run/: the agent serving a fake kubelet.

# http_get URL FILE: prints the HTTP status ("000": no answer).
HAVE_CURL=0
have curl && HAVE_CURL=1
http_get() {
	if ((HAVE_CURL)); then
		curl -sS -m 10 -o "$2" -w '%{http_code}' "$1" 2>>"$2.stderr"
	elif ((HAVE_HWK)); then
		"$HWK" get "$1" "$2" 2>>"$2.stderr"
	else
		echo -n 000
	fi
	[[ -s $2.stderr ]] || rm -f "$2.stderr"
}
((HAVE_CURL || HAVE_HWK)) || unavail "run/metrics" "neither curl nor hwkubelet to GET /metrics"
yn() { (($1)) && echo yes || echo no; }
echo "tools: timeout=$(yn "$HAVE_TIMEOUT") curl=$(yn "$HAVE_CURL") (else hwkubelet get) gzip=$(have gzip && echo yes || echo no) (else hwkubelet gunzip) hwkubelet=$(yn "$HAVE_HWK")" >>"$KITTXT"

# sample LABEL PORT PID: /metrics, /readyz and /healthz, and the agent's
# memory and CPU from /proc, at one point of the run.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
printf 'label\telapsed_s\tvmrss_kb\tvmhwm_kb\tthreads\tutime_ticks\tstime_ticks\tcpu_s\n' >"$OUT/run/resources.tsv"
sample() {
	local label=$1 port=$2 pid=$3 t code ep
	for ep in metrics readyz healthz; do
		t=$(now_ms)
		code=$(http_get "http://127.0.0.1:$port/$ep" "$OUT/run/$ep-$label.txt")
		record "get-$ep-$label" "$code" $(($(now_ms) - t)) "$OUT/run/$ep-$label.txt"
		echo "$code" >"$OUT/run/$ep-$label.code"
	done
	if [[ -r /proc/$pid/status ]]; then
		cp "/proc/$pid/status" "$OUT/run/proc-status-$label.txt" 2>/dev/null
		cp "/proc/$pid/stat" "$OUT/run/proc-stat-$label.txt" 2>/dev/null
		local rss hwm thr ut st
		rss=$(awk '/^VmRSS:/{print $2}' "/proc/$pid/status" 2>/dev/null)
		hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$pid/status" 2>/dev/null)
		thr=$(awk '/^Threads:/{print $2}' "/proc/$pid/status" 2>/dev/null)
		# Fields after the command name, which may hold spaces: utime
		# and stime are fields 14 and 15.
		read -r ut st < <(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{print $12, $13}')
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$(secs "$(elapsed_ms)")" "${rss:-}" "${hwm:-}" "${thr:-}" "${ut:-}" "${st:-}" \
			"$(awk -v u="${ut:-0}" -v s="${st:-0}" -v h="$CLK_TCK" 'BEGIN{printf "%.2f", (u+s)/h}')" >>"$OUT/run/resources.tsv"
	else
		unavail "run/proc-status-$label.txt" "/proc/$pid/status not readable (agent gone?)"
	fi
}

# wait_file FILE SECONDS PID: until FILE exists, PID exits or SECONDS pass.
wait_file() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		[[ -e $1 ]] && return 0
		kill -0 "$3" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

SIMRUN=()
[[ -n $SIMULATE ]] && SIMRUN=(--simulate "$SIMULATE" --sim-control-address "")

# The long run: the default configuration with metrics.
LONG_REGISTERED=0
long_run() {
	local left port dp=$WORK/dp kpid apid t rc
	left=$(budget_left)
	local secs_run=$AGENT_SECONDS
	if ((left < 20)); then
		unavail "run" "skipped: the kit's ${BUDGET}s budget is spent"
		return
	fi
	((secs_run > left - 15)) && secs_run=$((left - 15))
	mkdir -p "$dp"
	port=$("$HWK" freeport)
	t=$(now_ms)
	"$HWK" serve -dir "$dp" -out "$OUT/run/kubelet.json" -wait "${secs_run}s" -settle 3s >/dev/null 2>"$OUT/run/hwkubelet.log" </dev/null &
	kpid=$!
	PIDS+=("$kpid")
	wait_file "$dp/kubelet.sock" 10 "$kpid" || unavail "run/kubelet" "the fake kubelet did not serve kubelet.sock"
	"$AGENT" "${SIMRUN[@]}" --device-plugin-dir "$dp" --metrics-address "127.0.0.1:$port" \
		--state-dir "$WORK/state" --node-name "" --log-level info --config "$AGENT_CONFIG" \
		--exit-after "$((secs_run + 30))s" >"$OUT/run/agent.stdout" 2>"$OUT/run/agent.log" </dev/null &
	apid=$!
	PIDS+=("$apid")
	echo "agent pid $apid, metrics 127.0.0.1:$port, device-plugin dir $dp, ${secs_run}s" >"$OUT/run/run.txt"
	echo "args: ${SIMRUN[*]} --device-plugin-dir $dp --metrics-address 127.0.0.1:$port --state-dir $WORK/state --node-name '' --log-level info --config agent-config.yaml" >>"$OUT/run/run.txt"
	local first=$((secs_run / 2))
	((first > 20)) && first=20
	local i
	for ((i = 0; i < first * 10; i++)); do
		kill -0 "$apid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$apid" 2>/dev/null; then
		sample 1 "$port" "$apid"
	else
		unavail "run/agent" "the agent exited after $(secs $(($(now_ms) - t)))s: $(tail -n1 "$OUT/run/agent.log")"
	fi
	while (($(now_ms) - t < secs_run * 1000)) && kill -0 "$apid" 2>/dev/null; do
		sleep 0.2
	done
	kill -0 "$apid" 2>/dev/null && sample 2 "$port" "$apid"
	# The fake kubelet first, so that its last report shows the plugins
	# still connected.
	stop_pid "$kpid" 5
	rc=$STOP_RC
	record hwkubelet-run "$rc" $(($(now_ms) - t)) "$OUT/run/kubelet.json"
	stop_pid "$apid" 10
	record agent-run "$STOP_RC" $(($(now_ms) - t)) "$OUT/run/agent.log"
	if ((rc == 3)); then
		unavail "run/kubelet.json" "no device plugin registered with the fake kubelet in ${secs_run}s"
	elif ((rc == 0)); then
		LONG_REGISTERED=1
	fi
	[[ -s $OUT/run/agent.stdout ]] || rm -f "$OUT/run/agent.stdout"
	[[ -d $WORK/state ]] && cp -r "$WORK/state" "$OUT/run/state"
}

# strategy_run STRATEGY SPECS: a short run with one device-list strategy,
# with or without device specs, until the fake kubelet has made its calls.
strategy_run() {
	local s=$1 specs=$2 name=$1 dir=$OUT/run/strategies left kpid apid t arc krc i
	[[ $specs == true ]] && name=$s-specs
	left=$(budget_left)
	if ((left < 15)); then
		unavail "run/strategies/$name" "skipped: the kit's ${BUDGET}s budget is spent"
		return
	fi
	local dp=$WORK/dp-$name
	mkdir -p "$dp"
	t=$(now_ms)
	"$HWK" serve -dir "$dp" -out "$dir/$name.json" -wait 20s -settle 2s -exit >/dev/null 2>"$dir/$name.hwkubelet.log" </dev/null &
	kpid=$!
	PIDS+=("$kpid")
	wait_file "$dp/kubelet.sock" 10 "$kpid"
	"$AGENT" "${SIMRUN[@]}" --device-plugin-dir "$dp" --device-list-strategy "$s" --pass-device-specs="$specs" \
		--metrics-address "" --state-dir "$WORK/state-$name" --node-name "" --log-level info --config "$AGENT_CONFIG" \
		--exit-after 60s >/dev/null 2>"$dir/$name.agent.log" </dev/null &
	apid=$!
	PIDS+=("$apid")
	for ((i = 0; i < 400; i++)); do
		kill -0 "$kpid" 2>/dev/null || break
		kill -0 "$apid" 2>/dev/null || break
		sleep 0.1
	done
	stop_pid "$kpid" 5
	krc=$STOP_RC
	stop_pid "$apid" 10
	arc=$STOP_RC
	record "strategy-$name" "agent=$arc,kubelet=$krc" $(($(now_ms) - t)) "$dir/$name.json"
	if ((arc == 2)) && grep -q 'device-list-strategy' "$dir/$name.agent.log"; then
		unavail "run/strategies/$name" "the agent does not support device-list-strategy $s: $(grep -m1 'device-list-strategy' "$dir/$name.agent.log" | sed 's/^[[:space:]]*//')"
	elif ((krc == 3)); then
		unavail "run/strategies/$name" "no device plugin registered (agent exit $arc)"
	elif ((krc != 0)); then
		unavail "run/strategies/$name" "the fake kubelet exited $krc"
	fi
}

if ((HAVE_AGENT && HAVE_HWK)); then
	long_run
	if ((LONG_REGISTERED)); then
		for s in envvar volume-mounts cdi-annotations cdi-cri; do
			for specs in false true; do
				strategy_run "$s" "$specs"
			done
		done
	else
		unavail "run/strategies" "skipped: no device plugin registered in the long run"
	fi
else
	unavail "run" "needs a runnable agent and hwkubelet"
fi
# The DRA kubelet plugin (k8s.io/dynamic-resource-allocation's helper)
# reads each claim from the API server before a prepare; the GPU machine
# has none.
unavail "run/dra-prepare" "the DRA kubelet plugin reads each claim from an API server and there is none here; hw-compare holds the DRA devices (dra.Build of agent/topology.json) against the census instead"

# ---------------------------------------------------------------------
total=$(elapsed_ms)
{
	echo "total $(secs "$total")s of a ${BUDGET}s budget: $( ((total <= BUDGET * 1000)) && echo within || echo OVER) budget"
	echo "unavailable: $(wc -l <"$UNAVAIL") lines"
} >>"$KITTXT"
echo "hw-check: capture in $OUT ($(secs "$total")s, $(wc -l <"$UNAVAIL") unavailable)" >&2
exit 0

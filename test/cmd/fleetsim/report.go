package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// perNodeHour extrapolates n requests by nodes over window to one node
// and one hour.
func perNodeHour(n, nodes int, window time.Duration) float64 {
	if nodes == 0 || window <= 0 {
		return 0
	}
	return float64(n) / float64(nodes) * float64(time.Hour) / float64(window)
}

func isList(k string) bool   { return strings.HasPrefix(k, "LIST") }
func notWatch(k string) bool { return !strings.HasPrefix(k, "WATCH") }

func renderReport(o options, l1 *level1Result, l2 *level2Result) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# fleetsim: gpu-node-agent fleet simulation (kube-apiserver " + cluster.KubeVersion + " + etcd on loopback)\n\n")
	if len(o.apiserverArgs) > 0 {
		w("kube-apiserver flags added to the cluster's: `%s`.\n\n", strings.Join(o.apiserverArgs, " "))
	}
	if l1 != nil {
		w("## Level 1: %d agents' API side in one process\n\n", l1.nodes)
		w("Identity (`-identity=%s`): %s.\n\n", l1.identity, identityText(l1))
		w("Per agent: own rest.Config (user agent `fleetsim/<node>`, QPS 5 / burst 10 as the agent),"+
			" own TLS transport (a Proxy func keeps client-go from sharing one) with a counting RoundTripper, NodeWatch (resync %s) + Tainter"+
			" (maxFraction %g, no nodeSelector as the chart's default: the fleet is every Node, here level 1's; slot Leases in %s, Events in %s) + a fake Health. Limit K = max(1, floor(%g x %d)) = %d.\n\n",
			o.resync, o.maxFraction, l1.leaseNS, l1.eventNS, o.maxFraction, l1.nodes, l1.limit)
		w("Start-up (all informers synced, every Node's condition written): %s; requests: %s;"+
			" answers other than success (429: the API server's in-flight limit, retried by client-go after Retry-After, each try counted above): %s.\n\n",
			fmtDur(l1.startupTime), l1.startup.Describe(func(string) bool { return true }), l1.startup.DescribeAnswers())
		w("Requests refused over the whole run (agents' transports; a refusal is a bug): %d", l1.total.DeniedTotal())
		if l1.total.DeniedTotal() > 0 {
			w(" (%s); first refusals: %q", l1.total.DescribeDenied(), l1.total.Samples)
		}
		w(".\n\n")
		s := l1.steady
		w("### Steady state (%s window, extrapolated)\n\n", s.window)
		w("| source | requests (watches aside) | per node per hour | watch (re)opens | per node per hour | by kind |\n|---|---|---|---|---|---|\n")
		w("| agents' transports | %d | %.3f | %d | %.2f | %s |\n", s.agents.Requests(), perNodeHour(s.agents.Requests(), s.nodes, s.window),
			s.watchesOpened, perNodeHour(s.watchesOpened, s.nodes, s.window), s.agents.Describe(func(string) bool { return true }))
		w("| kube-apiserver apiserver_request_total (non-WATCH, all clients) | %d | %.3f | - | - | %s |\n\n", s.api.Requests(),
			perNodeHour(s.api.Requests(), s.nodes, s.window), s.api.Describe(notWatch))
		w("Bytes received in the window: %s on requests, %s on the open watch streams. Requests refused in the window: %d.\n\n",
			apicount.MiB(s.agents.Bytes), apicount.MiB(s.agents.WatchBytes), s.agents.DeniedTotal())
		w("### Mass fault (%.0f%% of the fleet unfit at one instant) and recovery\n\n", o.faultFraction*100)
		w("\"refused\" counts faulted agents the safeguard kept untainted (no slot); \"denied\" counts requests the API server refused" +
			" (ValidatingAdmissionPolicy, RBAC or authentication), fault / recovery.\n\n")
		w("| rep | faulted | K | tainted at end | max tainted seen | refused | fault to limit | fault settled | fault requests | fault LISTs | fault bytes recv | recovery: untainted | all slots released + conditions True | recovery requests | recovery bytes recv | denied | apiserver requests fault / recovery |\n")
		w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for i, wv := range l1.waves {
			f, r := wv[0], wv[1]
			w("| %d | %d | %d | %d | %d | %d | %s | %s | %d | %d | %s | %s | %s | %d | %s | %d / %d | %d / %d |\n", i+1, f.faulted, f.limit, f.tainted, f.max,
				f.refused, fmtDur(f.toLimit), settledStr(f), f.agents.Requests(), f.agents.Prefixed("LIST"), apicount.MiB(f.agents.Bytes),
				fmtDur(r.untainted), settledStr(r), r.agents.Requests(), apicount.MiB(r.agents.Bytes), f.agents.DeniedTotal(), r.agents.DeniedTotal(),
				f.api.Requests(), r.api.Requests())
		}
		w("\nPer faulting node (each wave's agent traffic divided by the nodes flipped unfit; bytes are response bodies received," +
			" requests and watch streams apart; \"lease watches open\" are the agents' watch streams of slot Leases still open at the end of the wave):\n\n")
		w("| rep | wave | KiB received per faulting node (requests + watches) | requests | watches | requests per faulting node | lease watches open at end | bytes per faulting node by kind |\n")
		w("|---|---|---|---|---|---|---|---|\n")
		for i, wv := range l1.waves {
			for j, name := range []string{"fault", "recovery"} {
				p := wv[j]
				n := float64(max(1, p.faulted))
				w("| %d | %s | %.1f | %.1f | %.1f | %.2f | %d | %s |\n", i+1, name,
					float64(p.agents.Bytes+p.agents.WatchBytes)/1024/n, float64(p.agents.Bytes)/1024/n, float64(p.agents.WatchBytes)/1024/n,
					float64(p.agents.Requests())/n, p.agents.Open["WATCH leases"], p.agents.DescribePerNode(p.faulted))
			}
		}
		w("\nRequests by kind (agents' transports):\n\n")
		for i, wv := range l1.waves {
			w("- rep %d fault: %s\n  - LISTs: %s\n  - bytes received: %s\n  - answers other than success (409: Conflict, or AlreadyExists on a create): %s\n", i+1, wv[0].agents.Describe(notWatch),
				wv[0].agents.Describe(isList), wv[0].agents.DescribeBytes(), wv[0].agents.DescribeAnswers())
			w("- rep %d recovery: %s\n  - answers other than success: %s\n", i+1, wv[1].agents.Describe(notWatch), wv[1].agents.DescribeAnswers())
		}
		w("\n")
	}
	if l2 != nil {
		w("## Level 2: %d real agent processes (`--simulate dgx-h100`)\n\n", l2.procs)
		w("Each: own host root, device-plugin dir (no kubelet), sim control endpoint, admin kubeconfig; config taint.maxFraction %g,"+
			" nodeSelector %s=l2, health.pollInterval 2s, recoveryPeriod 2s. K = %d. Start-up %s; agents' RSS total %.0f MiB (%.0f MiB each).\n"+
			" Fault: POST `%s` to /faults of %d agents at one instant; recovery: DELETE of the same body.\n\n",
			o.maxFraction, fleetLabel, l2.limit, fmtDur(l2.startupTime), l2.rssMiB, l2.rssMiB/float64(max(1, l2.procs)), gpuLost, o.l2Faults)
		w("| rep | faulted | K | tainted at end | max tainted seen | refused | fault to limit | fault settled | apiserver requests (fault) | cleared by | recovery: untainted | all slots released + conditions True | apiserver requests (recovery) |\n")
		w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for i, wv := range l2.waves {
			f, r := wv[0], wv[1]
			w("| %d | %d | %d | %d | %d | %d | %s | %s | %d | %s | %s | %s | %d |\n", i+1, f.faulted, f.limit, f.tainted, f.max, f.refused,
				fmtDur(f.toLimit), settledStr(f), f.api.Requests(), r.recovered, fmtDur(r.untainted), settledStr(r), r.api.Requests())
		}
		w("\nkube-apiserver requests by kind (all clients, non-WATCH):\n\n")
		for i, wv := range l2.waves {
			w("- rep %d fault: %s\n- rep %d recovery: %s\n", i+1, wv[0].api.Describe(notWatch), i+1, wv[1].api.Describe(notWatch))
		}
		w("\n")
	}
	return b.String()
}

// identityText says what the level-1 agents authenticated as.
func identityText(l1 *level1Result) string {
	if l1.identity == identityCert {
		return "every agent uses the admin client certificate (system:masters; no RBAC or admission policy applies to it)"
	}
	return fmt.Sprintf("per node `%s` with a token from the TokenRequest API bound to a Pod on that node (spec.nodeName, no kubelet),"+
		" so it carries the node-name extra %s; no client certificate. The chart's rendered %s are applied"+
		" (RBAC and the ValidatingAdmissionPolicy confine each token to its own Node, its Events, its slot Leases);"+
		" creating the %d Pods and tokens and waiting for the policy took %s, before and outside every measured window",
		l1.user, nodeNameExtra, strings.Join(identityManifests, ", "), l1.nodes, fmtDur(l1.setupTime))
}

func settledStr(p phaseResult) string {
	if !p.complete {
		return "not settled"
	}
	return fmtDur(p.settled)
}

# Alerts: the alerting rules in deploy/prometheus (the Helm chart's
# PrometheusRule carries a copy, deploy/chart/gpu-node-agent/files/, made by
# `make manifests`), checked and unit-tested with Debian's promtool. test/chart
# checks the rest: the chart renders the same groups, every alert has its
# runbook in docs/runbooks and a dashboard panel.

.PHONY: test-alerts

ALERT_RULES      := deploy/prometheus/gpu-node-agent-rules.yaml
ALERT_RULES_COPY := deploy/chart/gpu-node-agent/files/gpu-node-agent-rules.yaml

test-alerts: deps-prometheus ## promtool check rules and promtool test rules (every alert firing and not firing) on deploy/prometheus; the chart's copy up to date
	promtool check rules $(ALERT_RULES)
	promtool test rules deploy/prometheus/tests/*.yaml
	@tail -n +3 $(ALERT_RULES_COPY) | cmp -s - $(ALERT_RULES) || \
		{ echo "$(ALERT_RULES_COPY) is stale: run make manifests"; exit 1; }

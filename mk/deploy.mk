# Deploy: the Helm chart in deploy/chart and the static manifests rendered
# from it with the helm Go library (test/chart, its own module; no helm
# binary). CI runs check-manifests.

.PHONY: manifests check-manifests test-chart

manifests: ## render deploy/manifests from the Helm chart's default values
	cd test/chart && $(GO) run ./cmd/render ../..

check-manifests: ## lint and render the chart, assert its key fields, fail if deploy/manifests is stale
	cd test/chart && $(GO) test -count=1 ./...

test-chart: check-manifests

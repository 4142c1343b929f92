# Deploy: the Helm chart in deploy/chart and the static manifests rendered
# from it with the helm Go library (test/chart, its own module; no helm
# binary). CI runs check-manifests.

.PHONY: manifests check-manifests test-chart lint-manifests

# kubeconform, from the Go module proxy, validates deploy/manifests in strict
# mode (unknown or mistyped fields fail) against the schemas of the
# Kubernetes release the e2e cluster runs. Its usual schemas come from
# GitHub, which is out of reach here, so test/chart/cmd/kubeschema makes them
# from that release's OpenAPI document (k8s.io/kubernetes, also from the
# proxy). kube-linter (golang.stackrox.io/kube-linter) would add policy
# checks, but the proxy refuses every version of it (403); the chart's
# TestLeastPrivilege checks the security context instead. No kind is
# skipped: there are no exemptions. Both are cached under .build/ by version.
KUBECONFORM_VERSION ?= v0.7.0
KUBE_SCHEMA_VERSION ?= v1.37.2
KUBECONFORM         := .build/kubeconform-$(KUBECONFORM_VERSION)/kubeconform
KUBE_SCHEMA_ROOT    := .build/kubeconform-schemas
KUBE_SCHEMAS        := $(KUBE_SCHEMA_ROOT)/$(KUBE_SCHEMA_VERSION)-standalone-strict

$(KUBECONFORM):
	GOBIN=$(abspath $(dir $@)) $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

$(KUBE_SCHEMAS)/daemonset-apps-v1.json: test/chart/cmd/kubeschema/main.go
	cd test/chart && $(GO) run ./cmd/kubeschema -kubernetes $(KUBE_SCHEMA_VERSION) -out $(abspath $(KUBE_SCHEMAS))

lint-manifests: $(KUBECONFORM) $(KUBE_SCHEMAS)/daemonset-apps-v1.json ## validate deploy/manifests with kubeconform against the Kubernetes $(KUBE_SCHEMA_VERSION) schemas
	$(KUBECONFORM) -strict -summary -kubernetes-version $(KUBE_SCHEMA_VERSION:v%=%) \
		-schema-location '$(KUBE_SCHEMA_ROOT)/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json' \
		deploy/manifests

manifests: ## render deploy/manifests from the Helm chart's default values
	cd test/chart && $(GO) run ./cmd/render ../..

check-manifests: ## lint and render the chart, assert its key fields, fail if deploy/manifests is stale; kubeconform them; check deploy/examples
	cd test/chart && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory lint-manifests
	cd test && $(GO) test -count=1 ./examples/...

test-chart: check-manifests

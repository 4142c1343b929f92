# Health: fault -> Monitor.Changes() latency on the simulator and fault ->
# taint latency through a real kube-apiserver (median/p99 over 24
# injections, logged by the tests), and the health + fault-injection unit
# tests.

.PHONY: measure-health test-health

measure-health: kube-bins e2e-deps ## fault injected in sim -> device unhealthy (health), and -> Node tainted on a real kube-apiserver (test/apiserver): median and p99
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 -v -run 'TestSimFaultLatency$$' ./health/ | grep -E 'injections|^(ok|FAIL|---)'
	cd test && KUBE_BIN_DIR=$(KUBE_BIN_DIR) CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -count=1 -v -run 'TestRunFaultToTaintLatency$$' ./apiserver/ | grep -E 'injections|^(ok|FAIL|---)'

test-health: ## health checks, state machine, and the simulator's fault injection
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 ./health/
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 -run 'Fault|NVMLFailure' ./sim/

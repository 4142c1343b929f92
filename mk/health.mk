# Health: fault -> Monitor.Changes() and fault -> taint latency on the
# simulator (median/p99 over 24 injections, logged by the tests), and the
# health + fault-injection unit tests.

.PHONY: measure-health test-health

measure-health: ## fault injected in sim -> device unhealthy / node tainted (fake clientset): median and p99
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 -v -run 'TestSimFaultLatency|TestSimFaultToTaintLatency' ./health/ | grep -E 'injections|^(ok|FAIL|---)'

test-health: ## health checks, state machine, tainter, and the simulator's fault injection
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 ./health/
	CGO_CFLAGS=-Wno-deprecated-declarations $(GO) test -race -count=1 -run 'Fault|NVMLFailure' ./sim/

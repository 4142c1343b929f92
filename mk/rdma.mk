# RDMA: package tests (real netlink in a test network namespace when run
# as root) and the port-down-to-ListAndWatch latency (docs/performance.md).

.PHONY: test-rdma measure-rdma-port-down

test-rdma: deps ## go test -race rdma/ and the simulator's NICs (netlink tests need root)
	$(GO) test -race -count=1 ./rdma/...
	$(GO) test -race -count=1 -run 'NIC|PortState' ./sim

measure-rdma-port-down: deps ## p50/p99 from a simulated port going down to Unhealthy on the running agent's rdma/ib ListAndWatch (20 samples per poll interval)
	$(GO) test -count=1 -run '^$$' -bench PortDownToListAndWatch -benchtime 20x ./agent

# RDMA: package tests (real netlink in a test network namespace when run
# as root) and the port-down-to-watcher latency quoted in issue 7's note.

.PHONY: test-rdma measure-rdma-port-down

test-rdma: deps ## go test -race rdma/ and the simulator's NICs (netlink tests need root)
	$(GO) test -race -count=1 ./rdma/...
	$(GO) test -race -count=1 -run 'NIC|PortState' ./sim

measure-rdma-port-down: deps ## p50/p99 from a simulated port going down to the rdma watcher's callback (20 samples)
	$(GO) test -run '^$$' -bench PortDownToObservation -benchtime 20x ./sim

module github.com/gpu-node-agent/gpu-node-agent/test/gpuallocator

go 1.26.7

require (
	github.com/NVIDIA/go-gpuallocator v0.6.0
	github.com/gpu-node-agent/gpu-node-agent v0.0.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/NVIDIA/go-nvlib v0.12.0 // indirect
	github.com/NVIDIA/go-nvml v0.13.3-1 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

replace github.com/gpu-node-agent/gpu-node-agent => ../..

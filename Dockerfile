# syntax=docker/dockerfile:1
# Build: cgo is required, since go-nvml dlopens libnvidia-ml.so.1 from the
# host driver at run time (the driver is not in the image).
FROM golang:1.26-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/gpu-node-agent ./cmd/gpu-node-agent

# Run: a glibc base, because the host's libnvidia-ml.so.1 (mounted in by
# the NVIDIA container toolkit or a hostPath) is linked against glibc.
FROM gcr.io/distroless/base-debian12
COPY --from=build /out/gpu-node-agent /usr/bin/gpu-node-agent
# Root, on purpose: the kubelet's device-plugin directory
# (/var/lib/kubelet/device-plugins) and its kubelet.sock are root-only, the
# agent must create its sockets there, and NVML opens /dev/nvidiactl and
# /dev/nvidia* which are root-owned on most nodes. The DaemonSet drops every
# capability it does not need instead.
USER 0:0
ENTRYPOINT ["/usr/bin/gpu-node-agent"]

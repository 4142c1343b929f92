# syntax=docker/dockerfile:1
# The base images are build args so a machine with no registry can build
# from local bases (mk/image.mk makes them from Debian packages with
# mmdebstrap and builds this file with buildah: `make image-local`). The
# defaults are the public images users pull.
ARG BUILDER_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/base-debian12

# Build: cgo is required, since go-nvml dlopens libnvidia-ml.so.1 from the
# host driver at run time (the driver is not in the image).
FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# GO_TAGS are extra go build tags; "simulator" builds in the simulated GPU
# node the e2e cluster runs (the production image has none). grpcnotrace is
# always on, as the Makefile's PRODUCT_TAGS (why: there). The
# -gcflags are the Makefile's PRODUCT_GCFLAGS (why: there).
ARG GO_TAGS=""
RUN go build -trimpath -tags "grpcnotrace ${GO_TAGS}" -gcflags "k8s.io/api/...=-l" -ldflags "-s -w -X main.version=${VERSION}" -o /out/gpu-node-agent ./cmd/gpu-node-agent

# Run: a glibc base, because the host's libnvidia-ml.so.1 (mounted in by
# the NVIDIA container toolkit or a hostPath) is linked against glibc.
FROM ${RUNTIME_IMAGE}
COPY --from=build /out/gpu-node-agent /usr/bin/gpu-node-agent
# Root, on purpose: the kubelet's device-plugin directory
# (/var/lib/kubelet/device-plugins) and its kubelet.sock are root-only, the
# agent must create its sockets there, and NVML opens /dev/nvidiactl and
# /dev/nvidia* which are root-owned on most nodes. The DaemonSet drops every
# capability it does not need instead.
USER 0:0
ENTRYPOINT ["/usr/bin/gpu-node-agent"]

# syntax=docker/dockerfile:1
# The warmfleet image: the one static binary (cmd/warmfleet) on distroless,
# for linux/amd64 and linux/arm64 (Grace/GB200 nodes). Build both with
#   docker buildx build --platform linux/amd64,linux/arm64 -t IMAGE --push .
# The build stage runs on the builder's own platform and cross-compiles
# (pure Go, CGO off), so no emulation is needed.
#
# Base images: pin them by digest (image:tag@sha256:...). The digests were
# NOT pinned here: this tree was written offline, where they cannot be
# looked up, and a made-up digest would be worse than none. Pin them with
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/golang:1.26-bookworm
#   skopeo inspect --format '{{.Digest}}' docker://gcr.io/distroless/static-debian12:nonroot
# and pass them as --build-arg GO_IMAGE=...@sha256:... BASE_IMAGE=...@sha256:...
# (or write them into the defaults below).
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -X github.com/warmfleet/warmfleet/internal/cli.version=${VERSION}" \
      -o /out/warmfleet ./cmd/warmfleet

FROM ${BASE_IMAGE}
COPY --from=build /out/warmfleet /usr/local/bin/warmfleet
# distroless's nonroot user: the router needs nothing more. The daemon's
# DaemonSet runs it as root (runAsUser: 0, every capability dropped): it
# owns the node's NVMe cache directory and uses containerd's root-owned
# socket.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/warmfleet"]
CMD ["--help"]

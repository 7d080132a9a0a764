# syntax=docker/dockerfile:1
# The image the warmfleet DaemonSet runs: one static binary on a distroless
# base. Build: docker build -t warmfleet .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/warmfleet/warmfleet/internal/cli.version=${VERSION}" \
      -o /out/warmfleet ./cmd/warmfleet

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/warmfleet /usr/local/bin/warmfleet
# The daemon runs as root: it owns the node's NVMe cache directory and talks
# to containerd's root-owned socket.
ENTRYPOINT ["/usr/local/bin/warmfleet"]
CMD ["daemon", "--data-dir", "/var/lib/warmfleet", "--api", "unix:///run/warmfleet/api.sock"]

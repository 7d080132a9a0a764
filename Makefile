# warmfleet build and test entry points. `make test` is what CI runs.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
VERSITYGW_VERSION := v1.8.0
# helm renders and lints the chart in deploy/helm (its tests skip without it).
HELM_VERSION := v3.22.0
INFERENCE_SIM_VERSION := v0.10.2
# Debian packages the tests run for real: containerd + runc (image cache), a
# registry and skopeo/umoci (test images), rclone (S3 baseline), iproute2
# (network namespaces and tc for the multi-host harness), chromium and its
# driver (the status page's end-to-end test), qemu, Debian's cloud kernel,
# busybox-static and e2fsprogs (integration/vm boots virtual machines on
# ext4 disks and cuts their power).
DEB_PACKAGES := containerd runc docker-registry skopeo umoci rclone iproute2 chromium chromium-driver \
	qemu-system-x86 linux-image-cloud-amd64 busybox-static e2fsprogs
DEB_BINARIES := containerd runc docker-registry skopeo umoci rclone ip tc chromium chromedriver \
	qemu-system-x86_64 busybox mkfs.ext4
TEST_TIMEOUT ?= 25m

.PHONY: all build test deps deb-packages lint vulncheck fmt vet fuzz bench-s3 clean

all: build

# build makes both binaries: bin/warmfleet, the product (daemon, router, CLI),
# and bin/warmfleet-lab (its commands plus demo, bench and llmsim).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/warmfleet ./cmd/warmfleet-lab

# deps installs what the tests need and is missing: Debian packages when
# root (skipped otherwise: the tests that need them skip, except in CI), and
# versitygw, helm and llm-d-inference-sim (an engine simulator that publishes
# vLLM's KV-cache events) into the project-local bin/, each a file target
# made only when it is not there yet.
TOOLS := $(BIN)/versitygw $(BIN)/helm $(BIN)/llm-d-inference-sim

deps: deb-packages $(TOOLS)

deb-packages:
	@missing=""; for b in $(DEB_BINARIES); do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	compgen -G '/boot/vmlinuz-*-cloud-amd64' >/dev/null || missing="$$missing cloud-kernel"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing Debian packages (missing:$$missing)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PACKAGES) >/dev/null; \
		else \
			echo "not root: cannot install$$missing; tests that need them will skip"; \
		fi; \
	fi

$(BIN)/versitygw:
	@echo "installing versitygw $(VERSITYGW_VERSION) into $(BIN)"
	GOBIN=$(BIN) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

$(BIN)/helm:
	@echo "installing helm $(HELM_VERSION) into $(BIN)"
	GOBIN=$(BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# The simulator is built in a scratch module: `go install pkg@version` asks
# the proxy for the module's version list, which it refuses for this module.
$(BIN)/llm-d-inference-sim:
	@echo "installing llm-d-inference-sim $(INFERENCE_SIM_VERSION) into $(BIN)"
	tmp=$$(mktemp -d) && cd $$tmp && $(GO) mod init sim >/dev/null 2>&1 && \
	$(GO) get github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim@$(INFERENCE_SIM_VERSION) && \
	CGO_ENABLED=0 $(GO) build -o $@ github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim && \
	cd / && rm -rf $$tmp

# test runs every test with the race detector. The tests start the real
# services they use themselves (versitygw S3 servers, containerd daemons, a
# registry, network namespaces) and stop them when they end.
# In CI (CI=true) it then fuzzes every target for CI_FUZZTIME each: a
# count of inputs, not a time, because Go's fuzzer counts the run of the
# seed corpus against a time budget and fails a target whose seeds take
# longer than it ("context deadline exceeded") on a loaded machine.
CI_FUZZTIME ?= 2000x
# VM_CUTS is the number of power cuts integration/vm makes (each a reboot
# of a software-emulated VM restored from a saved state; WARMFLEET_VM_CUTS
# in the environment counts too): make test VM_CUTS=2 for a quicker run.
VM_CUTS ?= $(or $(WARMFLEET_VM_CUTS),20)
# VM_IMAGE_CUTS is the number of power cuts in image pulls, in a second VM
# that also runs containerd (later cuts cost more, as each reboot's audit
# hashes every image pulled so far; 0 skips them): make test
# VM_IMAGE_CUTS=0 when the time budget is short.
VM_IMAGE_CUTS ?= $(or $(WARMFLEET_VM_IMAGE_CUTS),2)
test: deps
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	WARMFLEET_VM_CUTS=$(VM_CUTS) WARMFLEET_VM_IMAGE_CUTS=$(VM_IMAGE_CUTS) $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@if [ "$$CI" = true ]; then FUZZTIME=$(CI_FUZZTIME) GO=$(GO) scripts/fuzz-short.sh; fi

# golangci-lint v2 (errcheck, govet, ineffassign, staticcheck with every
# check, unused) as .golangci.yml sets it.
lint: vet
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run ./...

# vulncheck runs govulncheck on every package. It needs its database
# (vuln.go.dev, or VULNDB=file:///path to a copy): a machine without it
# fails here, saying so, rather than passing unchecked.
VULNDB ?= https://vuln.go.dev
vulncheck:
	$(GO) run golang.org/x/vuln/cmd/govulncheck@v1.9.0 -db $(VULNDB) ./...

vet:
	$(GO) vet ./...

# fuzz runs every fuzz target in the tree for FUZZTIME each (default 5s),
# one after another, its seed corpus (f.Add and testdata/fuzz) first; a failing input is written to the package's
# testdata/fuzz/ by the Go fuzzer, to be committed as a seed. `make test`
# already runs every target's seed corpus as an ordinary test.
fuzz:
	GO=$(GO) scripts/fuzz-short.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)

bench-s3: build
	$(BIN)/warmfleet-lab bench s3

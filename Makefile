# containerd-shim-kvm-v1: run `make help` for the targets.

VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
PREFIX   ?= /usr/local
BIN      := _output/bin/containerd-shim-kvm-v1
WRAPPER  := _output/bin/kvm-qemu-wrapper
INSTALLER := _output/bin/kvm-shim-installer
LIBEXEC  ?= $(PREFIX)/libexec/containerd-shim-kvm-v1
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)
GO       ?= go
# Recipes run in bash so that a pipe fails when go test does.
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
# REPORT turns `go test -json` into go test -v's text and ends it with a
# summary of the failures (hack/testreport): a CI log's tail says why.
REPORT   = $(GO) run ./hack/testreport
# Integration tests boot real VMs under TCG; give them room.
INTEGRATION_TIMEOUT ?= 80m
# The soak: TestCRISoak's cycles of ten pods at once, on each containerd.
SOAK_CYCLES  ?= 100
SOAK_TIMEOUT ?= 600m
# FUZZTIME is how long `make fuzz` runs each fuzz target.
FUZZTIME ?= 30s
FUZZ_TARGETS = configdrive:FuzzAnnotations configdrive:FuzzSanitizeHostname vmplan:FuzzPodAnnotations shim:FuzzReadRecord vm:FuzzImageFormat vm:FuzzRender
INTEGRATION_RUN     ?= .
# The e2e tier: one private Kubernetes node per containerd flavour.
E2E_TIMEOUT ?= 60m
E2E_RUN     ?= .
# The CRI conformance suite: critest on each containerd with the runc and
# kvm handlers (four serial runs). CRITEST_FOCUS narrows it to the specs
# matching a ginkgo focus regexp; CRITEST_FLAVOURS to some containerds.
CRITEST_TIMEOUT  ?= 300m
CRITEST_FOCUS    ?=
CRITEST_FLAVOURS ?= 1.6 2.x
CRITEST_TOOLS    := _output/critest/tools
# The static-analysis gate: golangci-lint at one pinned version, installed
# with `go install` into a cache outside the repo and reused from there.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT_DIR     ?= /usr/local/lib/kvm-shim/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT         := $(GOLANGCI_LINT_DIR)/golangci-lint

.PHONY: help build install setup setup-demo images guest-images k8s critest critest-tools lint lint-tool unit fuzz deb deb-test deploy-image demo-test integration soak e2e test demo bench bench-net bench-numa clean

help: ## Show this help
	@awk 'BEGIN{FS=":.*## "} /^[a-z0-9-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build the static shim and emulator wrapper binaries into _output/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/containerd-shim-kvm-v1
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(WRAPPER) ./cmd/kvm-qemu-wrapper

install: build ## Install the shim to $(PREFIX)/bin and a default config (kept if present)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/containerd-shim-kvm-v1
	install -D -m 0755 $(WRAPPER) $(DESTDIR)$(LIBEXEC)/kvm-qemu-wrapper
	@if [ ! -e $(DESTDIR)/etc/containerd-shim-kvm-v1/config.toml ]; then \
		install -D -m 0644 config.example.toml $(DESTDIR)/etc/containerd-shim-kvm-v1/config.toml; \
		echo "installed /etc/containerd-shim-kvm-v1/config.toml"; fi

setup: ## Install host packages, start virtlogd and libvirtd, build containerd 2.x
	hack/setup-host.sh

images: guest-images ## Build the guest test images (OCI archives in _output/images), including the Debian cloud-init image
	hack/cloudimage/build.sh

guest-images: ## Build the small busybox guest images only (what the demo boots)
	hack/guest/build.sh

$(GOLANGCI_LINT):
	GOBIN=$(GOLANGCI_LINT_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

lint-tool: $(GOLANGCI_LINT) # the linter only (make test builds it in the background)

lint: $(GOLANGCI_LINT) ## Run golangci-lint (.golangci.yml, all build tags, and the hack/critest module; installs the pinned version on first use)
	$(GOLANGCI_LINT) run --allow-serial-runners ./...
	$(GOLANGCI_LINT) run --allow-serial-runners --build-tags faultinject ./shim/... ./internal/faultpoint/...
	cd hack/critest && GOWORK=off $(GOLANGCI_LINT) run --allow-serial-runners ./...

unit: ## Run the unit tests (privileged ones skip unless root; includes a full cloud-init guest boot under TCG)
	$(GO) test -timeout 20m ./...

fuzz: ## Run every fuzz target for FUZZTIME (default 30s) each, one after another, niced
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $${t#*:} ($${t%%:*}, $(FUZZTIME))"; \
		nice -n 19 $(GO) test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZTIME) -timeout=0 -parallel=1 ./$${t%%:*}/; \
	done

integration: setup build images ## Run the integration tests against real containerd 1.6 and 2.x, libvirtd and QEMU
	$(GO) test -tags integration -count=1 -json -timeout $(INTEGRATION_TIMEOUT) -run '$(INTEGRATION_RUN)' ./integration/ | $(REPORT)

soak: setup build images ## Soak: SOAK_CYCLES (100) cycles of 10 VM pods at once through CRI on containerd 1.6 and 2.x; fails on any error, leak or shim memory growth
	KVM_IT_SOAK_CYCLES=$(SOAK_CYCLES) $(GO) test -tags integration -count=1 -json -timeout $(SOAK_TIMEOUT) -run '^TestCRISoak$$' ./integration/ | $(REPORT)

k8s: ## Build the pinned kube-apiserver, kube-controller-manager, kubelet, kube-proxy and kubectl (cached in /var/cache/kvm-shim)
	hack/k8s/build.sh

e2e: setup build images k8s ## Run the e2e tier: a private Kubernetes node drives VM pods through kubectl, on containerd 1.6 and 2.x
	KVM_E2E_K8S_BIN="$$(hack/k8s/build.sh)" $(GO) test -tags e2e -count=1 -json -timeout $(E2E_TIMEOUT) -run '$(E2E_RUN)' ./integration/e2e/ | $(REPORT)

critest-tools: # critest-registry and the programs of its images (hack/critest, a module of its own)
	cd hack/critest && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(CRITEST_TOOLS)/critest-registry ./registry
	cd hack/critest && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(CRITEST_TOOLS)/ ./procps ./webserver ./nonewprivs
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CRITEST_TOOLS)/pause ./hack/guest/pause

critest: setup build critest-tools ## CRI conformance (critest v1.34.0) on containerd 1.6 and 2.x, runc baseline vs kvm; fails on a spec that passes with runc and fails with kvm unless integration/critest/exceptions.txt lists it
	KVM_CRITEST=1 KVM_CRITEST_BIN="$$(nice -n 19 hack/critest/build.sh)/critest" KVM_CRITEST_TOOLS=$(CURDIR)/$(CRITEST_TOOLS) \
	KVM_CRITEST_FOCUS='$(CRITEST_FOCUS)' KVM_CRITEST_FLAVOURS='$(CRITEST_FLAVOURS)' \
	$(GO) test -tags integration -count=1 -json -timeout $(CRITEST_TIMEOUT) -run '^TestCritest$$' ./integration/critest/ | $(REPORT)

deb: build ## Build the Debian package (dpkg-deb) into _output/deb; DEB_VERSION overrides the version
	deploy/deb/build.sh

deploy-image: build ## Build the node installer's image (an OCI archive for ctr import) and its manifests into _output/deploy
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(INSTALLER) ./cmd/kvm-shim-installer
	VERSION='$(VERSION)' GO='$(GO)' deploy/image.sh

deb-test: setup build ## Build the Debian package, lintian it, install, upgrade, remove and purge it on this host
	$(GO) test -tags deb -count=1 -json -timeout 10m ./integration/deb/ | $(REPORT)

demo-test: setup build guest-images ## Drive `make demo` in a real terminal (tmux): boot, type, reboot, poweroff, interrupted demos
	$(GO) test -tags demo -count=1 -json -timeout 20m ./integration/demo/ | $(REPORT)

# The tiers of `make test`, in order; hack/tiers.sh runs each as its own
# make and prints every tier's time at the end, also when one failed. It
# builds containerd 2.x, golangci-lint and Kubernetes in the background,
# niced, from the start, and each tier that needs one waits for it.
TEST_TIERS ?= lint setup build images unit deb-test demo-test integration e2e

test: ## Lint, set up the host, then run the unit, package, demo, integration and e2e tests (slow builds in the background); prints each tier's time
	hack/tiers.sh $(TEST_TIERS)

demo: setup-demo install guest-images ## Set up, install, start containerd and boot the demo VM with its console here
	hack/demo.sh

setup-demo: # the demo runs Debian's containerd 1.6 only: no containerd 2.x build
	SETUP_CONTAINERD2=0 hack/setup-host.sh

bench: setup build images ## Start latency, time to userspace, shim memory, density vs raw libvirt and runc, volume I/O vs a raw libvirt disk (writes bench/results)
	$(GO) run ./bench/cmd/kvmbench

bench-net: setup build images ## TCP throughput: our TAP with and without IFF_VNET_HDR vs a libvirt bridge TAP
	$(GO) run ./bench/cmd/kvmbench -sections net

bench-numa: ## Simulate 10,000 VM arrivals on 2/4/8-node hosts: our placement vs first-fit vs a CPU-manager-like packer
	$(GO) run ./bench/numa

clean: ## Remove build outputs
	rm -rf _output

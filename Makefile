# The project's commands. Everything the build needs comes from the Go module proxy
# (tools are pinned in tools/go.mod) and Debian's packages.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

GO        ?= go
TOOL      := $(GO) tool -modfile=tools/go.mod
BUF       := $(TOOL) buf
# validate.proto ships in this Go module; copying it from the module cache spares a
# schema registry, which is unreachable from where we build.
PROTOVALIDATE_VERSION := v1.2.2
PROTOVALIDATE_PROTO   := build/protovalidate/buf/validate/validate.proto
TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# The upgrade test (e2e/upgrade) runs in its short form in make test, from the first
# release the tree upgrades from in place (the oldest whose code works with the tree's
# schema) and from the latest in RELEASES, and back (UPGRADE_TEST=off skips it; its first
# run builds each release, minutes, cached after).
UPGRADE_TEST ?= short

.PHONY: test
test: envtest node jaeger tools browser ## Run every test against a real API server, a real node and a real Postgres.
	UPGRADE_TEST="$(UPGRADE_TEST)" UPGRADE_NODE=stand-in KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" $(GO) test $(TEST_FLAGS) ./...

# The upgrade test in full: release FROM (default the last line of RELEASES; several,
# space-separated, "first" or "oldest"), built from its commit, upgraded to the tree with work in
# flight and rolled back; make upgrade-test FROM=v0.1.0.
# FROM=tree upgrades the tree to itself: a rolling restart, the test's own control. Its
# container actions run on a real node as root, else (or with NODE=stand-in) on the
# stand-in kubelet, as the chaos soak's; the short form in make test, on the stand-in.
FROM ?= latest
NODE ?= $(if $(filter 0,$(shell id -u)),real,stand-in)
.PHONY: upgrade-test
upgrade-test: envtest node ## Upgrade release FROM (default the latest in RELEASES) to the tree with work in flight on NODE (real as root), and check it.
	UPGRADE_TEST=full UPGRADE_FROM="$(FROM)" UPGRADE_NODE="$(NODE)" KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" \
		$(GO) test -count=1 -timeout 60m -v -run '^TestUpgrade$$' ./e2e/upgrade

# The seeded chaos soak, long: make chaos SEED=1234 DURATION=30m. A failing run prints its
# seed and the command that replays it. Its pods run on a real node (containerd and a
# kubelet) as root, else (or with NODE=stand-in) on the soak's stand-in kubelet. A short
# run, on the stand-in, is part of make test. ADMISSION=1 installs the component
# finalizer-at-admission for the soak's namespaces.
SEED     ?= random
DURATION ?= 30m
.PHONY: chaos
chaos: envtest node ## Run the chaos soak for DURATION (default 30m) with SEED (default random), on NODE (real as root).
	CHAOS_NODE="$(NODE)" CHAOS_ADMISSION="$(ADMISSION)" SEED="$(SEED)" DURATION="$(DURATION)" KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" \
		$(GO) test -count=1 -timeout 24h -v -run '^TestChaos$$' ./e2e/chaos

# CLUSTERS=2 starts a second cluster beside the first (sandbox --second-cluster).
CLUSTERS ?= 1
.PHONY: run
run: first-run envtest jaeger ## Run the whole system here, apply examples/, show them running (Ctrl-C stops it all; CLUSTERS=2 adds a second cluster).
	@progress_name="make run"; source hack/progress.sh; \
	long "compiling the sandbox (sandbox/cmd/sandbox, into $(BIN)/)" "2 to 3 min" \
	  quietly "$${TMPDIR:-/tmp}/flyte-make-run-build.log" $(GO) build -o "$(BIN)/" ./sandbox/cmd/sandbox
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" $(BIN)/sandbox $(if $(filter 2,$(CLUSTERS)),--second-cluster) $(RUN_FLAGS)

.PHONY: deploy-node
deploy-node: envtest node ## Run the kustomize deployment (overlays/node) on a real node here, from images built here, and the examples through it (as root; Ctrl-C stops it).
	$(GO) run ./sandbox/cmd/deploy-node $(DEPLOY_FLAGS)

# first-run says, before the first build of a new machine starts, how long they all take.
.PHONY: first-run
first-run:
	@hack/envtest.sh check || echo "make run: the first run on this machine builds Kubernetes, etcd, Jaeger, Prometheus and NATS from source, \
	20 to 25 min on 2 cores (README.md, \"The first run\"); each step says what it builds as it goes. Later runs reuse the builds and show the examples running within a minute."

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest, and kubectl for the tests that run it (once; cached outside the clone).
	@hack/envtest.sh >/dev/null

.PHONY: node
node: ## Build the real node's kubelet, scheduler and controller manager, and install containerd (as root; once).
	@if [[ $$(id -u) == 0 ]]; then hack/node.sh build >/dev/null && hack/node.sh install >/dev/null; \
	else echo "node: not root, so the real-node tests will be skipped"; fi

.PHONY: browser
browser: ## Install Debian's Chromium for the console's browser tests (as root; once).
	@if command -v chromium >/dev/null; then :; \
	elif [[ $$(id -u) == 0 ]]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "browser: chromium is missing and we are not root, so the browser tests will fail"; fi

.PHONY: jaeger
jaeger: ## Build Jaeger, which the tracing tests run (once; cached outside the clone).
	@hack/jaeger.sh build >/dev/null

.PHONY: tools
tools: ## Build buf and promtool, which tests also run (go tool caches the binaries).
	@$(BUF) --version >/dev/null
	@$(GO) tool -modfile=tools/prometheus/go.mod promtool --version >/dev/null

# What a build is (internal/buildinfo): its version from the tags (v0.2.0, or
# v0.2.0-3-g936b0fa-dirty between releases; the commit alone where no tag is), and its commit.
VERSION  ?= $(shell git describe --tags --match 'v*' --always --dirty 2>/dev/null || echo devel)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -X github.com/flytekube/backend/internal/buildinfo.version=$(VERSION) -X github.com/flytekube/backend/internal/buildinfo.commit=$(COMMIT)
BIN      ?= bin
PROGRAMS := ./executor/cmd/executor ./events/cmd/events ./cacheservice/cmd/cacheservice

.PHONY: build
build: build-programs ## Build every package, and the three programs into BIN (bin/), stamped with VERSION and COMMIT.
	$(GO) build ./...

.PHONY: build-programs
build-programs: ## Build the three programs into BIN (bin/), stamped with VERSION and COMMIT (--version, build_info).
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(PROGRAMS)

.PHONY: version
version: ## Print the version make stamps into what it builds.
	@echo $(VERSION)

# Images are tagged with VERSION and with each of TAG (comma-separated), their binaries
# stamped with VERSION and COMMIT.
REPOSITORY ?= ghcr.io/flytekube
TAG        ?= dev
.PHONY: images
images: ## Build the images without Docker: build/images/<program>.tar, tagged VERSION and TAG (REPOSITORY; PUSH=1 pushes them).
	$(GO) run ./hack/images --out build/images --repository $(REPOSITORY) --version $(VERSION) --tag "$(TAG)" \
		--revision $(COMMIT) $(if $(PUSH),--push)

.PHONY: generate
generate: proto-generate crd-generate console-generate dashboard-generate ## Regenerate all generated code.

.PHONY: dashboard-generate
dashboard-generate: ## Regenerate the Grafana dashboard (deploy/dashboard) in deploy/kustomize/components/monitoring.
	$(GO) run ./hack/dashboard deploy/kustomize/components/monitoring/dashboard.json

.PHONY: crd-generate
crd-generate: ## Regenerate the TaskAction deepcopy code, CRD (deploy/crd) and RBAC.
	$(TOOL) controller-gen object paths=./executor/api/...
	$(TOOL) controller-gen crd paths=./executor/api/... output:crd:artifacts:config=deploy/crd
	$(TOOL) controller-gen rbac:roleName=flyte-executor paths=./executor output:rbac:artifacts:config=deploy/kustomize/base/rbac
	$(TOOL) controller-gen rbac:roleName=flyte-executor-tasks paths=./executor/rbac/tasknamespaces output:rbac:artifacts:config=deploy/kustomize/base/rbac/tasks

.PHONY: proto-generate
proto-generate: $(PROTOVALIDATE_PROTO) ## Regenerate the protobuf, Connect and gRPC code in gen/go.
	$(BUF) format -w
	$(BUF) generate

$(PROTOVALIDATE_PROTO):
	@mkdir -p $(dir $@)
	@mod=github.com/bufbuild/protovalidate@$(PROTOVALIDATE_VERSION); \
	dir=$$(cd "$${TMPDIR:-/tmp}" && GOFLAGS= $(GO) mod download $$mod && GOFLAGS= $(GO) list -m -f '{{.Dir}}' $$mod); \
	install -m 0644 "$$dir/proto/protovalidate/buf/validate/validate.proto" $@

# The web console (console/): TypeScript messages generated from the protos, type-checked,
# and bundled with the page into events/console/assets, which the events service embeds.
# Both are committed, so building and running the service needs no npm; regenerating
# them does (Debian's npm, installed when missing and root). esbuild's output depends
# only on its pinned version and its input, so check-generate can compare it.
CONSOLE_ASSETS := events/console/assets
ESBUILD        := console/node_modules/.bin/esbuild
ESBUILD_FLAGS  := --bundle --minify --legal-comments=none --charset=utf8 --log-level=warning

.PHONY: console-generate
console-generate: $(PROTOVALIDATE_PROTO) console/node_modules ## Regenerate the console's TypeScript clients and bundle (events/console/assets).
	$(BUF) generate --template console/buf.gen.yaml
	console/node_modules/.bin/tsc -p console
	rm -rf $(CONSOLE_ASSETS) && mkdir -p $(CONSOLE_ASSETS)
	$(ESBUILD) console/src/main.ts $(ESBUILD_FLAGS) --format=esm --target=es2022 --outfile=$(CONSOLE_ASSETS)/console.js
	$(ESBUILD) console/static/console.css $(ESBUILD_FLAGS) --outfile=$(CONSOLE_ASSETS)/console.css
	install -m 0644 console/static/index.html console/static/favicon.svg $(CONSOLE_ASSETS)/

# npm ci installs exactly package-lock.json, without install scripts (esbuild's binary
# comes as a package of its own and needs none).
console/node_modules: console/package.json console/package-lock.json
	@if ! command -v npm >/dev/null; then \
		if [[ $$(id -u) == 0 ]]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; \
		else echo "console: npm is missing (apt-get install npm)" >&2; exit 1; fi; \
	fi
	cd console && npm ci --ignore-scripts --no-audit --no-fund
	@touch $@

GENERATED := gen proto deploy executor/api console/src/gen $(CONSOLE_ASSETS)

.PHONY: check-generate
check-generate: generate ## Fail when generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		git status --porcelain -- $(GENERATED); git diff --stat -- $(GENERATED); \
		echo "generated code is out of date: run 'make generate' and commit the result"; exit 1; \
	fi

# The previous release: the commit on RELEASES' last line. Tools read the file, not tags,
# so that any clone with the history finds it.
PREVIOUS_RELEASE = $(shell awk '!/^\#/ && NF { commit = $$2 } END { print commit }' RELEASES)
PREVIOUS_PROTOS  := build/previous-release

.PHONY: breaking
breaking: $(PROTOVALIDATE_PROTO) ## Fail when proto/ breaks the previous release's contracts (buf breaking, rules FILE, against RELEASES' last commit).
	@commit="$(PREVIOUS_RELEASE)"; \
	if [[ -z "$$commit" ]]; then echo "breaking: RELEASES names no release" >&2; exit 1; fi; \
	if ! git cat-file -e "$$commit^{commit}" 2>/dev/null; then \
		echo "breaking: the previous release's commit $$commit (RELEASES) is not in this clone; a shallow clone needs 'git fetch --unshallow'" >&2; exit 1; \
	fi; \
	rm -rf $(PREVIOUS_PROTOS) && mkdir -p $(PREVIOUS_PROTOS)/build && \
	git archive "$$commit" buf.yaml proto | tar -x -C $(PREVIOUS_PROTOS) && \
	cp -R build/protovalidate $(PREVIOUS_PROTOS)/build/ && \
	echo "breaking: proto/ against $$commit" && \
	$(BUF) breaking --against $(PREVIOUS_PROTOS)

.PHONY: lint
lint: $(PROTOVALIDATE_PROTO) breaking ## Lint protos, Go code and the services' migrations (squawk); buf breaking against the previous release.
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	hack/squawk.sh lint

.PHONY: clean
clean: ## Remove build output (not the envtest cache).
	rm -rf build bin

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

.PHONY: test
test: envtest node jaeger tools ## Run every test against a real API server, a real node and a real Postgres.
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" $(GO) test $(TEST_FLAGS) ./...

.PHONY: run
run: envtest jaeger ## Run the whole system here, apply examples/, show them running (Ctrl-C stops it all).
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh 2>/dev/null | tail -1)" $(GO) run ./sandbox/cmd/sandbox $(RUN_FLAGS)

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest (once; cached outside the clone).
	@hack/envtest.sh >/dev/null

.PHONY: node
node: ## Build the real node's kubelet, scheduler and controller manager, and install containerd (as root; once).
	@if [[ $$(id -u) == 0 ]]; then hack/node.sh build >/dev/null && hack/node.sh install >/dev/null; \
	else echo "node: not root, so the real-node tests will be skipped"; fi

.PHONY: jaeger
jaeger: ## Build Jaeger, which the tracing tests run (once; cached outside the clone).
	@hack/jaeger.sh build >/dev/null

.PHONY: tools
tools: ## Build buf, which tests also run (go tool caches the binary).
	@$(BUF) --version >/dev/null

.PHONY: build
build: ## Build every package and binary.
	$(GO) build ./...

.PHONY: generate
generate: proto-generate crd-generate ## Regenerate all generated code.

.PHONY: crd-generate
crd-generate: ## Regenerate the TaskAction deepcopy code, CRD (deploy/crd) and RBAC.
	$(TOOL) controller-gen object paths=./executor/api/...
	$(TOOL) controller-gen crd paths=./executor/api/... output:crd:artifacts:config=deploy/crd
	$(TOOL) controller-gen rbac:roleName=flyte-executor paths=./executor/... output:rbac:artifacts:config=deploy/kustomize/base/rbac

.PHONY: proto-generate
proto-generate: $(PROTOVALIDATE_PROTO) ## Regenerate the protobuf, Connect and gRPC code in gen/go.
	$(BUF) format -w
	$(BUF) generate

$(PROTOVALIDATE_PROTO):
	@mkdir -p $(dir $@)
	@mod=github.com/bufbuild/protovalidate@$(PROTOVALIDATE_VERSION); \
	dir=$$(cd "$${TMPDIR:-/tmp}" && GOFLAGS= $(GO) mod download $$mod && GOFLAGS= $(GO) list -m -f '{{.Dir}}' $$mod); \
	install -m 0644 "$$dir/proto/protovalidate/buf/validate/validate.proto" $@

.PHONY: check-generate
check-generate: generate ## Fail when generated code differs from what is committed.
	@if [ -n "$$(git status --porcelain -- gen proto deploy executor/api)" ]; then \
		git status --porcelain -- gen proto deploy executor/api; git diff --stat -- gen proto deploy executor/api; \
		echo "generated code is out of date: run 'make generate' and commit the result"; exit 1; \
	fi

.PHONY: lint
lint: $(PROTOVALIDATE_PROTO) ## Lint protos and Go code.
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...

.PHONY: clean
clean: ## Remove build output (not the envtest cache).
	rm -rf build bin

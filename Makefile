# SPACE — build, run, test, bench. See README.md.
SHELL := /bin/bash
GO      ?= go
BIN     := $(CURDIR)/bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
GVISOR  := $(shell $(GO) list -m -f '{{.Version}}' gvisor.dev/gvisor)
export CGO_ENABLED := 0

.PHONY: all deps deps-test build run test test-unit test-fuzz test-e2e lint bench proto clean redteam

all: build

build: $(BIN)/runsc
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/spaced ./cmd/spaced
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/space ./cmd/space
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/space-agent ./cmd/space-agent

# runsc is built from the gVisor module pinned in go.mod, statically (a cgo runsc cannot re-exec
# itself inside its own chroot). Rebuilt when the pinned version changes.
$(BIN)/runsc: $(BIN)/.runsc-$(GVISOR)
$(BIN)/.runsc-$(GVISOR):
	@mkdir -p $(BIN)
	@echo "building runsc $(GVISOR) (a few minutes the first time)"
	$(GO) build -o $(BIN)/runsc gvisor.dev/gvisor/runsc
	@rm -f $(BIN)/.runsc-*; touch $@

# What a fresh Debian machine lacks (apt, as root): scripts/deps.sh.
deps:
	@scripts/deps.sh
deps-test:
	@scripts/deps.sh test

# Start spaced on the embedded defaults: SQLite, gVisor, the built-in templates (needs root).
run: deps build
	$(BIN)/spaced serve

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(GO) run ./cmd/space-lint -test=false ./...   # hostile trees only through internal/confine

test-unit:
	SPACE_PRIVILEGED_TESTS=1 $(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /e2e)

test-e2e: build
	SPACE_PRIVILEGED_TESTS=1 SPACE_BIN=$(BIN) $(GO) test -count=1 -timeout 30m -v ./e2e 2>&1 | tee $(BIN)/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|^ +--- FAIL' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || scripts/failures.sh $(BIN)/e2e.log; exit $$rc

# The parsers of hostile input, fuzzed for a bounded time each (not only their seeds): the
# confined path resolver, the image layer tar reader, tree write-back, the API's decoders, the
# egress gateway's ClientHello/HTTP sniffer and its policy-rule parser, and the lines a sandbox's
# code-interpreter server answers with.
FUZZTIME ?= 10s
# Minimising a new input may take up to a minute by default: past the fuzz time that fails the run
# ("context deadline exceeded") and stalls the fuzzer meanwhile.
FUZZFLAGS = -fuzztime $(FUZZTIME) -fuzzminimizetime 1s
test-fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzResolve$$' $(FUZZFLAGS) ./internal/confine
	$(GO) test -run '^$$' -fuzz '^FuzzApplyLayer$$' $(FUZZFLAGS) ./internal/image
	$(GO) test -run '^$$' -fuzz '^FuzzMaterialize$$' $(FUZZFLAGS) ./internal/fstree
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCreate$$' $(FUZZFLAGS) ./internal/api
	$(GO) test -run '^$$' -fuzz '^FuzzSniff$$' $(FUZZFLAGS) ./internal/egress
	$(GO) test -run '^$$' -fuzz '^FuzzParseRule$$' $(FUZZFLAGS) ./internal/egress
	$(GO) test -run '^$$' -fuzz '^FuzzParseLine$$' $(FUZZFLAGS) ./internal/codeinterp

test: deps-test build lint test-unit test-fuzz test-e2e

# The security evaluation (docs/SECURITY.md): every sandbox-escape attempt and the egress red team.
# `make test` runs a representative subset of the same TestRedTeam. SPACE_REDTEAM_REPORT=<file>
# writes the table of attempts as Markdown.
redteam: deps-test build
	SPACE_REDTEAM=full SPACE_PRIVILEGED_TESTS=1 SPACE_BIN=$(BIN) $(GO) test -count=1 -timeout 30m -v -run 'RedTeam' ./e2e 2>&1 | tee $(BIN)/redteam.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic|REDTEAM)|^ +--- FAIL' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || scripts/failures.sh $(BIN)/redteam.log; exit $$rc

bench: build
	SPACE_BIN=$(BIN) $(GO) run ./cmd/space-bench

proto:
	$(GO) build -o $(BIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(BIN)/protoc-gen-connect-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	protoc -I proto --plugin=protoc-gen-go=$(BIN)/protoc-gen-go --plugin=protoc-gen-connect-go=$(BIN)/protoc-gen-connect-go \
	  --go_out=. --go_opt=module=github.com/space-sandbox/space \
	  --connect-go_out=. --connect-go_opt=module=github.com/space-sandbox/space \
	  process/process.proto filesystem/filesystem.proto

clean:
	rm -rf $(BIN)

# sluice developer tasks. `make help` lists them.
#
# `make test` is what CI runs (through .ci/run): `lint` first, so unformatted
# code, a go.work.sum that workspace mode would rewrite or a vet/staticcheck
# finding fails the build, then every test with the
# race detector, in the root, otel, grpclimit, demo and benchmarks modules (the
# benchmarks module's tests check the report generator), then one pass of
# each benchmark in the benchmarks module.
#
# `make run` is the README's run command: the demo server on :8080.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# Each module is built and tested by its own go.mod, as a service that
# imports it gets it, not with the versions go.work's workspace would pick.
export GOWORK := off
# How long `make fuzz` runs each fuzz target, and how long it may spend
# minimizing each new interesting input: go test's default of 60s can take
# all of FUZZTIME on one large input (a config file) and run nothing else.
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 5s
# The packages whose Fuzz targets `make fuzz` runs; a package of a module
# of its own (otel, cmd/sluice-demo, cmd/sluice-server) is fuzzed from
# inside that module.
FUZZPKGS ?= ./ratelimit ./backend/memory ./internal/redisscript ./internal/test/redistest ./sharding ./lease ./plans ./plans/postgres ./httplimit ./otel ./cmd/sluice-demo ./cmd/sluice-server/internal/rlsconfig
# staticcheck, pinned so that a new release cannot fail CI overnight; bump it
# on purpose (it must understand the Go toolchain in use). Release 2026.2.2
# is module version v0.8.2: the module proxy knows only the latter.
STATICCHECK_VERSION ?= v0.8.2

GOBIN := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
STATICCHECK := $(or $(shell command -v staticcheck),$(GOBIN)/staticcheck)
# The benchmarks module (sluice against its peers) is optional.
BENCHMARKS_MOD := $(wildcard benchmarks/go.mod)
# The modules besides the root: otel (OpenTelemetry, which needs Go 1.26),
# the run that makes its on-call figures, grpclimit (gRPC interceptors, on
# Go 1.26 as google.golang.org/grpc is), the demo server (which serves
# /metrics through otel) and the benchmarks. `lint` vets each.
MODULES := $(patsubst %/go.mod,%,$(wildcard otel/go.mod otel/internal/oncall/go.mod grpclimit/go.mod cmd/sluice-demo/go.mod cmd/sluice-server/go.mod benchmarks/go.mod testkit/go.mod))
# grpcurl, the gRPC client sluice-server's tests call it with (one not
# written here, which finds the API by server reflection), pinned.
GRPCURL_VERSION ?= v1.9.4
GRPCURL := $(or $(shell command -v grpcurl),$(GOBIN)/grpcurl)

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

.PHONY: test
test: lint $(GRPCURL) ## lint, then all tests with -race (root, otel, grpclimit, demo, sluice-server, testkit and benchmarks modules; the demo's in headless Chromium; sluice-server's through grpcurl too; the test kit's on binaries, then on containers when an engine answers, with the SDK's Redis and PostgreSQL suites), then each benchmark once (what CI runs)
	$(GO) test -race -count=1 ./...
	cd otel && $(GO) test -race -count=1 ./...
	cd grpclimit && $(GO) test -race -count=1 ./...
	cd cmd/sluice-demo && $(GO) test -race -count=1 ./...
	cd cmd/sluice-server && SLUICE_GRPCURL='$(GRPCURL)' $(GO) test -race -count=1 ./...
	cd testkit && SLUICE_TESTKIT=binaries $(GO) test -race -count=1 ./...
	cd testkit && $(GO) test -race -count=1 -timeout=30m ./...
ifneq ($(BENCHMARKS_MOD),)
	cd benchmarks && $(GO) test -race -count=1 ./...
	cd benchmarks && $(GO) test -run='^$$' -bench=. -benchtime=1x ./...
endif

.PHONY: test-containers
test-containers: ## the test kit's tests and the SDK's Redis and PostgreSQL suites on containers (needs an engine: see docs/testing.md)
	cd testkit && SLUICE_TESTKIT=containers $(GO) test -race -count=1 -timeout=30m ./...

.PHONY: test-unit
test-unit: ## fast tests only (-short), with -race
	$(GO) test -race -short ./...
	cd otel && $(GO) test -race -short ./...
	cd grpclimit && $(GO) test -race -short ./...
	cd cmd/sluice-demo && $(GO) test -race -short ./...

.PHONY: test-integration
test-integration: ## tests whose names contain Integration, with -race
	$(GO) test -race -count=1 -run 'Integration' ./...

.PHONY: test-distributed
test-distributed: ## separate processes on one bucket through real Redis: exact counts, porcupine, faults (-v: the counts; see docs/correctness.md)
	$(GO) test -race -count=1 -v ./internal/test/distributed/

.PHONY: bench
bench: ## sluice vs its peers, six interleaved rounds, benchstat tables in bench/benchstat.txt (about 20 min)
	sh benchmarks/run.sh bench

.PHONY: bench-algorithms
bench-algorithms: ## every algorithm on one redis-server: memory per key and decisions/s, six rounds, tables in bench/algorithms/benchstat.txt (about 5 min)
	sh benchmarks/algorithms.sh bench/algorithms

.PHONY: bench-redis
bench-redis: ## sluice's Redis backends vs redis_rate on one redis-server, six rounds, tables in bench/redis/benchstat.txt (about 15 min)
	sh benchmarks/redis.sh bench/redis

.PHONY: bench-peers
bench-peers: ## sluice vs its peers in memory and on one redis-server (decisions/s, p50/p99/p99.9 at 1-256 goroutines, bytes per key, the pipelined ceiling): writes docs/benchmarks.md and its plots (about 5 min)
	PEERS_COMMAND='make bench-peers' sh benchmarks/peers.sh bench/peers

.PHONY: bench-script-cost
bench-script-cost: ## instructions redis-server runs per decision (sluice: token bucket and GCRA on 1 and 2 greedy bandwidths, fixed window, sliding window counter and sliding log on 1; redis_rate) under callgrind, into bench/scriptcost/ (about a minute)
	sh benchmarks/scriptcost.sh bench/scriptcost

.PHONY: bench-burst
bench-burst: ## healthy decision latency under a burst (2 processes × 100 calls), idle and beside a CPU burner, into benchmarks/results/ (about 5 min)
	sh benchmarks/burst.sh

.PHONY: bench-hotkey
bench-hotkey: ## one hot key on a 3-master cluster, bare and split 3 and 6 ways, go-redis and rueidis at 64 and 256 goroutines; and shared by 2 processes on one server, leased and not, at 16 and 64 goroutines: decisions/s, p99, store calls, server CPU, into benchmarks/results/ (about 3 minutes)
	sh benchmarks/hotkey.sh

.PHONY: bench-server
bench-server: ## sluice-server vs envoyproxy/ratelimit over gRPC: ShouldRateLimit decisions/s and p50/p99, sluice-server in memory and on one redis-server (go-redis, rueidis), envoyproxy/ratelimit on the same, 10k keys and one, 16 and 64 goroutines, six interleaved rounds, tables in bench/server/benchstat.txt (about 8 min)
	RLS_COMMAND='make bench-server' sh benchmarks/rls.sh bench/server

.PHONY: oncall
oncall: ## the on-call run of docs/observability.md: real Redis and Prometheus through abuse, a low limit and a sick store; rewrites its figures (about 6 min)
	sh otel/internal/oncall/run.sh

.PHONY: lint
lint: $(STATICCHECK) ## gofmt (must list nothing), a complete go.work.sum, go vet and staticcheck, in every module
	@echo 'gofmt -l .'; unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$unformatted"; exit 1; fi
	@echo 'go.work.sum holds every sum workspace mode needs'; before="$$(cat go.work.sum)"; \
	GOWORK='$(CURDIR)/go.work' $(GO) list -m all >/dev/null; \
	if [ "$$before" != "$$(cat go.work.sum)" ]; then echo "go.work.sum was incomplete: a go command in workspace mode (here go list -m all, which loads the whole module graph) added the lines git diff go.work.sum shows; commit them"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	for mod in $(MODULES); do \
	  echo "== $$mod"; \
	  (cd $$mod && $(GO) vet ./... && $(STATICCHECK) ./...); \
	done

$(GOBIN)/staticcheck:
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(GOBIN)/grpcurl:
	$(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: tools
tools: $(STATICCHECK) $(GRPCURL) ## install the tools make test uses: staticcheck and grpcurl, pinned, into GOBIN

.PHONY: fuzz
fuzz: ## run each Fuzz target in FUZZPKGS (./ratelimit ./backend/memory ./internal/redisscript ./internal/test/redistest ./sharding ./lease ./plans ./plans/postgres ./httplimit ./otel ./cmd/sluice-demo ./cmd/sluice-server/internal/rlsconfig) for FUZZTIME (30s)
	for pkg in $(FUZZPKGS); do \
	  dir=$$pkg; while [ ! -f "$$dir/go.mod" ]; do dir=$$(dirname "$$dir"); done; \
	  target=./$${pkg#"$$dir"}; target=$${target/\/\//\/}; \
	  listed="$$(cd $$dir && $(GO) test -list '^Fuzz' $$target)"; \
	  targets="$$(grep '^Fuzz' <<<"$$listed" || true)"; \
	  if [ -z "$$targets" ]; then echo "no Fuzz targets in $$pkg"; exit 1; fi; \
	  for t in $$targets; do \
	    echo "== $$pkg $$t for $(FUZZTIME)"; \
	    (cd $$dir && $(GO) test -run='^$$' -fuzz="^$$t\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$target); \
	  done; \
	done

.PHONY: run
run: ## run the demo server (cmd/sluice-demo) on :8080, in memory: open http://localhost:8080
	cd cmd/sluice-demo && $(GO) run .

.PHONY: run-server
run-server: ## run sluice-server (Envoy's rate limit service) on :8081 (gRPC) and :8080 (/metrics), in memory, with its example config
	cd cmd/sluice-server && $(GO) run .

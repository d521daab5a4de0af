# sluice developer tasks. `make help` lists them.
#
# `make test` is what CI runs (through .ci/run): `lint` first, so unformatted
# code or a vet/staticcheck finding fails the build, then every test with the
# race detector, then one pass of each benchmark in the benchmarks module.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# How long `make fuzz` runs each fuzz target.
FUZZTIME ?= 30s
# The package whose Fuzz targets `make fuzz` runs.
FUZZPKG ?= ./ratelimit
# Runs per benchmark in `make bench`: benchstat wants at least 6.
BENCHCOUNT ?= 6
# How long each of those runs lasts (go test -benchtime).
BENCHTIME ?= 1s
# staticcheck, pinned so that a new release cannot fail CI overnight; bump it
# on purpose (it must understand the Go toolchain in use). Release 2026.2.2
# is module version v0.8.2: the module proxy knows only the latter.
STATICCHECK_VERSION ?= v0.8.2

GOBIN := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
STATICCHECK := $(or $(shell command -v staticcheck),$(GOBIN)/staticcheck)
BENCHSTAT := $(or $(shell command -v benchstat),$(wildcard $(GOBIN)/benchstat))
# The benchmarks module (sluice against its peers) is optional.
BENCHMARKS_MOD := $(wildcard benchmarks/go.mod)

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

.PHONY: test
test: lint ## lint, then all tests with -race, then each benchmark once (what CI runs)
	$(GO) test -race -count=1 ./...
ifneq ($(BENCHMARKS_MOD),)
	cd benchmarks && $(GO) test -run='^$$' -bench=. -benchtime=1x ./...
endif

.PHONY: test-unit
test-unit: ## fast tests only (-short), with -race
	$(GO) test -race -short ./...

.PHONY: test-integration
test-integration: ## tests whose names contain Integration, with -race
	$(GO) test -race -count=1 -run 'Integration' ./...

.PHONY: bench
bench: ## benchmarks into bench/*.txt, compared with the previous run by benchstat if installed
	mkdir -p bench
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) ./backend/memory ./ratelimit | tee bench/core.new.txt
	$(call keep-bench,core)
ifneq ($(BENCHMARKS_MOD),)
	cd benchmarks && $(GO) test -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) -cpu=1,2 ./... | tee ../bench/peers.new.txt
	$(call keep-bench,peers)
endif
ifneq ($(BENCHSTAT),)
	for f in bench/core.txt bench/peers.txt; do \
	  [ -f "$$f" ] || continue; \
	  old="$${f%.txt}.old.txt"; \
	  echo "== benchstat $$f"; \
	  if [ -f "$$old" ]; then $(BENCHSTAT) "$$old" "$$f"; else $(BENCHSTAT) "$$f"; fi; \
	done
else
	@echo "benchstat not installed (go install golang.org/x/perf/cmd/benchstat@latest); raw results are in bench/"
endif

# keep-bench,NAME makes a finished run bench/NAME.txt and the one before it
# bench/NAME.old.txt. A failed run never gets here, so it replaces nothing.
define keep-bench
if [ -f bench/$(1).txt ]; then mv bench/$(1).txt bench/$(1).old.txt; fi; mv bench/$(1).new.txt bench/$(1).txt
endef

.PHONY: lint
lint: $(STATICCHECK) ## gofmt (must list nothing), go vet and staticcheck, in both modules
	@echo 'gofmt -l .'; unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
ifneq ($(BENCHMARKS_MOD),)
	cd benchmarks && $(GO) vet ./...
	cd benchmarks && $(STATICCHECK) ./...
endif

$(GOBIN)/staticcheck:
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: fuzz
fuzz: ## run each Fuzz target in FUZZPKG (./ratelimit) for FUZZTIME (30s)
	listed="$$($(GO) test -list '^Fuzz' $(FUZZPKG))"; \
	targets="$$(grep '^Fuzz' <<<"$$listed" || true)"; \
	if [ -z "$$targets" ]; then echo "no Fuzz targets in $(FUZZPKG)"; exit 1; fi; \
	for t in $$targets; do \
	  echo "== $$t for $(FUZZTIME)"; \
	  $(GO) test -run='^$$' -fuzz="^$$t\$$" -fuzztime=$(FUZZTIME) $(FUZZPKG); \
	done

.PHONY: run
run: ## run the quick start example (examples/quickstart)
	$(GO) run ./examples/quickstart

# ferry — developer entry points. Everything that needs system packages runs
# scripts/install-deps.sh first (idempotent, apt-get only).
#
#   make deps    install build/test dependencies (gcc, python3, redis, memcached, ...)
#   make build   cargo build --release
#   make demo    live migration: `ferry demo` moves redis between two test hosts
#                under client load (scripts/demo.sh, needs root; DEMO_ARGS=... for options)
#   make demo-checkpoint  checkpoint + restore a live TCP server (scripts/demo-checkpoint.sh)
#   make demo-failover    hot standby: redis's host dies under clients, the standby takes
#                over (scripts/demo-failover.sh, needs root)
#   make test    rustfmt and clippy checks, the engine's layering check, then the full
#                test suite, as CI runs it (.ci/run; needs root)
#   make bench   checkpoint/restore timings and image sizes (bench/run.sh, needs root)
#   make fuzz    run the fuzz targets for a while (needs cargo-fuzz and nightly)
#   make clean   remove build outputs

CARGO     ?= cargo
FUZZ_TIME ?= 60

.PHONY: all deps build demo demo-checkpoint demo-failover test bench fuzz clean

all: build

deps:
	bash scripts/install-deps.sh

build:
	$(CARGO) build --release

demo: deps
	bash scripts/demo.sh

demo-checkpoint: deps
	bash scripts/demo-checkpoint.sh

demo-failover: deps
	bash scripts/demo-failover.sh

test: deps
	$(CARGO) fmt --all -- --check
	python3 scripts/check-layering.py
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(CARGO) build --release
	CARGO="$(CARGO)" bash scripts/test-suite.sh

bench: deps
	bash bench/run.sh

fuzz:
	@if [ ! -d fuzz ]; then echo "make fuzz: no fuzz/ directory in this checkout"; exit 1; fi
	@if ! $(CARGO) fuzz --version >/dev/null 2>&1; then \
	  echo "make fuzz: cargo-fuzz is missing: 'cargo install cargo-fuzz' (needs a nightly toolchain)"; exit 1; fi
	cd fuzz && for t in $$($(CARGO) fuzz list); do \
	  echo "== fuzzing $$t for $(FUZZ_TIME) s"; \
	  mkdir -p corpus/"$$t"; \
	  $(CARGO) fuzz run "$$t" corpus/"$$t" seeds/"$$t" -- -max_total_time=$(FUZZ_TIME) -timeout=10 -malloc_limit_mb=256 || exit 1; \
	done

clean:
	$(CARGO) clean
	rm -rf target/c

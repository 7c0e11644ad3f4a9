# h5i developer and CI entry points. CI runs `make test` (via .ci/run) as root.
#   make setup   prepare this host: packages, podman config, test user, test images
#   make build   release build of the whole workspace
#   make test    setup, then fmt check, clippy (-D warnings), release tests
#   make bench   setup, build, then bench/run.sh -> BENCHMARKS.md (ROWS="a b" for some rows)
#   make demo    setup, build, then scripts/demo.sh
#   make images  build the container tier's images with Podman (images/build.sh; not part of test)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# rustup's toolchain; CI and developers run as root.
export PATH := /root/.cargo/bin:$(PATH)
CARGO ?= cargo
ROWS ?=

.PHONY: setup build test bench demo images

setup:
	bash scripts/setup-host.sh

build:
	$(CARGO) build --release --workspace

test: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The integration tests run h5i's sibling binaries (h5i-runc, h5i-hook): build every bin
	# first, since cargo builds a package's bins only for that package's own integration tests.
	$(CARGO) build --workspace --release --bins
	$(CARGO) test --workspace --release

bench: setup build
	bash bench/run.sh $(ROWS)
	bash bench/proxy.sh

demo: setup build
	bash scripts/demo.sh

images: setup
	bash images/build.sh

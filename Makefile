# h5i developer and CI entry points. CI runs `make test` (via .ci/run) as root.
#   make setup   prepare this host: packages, then the build, then `h5i host setup --user
#                h5i-test` (from the fresh build), the test user and test images
#   make build   release build of every binary (what `cargo install --path .` installs)
#   make test    setup, then fmt check, clippy (-D warnings), release tests
#   make bench   setup, then bench/run.sh -> BENCHMARKS.md (ROWS="a b" for some rows)
#   make demo    setup, then scripts/demo.sh
#   make images  build the container tier's images with Podman (images/build.sh; not part of test)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# rustup's toolchain; CI and developers run as root.
export PATH := /root/.cargo/bin:$(PATH)
CARGO ?= cargo
ROWS ?=

.PHONY: packages setup build test bench demo images

# What building needs (libseccomp-dev, ...), before the first build.
packages:
	bash scripts/setup-host.sh packages

# The build comes before the host phase, so the hooks it installs are this tree's.
setup: packages build
	bash scripts/setup-host.sh host

# Every bin: the integration tests run h5i's sibling binaries (h5i-runc, h5i-hook).
build:
	$(CARGO) build --release --workspace --bins

test: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The test build turns on the `test-seams` feature (a dev-dependency of h5i on itself), so
	# cargo test rebuilds h5i's bins with it; tests/install.rs checks the seam-free install.
	$(CARGO) test --workspace --release

bench: setup
	bash bench/run.sh $(ROWS)
	bash bench/proxy.sh

demo: setup
	bash scripts/demo.sh

images: setup
	bash images/build.sh

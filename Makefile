# h5i developer and CI entry points. CI runs `make test` (via .ci/run) as root.
#   make setup   prepare this host: packages, then `make install`, then that install's
#                `h5i host setup --user h5i-test`, the test user and test images
#   make install `cargo install --path .` into target/install/bin, building in target/ (the
#                test build shares every dependency's artifacts; tests/install.rs does the same)
#   make build   release build of every workspace binary into target/release
#   make test    setup and images, then fmt check, clippy (-D warnings), the build without the
#                `ui` feature, release tests
#   make bench   setup, build, then bench/run.sh -> BENCHMARKS.md (ROWS="a b" for some rows)
#   make demo    setup (which builds and installs before it installs the hooks), then
#                scripts/demo.sh with the installed h5i
#   make fuzz    run each fuzz target in fuzz/ for FUZZ_SECONDS (default 60) over its checked-in
#                corpus (scripts/fuzz.sh: cargo-fuzz, nightly with ASan when installed, else
#                stable with --sanitizer none)
#   make images  build the container tier's images with Podman (images/build.sh; cached layers:
#                only what changed is rebuilt). The agent and browser tests run in them, so test
#                builds them first
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# rustup's toolchain; CI and developers run as root.
export PATH := /root/.cargo/bin:$(PATH)
CARGO ?= cargo
ROWS ?=

.PHONY: packages install setup build test bench demo images fuzz

# What building needs (libseccomp-dev, ...), before the first build.
packages:
	bash scripts/setup-host.sh packages

# What a user's `cargo install --path .` builds (no test seams), in the workspace's target dir:
# the test build (the `test-seams` feature) then compiles only h5i's own crate again, not every
# dependency. It leaves the seam-free h5i* in target/release; `cargo test` links its own back.
INSTALL_ROOT := target/install
install: packages
	$(CARGO) install --locked --force --path . --root $(INSTALL_ROOT) --target-dir target
	$(CARGO) install --locked --force --path guest --target x86_64-unknown-linux-musl --root $(INSTALL_ROOT) --target-dir target

# The install comes before the host phase, so the hooks it installs are this tree's.
setup: packages install
	H5I=$(INSTALL_ROOT)/bin/h5i bash scripts/setup-host.sh host

# Every bin: the integration tests run h5i's sibling binaries (h5i-runc, h5i-hook).
build:
	$(CARGO) build --release --workspace --bins
	$(CARGO) build --release -p h5i-guest --target x86_64-unknown-linux-musl

test: setup images
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# Cargo.toml's `ui` feature: a build without it compiles and has none of its dependencies.
	$(CARGO) check -p h5i --no-default-features --lib --bins
	if $(CARGO) tree -p h5i --no-default-features -e normal --prefix none \
	    | grep -E '^(axum|tokio|tokio-tungstenite|futures-util|zune-jpeg|base64) '; then \
	    echo "refusing: --no-default-features still pulls in the ui feature's dependencies above; to fix: make them optional under the feature in Cargo.toml"; exit 1; fi
	# The test build turns on the `test-seams` feature (a dev-dependency of h5i on itself), so
	# cargo test rebuilds h5i's bins with it; tests/install.rs checks the seam-free install.
	# Every skip is kept (testsupport/src/skip.rs), listed, and refused unless tests/skips-allowed.txt
	# names it: a test for a capability this host has runs.
	rm -f target/test-skips.log
	H5I_TEST_SKIPS=$(CURDIR)/target/test-skips.log $(CARGO) test --workspace --release
	bash scripts/test-skips.sh target/test-skips.log tests/skips-allowed.txt

bench: setup build
	bash bench/run.sh $(ROWS)
	bash bench/proxy.sh

demo: setup
	H5I=$(INSTALL_ROOT)/bin/h5i bash scripts/demo.sh

images: setup
	bash images/build.sh

fuzz:
	bash scripts/fuzz.sh

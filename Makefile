# The two commands in the README: `make run` and `make test`. Both run setup first.
CARGO ?= cargo
# Without ARGS: the detection server on port 8080.
ARGS ?= serve

.PHONY: setup build run test bench bench-serving overload reload-memory image image-test lint fmt audit

setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --release --locked

# Builds and runs peregrine (by default the server); other commands go in ARGS, e.g.
#   make run ARGS="detect photo.jpg --format table"
run: build
	./target/release/peregrine $(ARGS)

test: setup
	./scripts/setup-test.sh
	./scripts/test.sh

bench: setup
	$(CARGO) bench --workspace --locked

# Server figures: the model alone, then the server with batching on and off.
bench-serving: build
	./scripts/bench-serving.sh

# Three times capacity for two minutes: stays up, memory flat, P99 within deadline.
overload: build
	./scripts/overload.sh

# Unload and reload a model 100 times: resident memory stays flat.
reload-memory: build
	./scripts/reload-memory.sh

# The container image (deploy/image): a Debian 12 base made by mmdebstrap, built by
# buildah without a daemon; also saved as target/image/peregrine.tar for `docker load`.
image: build
	./deploy/image/build.sh

# Runs that image's filesystem as its own user (chroot), detects a photo, stops it.
image-test: image
	./deploy/image/smoke-test.sh

# RustSec advisories over Cargo.lock, offline (scripts/audit.sh).
audit:
	./scripts/audit.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:
	$(CARGO) fmt --all

# The two commands in the README: `make run` and `make test`. Both run setup first.
CARGO ?= cargo
# Without ARGS: detect on the shared test photos when they sit beside the checkout.
ARGS ?= $(if $(wildcard ../shared/images),detect --format table ../shared/images,--help)

.PHONY: setup build run test bench lint fmt

setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --release --locked

# Builds and runs peregrine; pass its arguments in ARGS, e.g.
#   make run ARGS="detect photo.jpg --format table"
run: build
	./target/release/peregrine $(ARGS)

test: setup
	$(CARGO) test --workspace --locked

bench: setup
	$(CARGO) bench --workspace --locked

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:
	$(CARGO) fmt --all

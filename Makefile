# The two commands in the README: `make run` and `make test`. Both run setup first.
CARGO ?= cargo
# Without ARGS: the detection server on port 8080.
ARGS ?= serve

.PHONY: setup build run test bench bench-serving overload reload-memory lint fmt

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

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:
	$(CARGO) fmt --all

# Two commands on a fresh machine (only Python 3.11+ and make needed):
#   make demo   - install into .venv and show the sidecar at work on built-in upstreams
#   make test   - install into .venv and run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pip says errors only (-qq): a machine's pip configuration (an extra index lacking most packages) would
# otherwise print a warning per package on a fresh install; a failed install still stops with pip's error.
PIP    := $(BIN)/python -m pip install -qq

.PHONY: install test unit integration demo lint bench lock clean image image-test

# `install` also compiles the hot path with mypyc when a source changed (tools/native.py; SIDECAR_NATIVE=0: pure Python).
install: $(STAMP)
	@$(BIN)/python tools/native.py build

$(STAMP): requirements-dev.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) --require-hashes -r requirements-dev.lock
	$(PIP) --no-deps -e .
	@touch $(STAMP)

# An older pymongo beside the lock's, for the MongoDB differential suite (tests/compat/mongo).
PYMONGO_OLD := $(VENV)/pymongo-4.16
$(PYMONGO_OLD)/.installed: tests/compat/mongo/pymongo-4.16.txt $(STAMP)
	rm -rf $(PYMONGO_OLD)
	$(PIP) --require-hashes --no-deps --target $(PYMONGO_OLD) -r $<
	@touch $@

test: install $(PYMONGO_OLD)/.installed redis-server
	@bash tools/test-deps.sh
	$(BIN)/python -m pytest tests

# A real redis-server for the fleet tests (tests/integration/fleet): the Debian package, or a message saying how.
.PHONY: redis-server
redis-server:
	@sh tools/ensure-redis.sh

unit: install
	$(BIN)/python -m pytest tests/unit

integration: install
	$(BIN)/python -m pytest tests/integration

lint: install
	$(BIN)/ruff check .

demo: install
	$(BIN)/sidecar demo

bench: install
	$(BIN)/python bench/run_all.py

# The image, built with podman on a base made locally (deploy/ci/podman.sh: installs podman with apt when
# missing, configures it under build/image, makes localhost/python-base:bookworm with mmdebstrap), then run
# read-only and non-root through every protocol, a reload and a drain, and the compose stack (tests/image).
IMAGE ?= localhost/retry-sidecar:dev
image:
	bash -c '. deploy/ci/podman.sh && podman build --build-arg BASE_IMAGE="$$BASE_IMAGE" -t $(IMAGE) . \
	  && podman image ls --format "{{.Repository}}:{{.Tag}} {{.Size}}" $(IMAGE)'

image-test: install image
	bash -c '. deploy/ci/podman.sh && SIDECAR_IMAGE=$(IMAGE) $(BIN)/python -m pytest tests/image'

# Re-pin the dependencies after editing pyproject.toml (needs network access to PyPI). Three hash-pinned locks,
# the same versions in each (the dev lock is solved first and constrains the other two):
#   requirements-dev.lock     everything: running, tests, the demo, plots, the mypyc build, the deploy checks, py-spy (make install)
#   requirements.lock         running only: what the image's runtime stage holds
#   requirements-native.lock  running + the mypyc build: the image's builder stage
LOCK_VENV := /tmp/sidecar-lock-venv
PIP_COMPILE := $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	--no-emit-index-url --no-emit-find-links
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet pip-tools
	$(PIP_COMPILE) --extra test --extra demo --extra plot --extra native --extra deploy --extra profile -o requirements-dev.lock pyproject.toml
	$(PIP_COMPILE) -c requirements-dev.lock -o requirements.lock pyproject.toml
	$(PIP_COMPILE) -c requirements-dev.lock --extra native -o requirements-native.lock pyproject.toml

clean:
	rm -rf $(VENV) build *.egg-info
	find sidecar -name '*.so' -delete

# Two commands on a fresh machine (only Python 3.11+ and make needed):
#   make demo   - install into .venv and show the sidecar at work on built-in upstreams
#   make test   - install into .venv and run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit integration demo lint bench lock clean

# `install` also compiles the hot path with mypyc when a source changed (tools/native.py; SIDECAR_NATIVE=0: pure Python).
install: $(STAMP)
	@$(BIN)/python tools/native.py build

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# An older pymongo beside the lock's, for the MongoDB differential suite (tests/compat/mongo).
PYMONGO_OLD := $(VENV)/pymongo-4.16
$(PYMONGO_OLD)/.installed: tests/compat/mongo/pymongo-4.16.txt $(STAMP)
	rm -rf $(PYMONGO_OLD)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps --target $(PYMONGO_OLD) -r $<
	@touch $@

test: install $(PYMONGO_OLD)/.installed redis-server
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

# Re-pin the dependencies after editing pyproject.toml (needs network access to PyPI).
lock:
	$(PYTHON) -m venv /tmp/sidecar-lock-venv
	/tmp/sidecar-lock-venv/bin/pip install --quiet pip-tools
	/tmp/sidecar-lock-venv/bin/pip-compile --quiet --extra test --extra plot --extra native --generate-hashes --strip-extras \
	    --allow-unsafe -o requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) build *.egg-info
	find sidecar -name '*.so' -delete

# retry-sidecar image. Two stages from the same base (swap it with --build-arg BASE_IMAGE=...):
#   builder  compiles the hot path with mypyc (gcc and the Python headers live here only) into a wheel,
#            installs the runtime lock plus that wheel into /opt/sidecar, and leaves there only what the
#            sidecar runs: no pip or setuptools, extensions stripped as Debian strips shared libraries
#            (--strip-unneeded: no debug or local symbols), no tests, type stubs or C sources, and
#            bytecode only for the modules the sidecar imports (tools/slim_venv.py)
#   runtime  the base plus /opt/sidecar: no compiler, no tests, no plot or build tools
# Build: podman build -t retry-sidecar .   (or docker build)
# Run:   podman run --read-only --cap-drop=ALL -v ./config.yaml:/etc/sidecar/config.yaml:ro retry-sidecar
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# python:*-slim carries its own headers (/usr/local/include); a Debian python3 base needs python3-dev.
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
 && if ! python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then \
      apt-get install -y -qq --no-install-recommends python3-dev >/dev/null; fi \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.lock requirements-native.lock ./
# pip's cache (a build cache mount: kept between builds on one machine, never in the image) serves the second
# venv the wheels the first one downloaded.
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/build \
 && /opt/build/bin/pip install --quiet --require-hashes -r requirements-native.lock \
 && python3 -m venv /opt/sidecar \
 && /opt/sidecar/bin/pip install --quiet --require-hashes -r requirements.lock
COPY pyproject.toml setup.py README.md config.example.yaml ./
COPY sidecar ./sidecar
COPY tools/slim_venv.py ./tools/
RUN SIDECAR_NATIVE=1 /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation -w /wheels . \
 && /opt/sidecar/bin/pip install --quiet --no-deps /wheels/*.whl \
 && /opt/sidecar/bin/sidecar version >/tmp/version && cat /tmp/version \
 && grep -q 'compiled with mypyc' /tmp/version \
 && /opt/sidecar/bin/python -m pip uninstall --quiet --yes setuptools pip \
 && find /opt/sidecar -name '*.so' -exec strip --strip-unneeded {} + \
 && /opt/sidecar/bin/python tools/slim_venv.py /opt/sidecar \
 && install -D -m 0644 config.example.yaml /etc/sidecar/config.yaml

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="retry-sidecar" \
      org.opencontainers.image.description="One retry policy for MongoDB, HTTP and gRPC traffic: a sidecar proxy that meets overload with backpressure instead of retry storms." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/retry-sidecar/retry-sidecar"
COPY --from=builder /opt/sidecar /opt/sidecar
COPY --from=builder /etc/sidecar/config.yaml /etc/sidecar/config.yaml
ENV PATH=/opt/sidecar/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Nothing is written at run time: the image runs with a read-only root filesystem and all capabilities dropped.
USER 10001:10001
# The admin port (/healthz /readyz /metrics /config) and the example config's HTTP listener; a deployment's
# own listeners are whatever its config names.
EXPOSE 9901 15001
STOPSIGNAL SIGTERM
ENTRYPOINT ["sidecar"]
CMD ["run", "-c", "/etc/sidecar/config.yaml"]

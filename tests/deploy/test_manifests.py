"""deploy/: the kustomize base and overlays through kubectl's kustomize and the Kubernetes 1.29 schemas; the
compose files against the compose-spec schema; every sidecar config there accepted by `sidecar check`."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from .tools import ROOT, kubectl, kubernetes_validate, objects, run, tool

KUSTOMIZATIONS = [ROOT / "deploy/kubernetes/base", *sorted((ROOT / "deploy/kubernetes/overlays").iterdir())]
COMPOSE = sorted((ROOT / "deploy/compose").glob("compose*.yaml"))
SIDECAR_CONFIGS = [
    *sorted((ROOT / "deploy/kubernetes").rglob("config.yaml")),
    ROOT / "deploy/compose/sidecar.yaml",
    ROOT / "deploy/compose/sidecar.test.yaml",
]


def kustomize(path: Path) -> str:
    exe = kubectl()
    if exe is None:
        msg = (
            "KUBECTL IS NOT INSTALLED: the kustomize overlays in deploy/kubernetes were NOT rendered or validated "
            "(install kubectl >= 1.27 to check them)"
        )
        warnings.warn(msg, stacklevel=2)
        pytest.skip(msg)
    r = run(exe, "kustomize", str(path))
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[p.name for p in KUSTOMIZATIONS])
def test_each_kustomization_renders_valid_kubernetes_1_29(path: Path) -> None:
    stream = kustomize(path)
    r = kubernetes_validate(stream)
    assert r.returncode == 0, r.stdout + r.stderr
    objs = objects(stream)
    dep = next(o for o in objs if o["kind"] == "Deployment" and "initContainers" in o["spec"]["template"]["spec"])
    spec = dep["spec"]["template"]["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    # The ConfigMap the pod mounts is the generated one (its name carries the content's hash).
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert spec["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]


def test_the_example_upstream_is_a_headless_service_so_each_pod_is_an_endpoint() -> None:
    objs = objects(kustomize(ROOT / "deploy/kubernetes/base"))
    service = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "orders")
    assert service["spec"]["clusterIP"] == "None"  # a ClusterIP would hide the pods behind one address
    pods = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "orders")
    labels = pods["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    config = yaml.safe_load((ROOT / "deploy/kubernetes/base/config.yaml").read_text())
    assert config["upstreams"]["orders"]["endpoints"] == ["orders:8080"]


@pytest.mark.parametrize(
    "path", SIDECAR_CONFIGS, ids=[str(p.relative_to(ROOT / "deploy")) for p in SIDECAR_CONFIGS]
)
def test_each_shipped_sidecar_config_passes_sidecar_check(path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", COMPOSE, ids=[p.name for p in COMPOSE])
def test_each_compose_file_follows_the_compose_spec(path: Path) -> None:
    r = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_compose_spec_check_refuses_a_misspelt_key(tmp_path: Path) -> None:
    """Guards the check above: an unknown key is an error."""
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a: {image: x, helthcheck: {test: [CMD, 'true']}}\n")
    r = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad))
    assert r.returncode != 0


def test_the_compose_app_reaches_the_sidecar_on_loopback_and_waits_for_it() -> None:
    services = yaml.safe_load((ROOT / "deploy/compose/compose.yaml").read_text())["services"]
    assert services["app"]["network_mode"] == "service:sidecar"
    assert services["app"]["depends_on"]["sidecar"]["condition"] == "service_healthy"
    assert services["sidecar"]["depends_on"]["mongo"]["condition"] == "service_healthy"
    assert services["sidecar"]["read_only"] and services["sidecar"]["cap_drop"] == ["ALL"]

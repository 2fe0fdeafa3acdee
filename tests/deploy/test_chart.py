"""The Helm chart, linted strictly and rendered by Helm's own SDK (helm-python-sdk), every object validated
against the Kubernetes 1.29 schemas (kubernetes-validate --strict), and the rendered pod checked for what
makes it a native sidecar: an init container with restartPolicy Always, probes on the admin port, a strict
securityContext, a termination grace longer than the drain, and a config `sidecar check` accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import load_text

from .tools import CHART, VALUES_FILES, kubernetes_validate, load_values, objects, render, run, tool

CASES = [None, *VALUES_FILES]
IDS = ["defaults", *(p.stem for p in VALUES_FILES)]


def the(kind: str, objs: list[dict[str, Any]], component: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in objs
        if o["kind"] == kind
        and (component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def sidecar_config(objs: list[dict[str, Any]]) -> str:
    return the("ConfigMap", objs)["data"]["config.yaml"]


def test_the_chart_lints_strictly() -> None:
    import helm_python

    result = helm_python.lint(str(CHART), strict=True, kube_version="v" + "1.29.0")
    assert not result["errors"], result
    assert all(m["severity"] < 2 for m in result["messages"]), result["messages"]  # info at most


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_every_rendered_object_is_valid_kubernetes_1_29(values_file: Path | None) -> None:
    stream = render(load_values(values_file))
    r = kubernetes_validate(stream)
    assert r.returncode == 0, r.stdout + r.stderr
    # Every object checked, but the ServiceMonitor: a CRD, no schema in Kubernetes' own (asserted below).
    core = [o for o in objects(stream) if o["kind"] != "ServiceMonitor"]
    assert r.stdout.count("passed for resource") == len(core), r.stdout


def test_the_validator_refuses_a_misspelt_field() -> None:
    """Guards the check above: an unknown field in the pod spec is an error, not a pass."""
    stream = render(load_values(CHART / "ci" / "example-values.yaml"))
    bad = stream.replace("restartPolicy: Always", "restartPolicy: Always\n          restartPolcy: Always", 1)
    r = kubernetes_validate(bad)
    assert r.returncode != 0, r.stdout


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_the_rendered_config_passes_sidecar_check(values_file: Path | None, tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(sidecar_config(objects(render(load_values(values_file)))))
    r = subprocess.run(
        [sys.executable, "-m", "sidecar", "check", "-c", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    admin = yaml.safe_load(r.stdout)["admin"]
    assert admin["listen"] == "0.0.0.0:9901"  # the admin port on the pod's address, for probes and scrapes
    assert admin["console_allow"] == []  # the console for loopback (kubectl port-forward) only
    assert admin["console_hosts"] == []  # under an IP address or localhost only


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=[p.stem for p in VALUES_FILES])
def test_the_example_pod_runs_the_sidecar_as_a_native_sidecar(values_file: Path) -> None:
    objs = objects(render(load_values(values_file)))
    pod = the("Deployment", objs, "example")["spec"]["template"]
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # KEP-753: starts before the app, stops after it
    config = load_text(sidecar_config(objs), {})
    admin_port = int(config.admin.listen.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"admin": admin_port}
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    for listener in config.listeners:
        assert listener.listen.startswith("127.0.0.1:"), listener  # the app reaches it inside the pod only
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sidecar["resources"]["requests"]["cpu"] and sidecar["resources"]["requests"]["memory"]
    assert spec["terminationGracePeriodSeconds"] > config.shutdown.grace  # the drain completes first
    mount = sidecar["volumeMounts"][0]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == the("ConfigMap", objs)["metadata"]["name"]
    assert "checksum/retry-sidecar-config" in pod["metadata"]["annotations"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(admin_port)


def test_a_config_change_changes_the_checksum_that_rolls_the_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        dep = the("Deployment", objects(render(values)), "example")
        return dep["spec"]["template"]["metadata"]["annotations"]["checksum/retry-sidecar-config"]

    base = {"example": {"enabled": True}}
    changed = {**base, "config": {"policies": {"default": {"extends": "http-default", "max_attempts": 2}}}}
    assert checksum(base) != checksum(changed)


def test_the_example_upstream_is_a_headless_service_the_config_names() -> None:
    objs = objects(render({"example": {"enabled": True}}))
    service = the("Service", objs, "upstream")
    assert service["spec"]["clusterIP"] == "None"  # one address per pod: each an endpoint of the sidecar's
    pods = the("Deployment", objs, "upstream")
    assert service["spec"]["selector"].items() <= pods["spec"]["template"]["metadata"]["labels"].items()
    config = load_text(sidecar_config(objs), {})
    assert config.upstreams["orders"].endpoints == [f"{service['metadata']['name']}:8080"]
    assert config.upstreams["orders"].dns is not None
    kinds = [o["kind"] for o in objects(render({"example": {"enabled": True, "upstream": {"enabled": False}}}))]
    assert kinds.count("Deployment") == 1


def test_the_service_monitor_is_rendered_only_when_asked() -> None:
    kinds = [o["kind"] for o in objects(render({"example": {"enabled": True}}))]
    assert "ServiceMonitor" not in kinds and "Service" in kinds
    kinds = [
        o["kind"]
        for o in objects(render({"example": {"enabled": True}, "serviceMonitor": {"enabled": True}}))
    ]
    assert "ServiceMonitor" in kinds


def test_an_existing_configmap_replaces_the_chart_s_own() -> None:
    objs = objects(render({"example": {"enabled": True}, "existingConfigMap": "my-sidecar-config"}))
    assert "ConfigMap" not in [o["kind"] for o in objs]
    volumes = the("Deployment", objs, "example")["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["configMap"]["name"] == "my-sidecar-config"


def test_values_that_break_the_schema_are_refused() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="adminPort"):
        render({"adminPort": "nine"})
    with pytest.raises(helm_python.HelmError, match="exampel|additional"):
        render({"exampel": {"enabled": True}})


@pytest.mark.parametrize("values_file", [CHART / "values.yaml", *VALUES_FILES], ids=["values", *IDS[1:]])
def test_values_files_match_the_schema(values_file: Path, tmp_path: Path) -> None:
    schema = CHART / "values.schema.json"
    # The ci files hold only overrides: check them merged over the defaults, as Helm does.
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    _merge(merged, yaml.safe_load(values_file.read_text()))
    doc = tmp_path / "values.json"
    doc.write_text(json.dumps(merged))
    r = run(tool("check-jsonschema"), "--schemafile", str(schema), str(doc))
    assert r.returncode == 0, r.stdout + r.stderr


def _merge(into: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


PARENT_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: shop}
spec:
  selector: {matchLabels: {app: shop}}
  template:
    metadata:
      labels: {app: shop}
      annotations:
        {{- include "retry-sidecar.podAnnotations" (dict "Values" (index .Values "retry-sidecar") "Release" .Release) | nindent 8 }}
    spec:
      initContainers:
        {{- include "retry-sidecar.container" (dict "Values" (index .Values "retry-sidecar") "Release" .Release) | nindent 8 }}
      containers:
        - {name: shop, image: "shop:1"}
      volumes:
        {{- include "retry-sidecar.volumes" (dict "Values" (index .Values "retry-sidecar") "Release" .Release) | nindent 8 }}
"""


def test_an_app_chart_adds_the_sidecar_with_the_named_templates(tmp_path: Path) -> None:
    """The README's way for an app's own chart: retry-sidecar as a dependency, its named templates in the pod."""
    import shutil

    import helm_python

    parent = tmp_path / "shop"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "retry-sidecar")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 1.0.0\ndependencies: [{name: retry-sidecar, version: 0.1.0}]\n"
    )
    (parent / "values.yaml").write_text("retry-sidecar: {adminPort: 9911}\n")
    (parent / "templates" / "deployment.yaml").write_text(PARENT_DEPLOYMENT)
    out = helm_python.Chart.load(str(parent)).render(name="shop", namespace="default", is_install=True)
    stream = "\n---\n".join(t for p, t in sorted(out.items()) if p.endswith(".yaml") and t.strip())
    r = kubernetes_validate(stream)
    assert r.returncode == 0, r.stdout + r.stderr
    objs = objects(stream)
    spec = the("Deployment", objs)["spec"]["template"]["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["ports"][0]["containerPort"] == 9911
    cm = the("ConfigMap", objs)  # rendered by the dependency, with the parent's values for it
    assert spec["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    assert "0.0.0.0:9911" in cm["data"]["config.yaml"]


def test_the_grafana_dashboard_is_rendered_only_when_asked_with_the_label_grafana_watches() -> None:
    def dashboards(values: dict[str, Any] | None) -> list[dict[str, Any]]:
        return [o for o in objects(render(values)) if o["metadata"]["name"].endswith("-dashboard")]

    assert dashboards(None) == []
    values = {"example": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
    r = kubernetes_validate(render(values))
    assert r.returncode == 0, r.stdout + r.stderr
    (cm,) = dashboards(values)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "retry-sidecar.json").read_text())
    assert (
        json.loads(cm["data"]["retry-sidecar.json"]) == shipped
    )  # the file, whole (tests/integration/console)
    (cm,) = dashboards(
        {
            "grafanaDashboard": {
                "enabled": True,
                "label": "dashboards",
                "labelValue": "sre",
                "namespace": "monitoring",
            }
        }
    )
    assert cm["metadata"]["labels"]["dashboards"] == "sre" and cm["metadata"]["namespace"] == "monitoring"


def test_console_allow_and_console_hosts_reach_the_sidecar_s_config() -> None:
    values = {"consoleAllow": ["10.0.0.0/8"], "consoleHosts": ["sidecar.orders.svc"]}
    config = load_text(sidecar_config(objects(render(values))), {})
    assert config.admin.console_allow == ["10.0.0.0/8"] and config.admin.listen == "0.0.0.0:9901"
    assert config.admin.console_hosts == ["sidecar.orders.svc"]

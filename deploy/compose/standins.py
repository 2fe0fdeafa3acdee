"""Local stand-ins for the compose file's images that cannot be pulled in CI, run from the sidecar's own image
with the standard library (and PyYAML, which the sidecar has):

    python standins.py traces --port 4318          an OTLP/HTTP trace receiver that counts what it gets
    python standins.py scrape --target sidecar:9901  scrapes /metrics every second, as Prometheus would
    python standins.py grafana --port 3000         reads Grafana's provisioning as Grafana would: the data
                                                   sources, and the dashboards from each file provider's path

Each answers ``GET /-/ready`` (200 once it has received traces / scraped once / found a dashboard) and
``GET /stats`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["traces", "scrape", "grafana"])
    p.add_argument("--port", type=int, default=4318)
    p.add_argument("--target", default="sidecar:9901")
    args = p.parse_args()
    stats: dict[str, object] = {"requests": 0, "bytes": 0, "scrapes": 0, "last_scrape": ""}
    lock = threading.Lock()
    if args.role == "grafana":
        stats.update(provisioned(Path("/etc/grafana/provisioning")))

    def ready() -> bool:
        if args.role == "grafana":
            return bool(stats["dashboards"])
        return stats["scrapes"] > 0 if args.role == "scrape" else True

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/v1/traces":
                return self.answer(404, b"not found\n", "text/plain")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                stats["requests"] += 1
                stats["bytes"] += len(body)
            # An empty ExportTraceServiceResponse (protobuf): everything accepted.
            self.answer(200, b"", "application/x-protobuf")

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/-/ready":
                ok = ready()
                self.answer(200 if ok else 503, b"ready\n" if ok else b"not yet\n", "text/plain")
            elif self.path == "/stats":
                with lock:
                    body = json.dumps(stats).encode()
                self.answer(200, body, "application/json")
            else:
                self.answer(404, b"not found\n", "text/plain")

        def answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet, as aiohttp's was
            pass

    def scrape() -> None:
        while True:
            try:
                with urllib.request.urlopen(f"http://{args.target}/metrics", timeout=5) as r:
                    text = r.read().decode()
                with lock:
                    stats["scrapes"] += 1
                    stats["last_scrape"] = "\n".join(
                        line for line in text.splitlines() if line.startswith("sidecar_requests_total")
                    )
            except (urllib.error.URLError, OSError) as e:
                print(f"scrape failed: {e}", flush=True)
            time.sleep(1)  # Prometheus' own interval: a scrape a second

    if args.role == "scrape":
        threading.Thread(target=scrape, daemon=True).start()
    server = ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    print(f"{args.role} on :{args.port}", flush=True)
    server.serve_forever()


def provisioned(root: Path) -> dict[str, object]:
    """What Grafana would load from its provisioning directory: the data sources' names and URLs, and each
    dashboard (title, uid, panels) found under a file provider's path."""
    sources, dashboards = [], []
    for f in sorted((root / "datasources").glob("*.yaml")):
        for ds in yaml.safe_load(f.read_text()).get("datasources", []):
            sources.append({"name": ds["name"], "type": ds["type"], "url": ds.get("url")})
    for f in sorted((root / "dashboards").glob("*.yaml")):
        for provider in yaml.safe_load(f.read_text()).get("providers", []):
            for d in sorted(Path(provider["options"]["path"]).glob("*.json")):
                doc = json.loads(d.read_text())
                panels = [p for p in doc.get("panels", []) if p.get("type") != "row"]
                dashboards.append({"title": doc["title"], "uid": doc["uid"], "panels": len(panels)})
    return {"datasources": sources, "dashboards": dashboards}


if __name__ == "__main__":
    main()

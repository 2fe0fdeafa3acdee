"""Local stand-ins for the compose file's images that cannot be pulled in CI, run from the sidecar's own image
(aiohttp is in it):

    python standins.py traces --port 4318          an OTLP/HTTP trace receiver that counts what it gets
    python standins.py scrape --target sidecar:9901  scrapes /metrics every second, as Prometheus would
    python standins.py grafana --port 3000         reads Grafana's provisioning as Grafana would: the data
                                                   sources, and the dashboards from each file provider's path

Each answers ``GET /-/ready`` (200 once it has received traces / scraped once / found a dashboard) and
``GET /stats`` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["traces", "scrape", "grafana"])
    p.add_argument("--port", type=int, default=4318)
    p.add_argument("--target", default="sidecar:9901")
    args = p.parse_args()
    stats: dict[str, object] = {"requests": 0, "bytes": 0, "scrapes": 0, "last_scrape": ""}
    if args.role == "grafana":
        stats.update(provisioned(Path("/etc/grafana/provisioning")))
    app = web.Application()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        stats["requests"] += 1
        stats["bytes"] += len(body)
        # An empty ExportTraceServiceResponse (protobuf): everything accepted.
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def ready(request: web.Request) -> web.Response:
        if args.role == "grafana":
            ok = bool(stats["dashboards"])
        else:
            ok = stats["scrapes"] > 0 if args.role == "scrape" else True
        return web.Response(status=200 if ok else 503, text="ready\n" if ok else "not yet\n")

    async def show(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(stats), content_type="application/json")

    async def scraper(app: web.Application) -> None:  # a background task for the app's lifetime
        async def loop() -> None:
            async with aiohttp.ClientSession() as http:
                while True:
                    try:
                        async with http.get(f"http://{args.target}/metrics") as r:
                            text = await r.text()
                            if r.status == 200:
                                stats["scrapes"] += 1
                                stats["last_scrape"] = "\n".join(
                                    line
                                    for line in text.splitlines()
                                    if line.startswith("sidecar_requests_total")
                                )
                    except aiohttp.ClientError as e:
                        print(f"scrape failed: {e}", flush=True)
                    await asyncio.sleep(1)

        task = asyncio.create_task(loop())
        yield
        task.cancel()

    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/stats", show)
    if args.role == "scrape":
        app.cleanup_ctx.append(scraper)
    web.run_app(
        app,
        host="0.0.0.0",
        port=args.port,
        print=lambda *_: print(f"{args.role} on :{args.port}", flush=True),
    )


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

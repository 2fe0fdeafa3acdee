"""The figure of a report (matplotlib, Agg: no display needed): one panel per strategy, over time,
offered load, upstream attempts and goodput (requests per second) and server in-flight, outage shaded.

matplotlib is the ``plot`` extra (``pip install retry-sidecar[plot]``; ``make install`` has it).
"""

from __future__ import annotations

from pathlib import Path

from .report import Report


class PlotUnavailable(RuntimeError):
    pass


def save(report: Report, path: str | Path, title: str | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "plots need matplotlib: pip install 'retry-sidecar[plot]' (make install has it)"
        ) from None
    sc = report.scenario
    n = len(report.results)
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.6 * n + 0.6), sharex=True, squeeze=False)
    limit = sc.server.limit * sc.server.replicas
    for ax, res in zip(axes[:, 0], report.results, strict=True):
        secs = res.record.seconds
        t = [i + 0.5 for i in range(len(secs))]
        ax.plot(t, [s.offered for s in secs], color="0.55", lw=1.2, label="offered (client requests/s)")
        ax.plot(t, [s.attempts for s in secs], color="tab:red", lw=1.2, label="upstream attempts/s")
        ax.plot(t, [s.ok for s in secs], color="tab:green", lw=1.6, label="goodput (ok/s)")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("per second")
        right = ax.twinx()
        right.plot(t, [s.inflight for s in secs], color="tab:blue", lw=1, ls="--", label="server in-flight")
        right.axhline(limit, color="tab:blue", lw=0.6, ls=":")
        right.set_yscale("symlog", linthresh=10)
        right.set_ylim(bottom=0)
        right.set_ylabel("in flight", color="tab:blue")
        if sc.outage is not None:
            ax.axvspan(sc.outage.start, sc.outage.end, color="0.9", zorder=0)
        s = res.summary
        verdict = (
            ""
            if sc.outage is None
            else (f"recovered in {s.recovery_s:.0f} s" if s.recovered else "did not recover")
        )
        ax.set_title(f"{res.strategy}  {verdict}", loc="left", fontsize=10)
        handles = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
    fig.legend(
        handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="lower center", ncol=4, frameon=False
    )
    axes[-1, 0].set_xlabel("seconds" + ("" if sc.outage is None else f"  (shaded: {sc.outage.mode})"))
    fig.suptitle(title or f"{sc.name} ({report.engine} engine)", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out

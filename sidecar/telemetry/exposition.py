"""The Prometheus text exposition format (0.0.4): metric families, the registry ``/metrics`` serves, and
their text.

Written here rather than taken from prometheus_client because importing any part of that package runs its
``__init__``, which imports its push gateway and its WSGI, ASGI and HTTP servers (``http.server``,
``urllib.request``, ``wsgiref``, ``email``, ...): 2.4 to 3 MB of every pod's memory (issue 27) for code the
sidecar never runs. The sidecar keeps its numbers itself (``metrics.py``) and needs only families and their
text, a format that has not changed since 2014. The classes keep prometheus_client's names for what they
share (``add_metric``, ``samples`` of ``Sample(name, labels, value)``, ``collect()``,
``get_sample_value()``), and ``tests/unit/test_exposition.py`` checks the text byte for byte against
prometheus_client's ``generate_latest`` and reads it back with its parser.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Sample(NamedTuple):
    """prometheus_client's first three fields (the sidecar writes no timestamps or exemplars)."""

    name: str
    labels: dict[str, str]
    value: float


class Family:
    """One metric family: its name (a counter's without ``_total``), help text, type, and samples."""

    __slots__ = ("name", "documentation", "type", "samples", "_labelnames")

    def __init__(self, name: str, documentation: str, kind: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.type = kind
        self.samples: list[Sample] = []
        self._labelnames = tuple(labels)

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name}: {len(values)} label values for labels {self._labelnames}")
        return dict(zip(self._labelnames, values, strict=True))


class CounterFamily(Family):
    __slots__ = ()

    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] = ()
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append(Sample(self.name + "_total", self._labels(labels), value))


class GaugeFamily(Family):
    __slots__ = ()

    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] = ()
    ) -> None:
        super().__init__(name, documentation, "gauge", labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value))


class HistogramFamily(Family):
    __slots__ = ()

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, documentation, "histogram", labels)

    def add_metric(
        self, labels: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float
    ) -> None:
        """``buckets``: cumulative counts by upper bound as written (``"0.5"``, ..., ``"+Inf"`` last)."""
        values = self._labels(labels)
        for bound, count in buckets:
            self.samples.append(Sample(self.name + "_bucket", {**values, "le": bound}, count))
        self.samples.append(Sample(self.name + "_count", values, buckets[-1][1]))
        self.samples.append(Sample(self.name + "_sum", values, sum_value))


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


class Registry:
    """The collectors whose families ``/metrics`` serves, in the order they were registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Family]:
        for collector in self._collectors:
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A sample's value, or None if there is no such sample (a scan of everything: for tests)."""
        want = labels or {}
        for family in self.collect():
            for s in family.samples:
                if s.name == name and s.labels == want:
                    return s.value
        return None


def render(families: Iterable[Family]) -> bytes:
    """The families in the text format: ``# HELP`` and ``# TYPE`` then a line per sample, labels sorted by
    name; a counter family is named with its ``_total``."""
    out: list[str] = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        for s in family.samples:
            if s.labels:
                pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{pairs}}} {_number(s.value)}\n")
            else:
                out.append(f"{s.name} {_number(s.value)}\n")
    return "".join(out).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    """A value as Go's Prometheus writes it: ``+Inf``, ``-Inf``, ``NaN``, and exponent form from 1e7 up."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to the exponent form sooner than Python's repr
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s

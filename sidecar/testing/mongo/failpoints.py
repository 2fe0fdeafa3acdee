"""The ``failCommand`` fail point, in the real server's shape.

``{configureFailPoint: "failCommand", mode: "alwaysOn" | "off" | {times: n} | {skip: n},
   data: {failCommands: [...], errorCode, errorLabels, errmsg, closeConnection, blockConnection, blockTimeMS,
          writeConcernError, appName}}``

One extension, for the 2026 revision of Client Backpressure: ``data.baseBackoffMS`` is copied into the error
document (servers that push back send it there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class FailPointError(ValueError):
    pass


@dataclass
class FailCommand:
    commands: frozenset[str]
    times: int | None  # None: always on
    skip: int = 0
    error_code: int | None = None
    error_labels: list[str] | None = None
    errmsg: str = "Failing command via 'failCommand' failpoint"
    close_connection: bool = False
    block_ms: float = 0.0
    write_concern_error: dict[str, Any] | None = None
    base_backoff_ms: float | None = None
    app_name: str | None = None
    hits: int = field(default=0)

    @classmethod
    def from_command(cls, cmd: Mapping[str, Any]) -> FailCommand | None:
        mode = cmd.get("mode")
        data = cmd.get("data") or {}
        if mode == "off":
            return None
        times: int | None
        skip = 0
        if mode == "alwaysOn":
            times = None
        elif isinstance(mode, Mapping) and "times" in mode:
            times = int(mode["times"])
        elif isinstance(mode, Mapping) and "skip" in mode:
            times, skip = None, int(mode["skip"])
        else:
            raise FailPointError(f"unsupported fail point mode {mode!r}")
        names = data.get("failCommands")
        if not isinstance(names, list) or not names:
            raise FailPointError("failCommand needs data.failCommands: a list of command names")
        return cls(
            commands=frozenset(names),
            times=times,
            skip=skip,
            error_code=data.get("errorCode"),
            error_labels=list(data["errorLabels"]) if "errorLabels" in data else None,
            errmsg=str(data.get("errmsg", cls.errmsg)),
            close_connection=bool(data.get("closeConnection", False)),
            block_ms=float(data.get("blockTimeMS", 0)) if data.get("blockConnection") else 0.0,
            write_concern_error=dict(data["writeConcernError"]) if "writeConcernError" in data else None,
            base_backoff_ms=data.get("baseBackoffMS"),
            app_name=data.get("appName"),
        )

    def take(self, name: str, app_name: str | None) -> bool:
        """Does this command trigger the fail point? Counts it down when it does."""
        if name not in self.commands:
            return False
        if self.app_name is not None and self.app_name != app_name:
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            if self.times <= 0:
                return False
            self.times -= 1
        self.hits += 1
        return True

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.times <= 0

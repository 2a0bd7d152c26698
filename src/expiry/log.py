"""Logging set-up: one line per event, as text for people or JSON for machines.

Job transitions carry ``policy``, ``run``, ``job`` and ``attempt`` as extra
fields; the text format appends them as key=value, the JSON format as keys.
"""

from __future__ import annotations

import json
import logging
import sys

FIELDS = ("policy", "run", "job", "attempt", "state", "rows", "error", "worker", "delay")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [
            f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None
        ]
        return f"{line} {' '.join(extras)}" if extras else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update({k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None})
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure(fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("expiry")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False

"""Structured JSON logs: one object per line, with `extra=` fields as keys.

Log shippers (Loki, Cloud Logging) index these fields; `kubectl logs` stays readable with
`--log-format text` for local debugging.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                timestamp=False,
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf's per-object loggers are chatty at DEBUG; keep them at our level.
    logging.getLogger("kopf").setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # kopf reports every successful handler call (our wake-up runs on each watch event).
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, root.level))

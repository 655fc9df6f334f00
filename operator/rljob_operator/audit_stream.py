"""The controller's audit log in cluster mode: the local mode's JSONL records on the log stream.

One record per controller event, under the logger `rljob.audit`, written as the bare JSON
line (not wrapped by the JSON log formatter) so that `kubectl logs POD | rljob audit JOB`
reads exactly what local mode's `inference_controller.jsonl` holds; `source` also names the
namespace. `--audit-log-file` appends the same lines to a file (e.g. on a mounted volume),
which outlives the pod's log.
"""

from __future__ import annotations

import logging
import sys

from controller_runtime.audit import INFERENCE_CONTROLLER, AuditWriter

AUDIT_LOGGER = "rljob.audit"


def configure_audit(file_path: str | None = None) -> None:
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.propagate = False  # never wrapped by the root's formatter
    logger.setLevel(logging.INFO)  # recorded whatever --log-level says
    bare = logging.Formatter("%(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file_path:
        handlers.append(logging.FileHandler(file_path, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(bare)
    logger.handlers[:] = handlers


def job_audit(namespace: str, job: str) -> AuditWriter:
    logger = logging.getLogger(AUDIT_LOGGER)
    return AuditWriter(
        job, lambda line: logger.info("%s", line), INFERENCE_CONTROLLER, source_extra={"namespace": namespace}
    )

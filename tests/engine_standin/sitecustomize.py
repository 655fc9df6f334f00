"""Test-only dispatcher: turns some engine pods of a test into stand-ins or crashers.

Engine pods run `python -m vllm.entrypoints.openai.api_server ...` (the manifest builder's
command, unchanged). A test puts this directory on the pod's PYTHONPATH through
spec.inference.env; at interpreter start, before vLLM is imported, this reads the pod name
(`<job>-cell-<i>-g<gen>-<p>`) and:
- `RLJOB_STANDIN_CELLS` ("all" or "1,2,3"): those cells serve the light stand-in
  (rljob_engine_standin.py here) instead of vLLM;
- `RLJOB_CRASH_CELLS` ("all" or "0"): those cells exit with status 1 at once (crash loop).
Any other process (a real vLLM cell, vLLM's own children) is left alone.
"""

import os
import re
import sys


def _listed(var: str, index: str) -> bool:
    value = os.environ.get(var, "")
    return value == "all" or index in {v.strip() for v in value.split(",") if v.strip()}


def _dispatch() -> None:
    m = re.search(r"-cell-(\d+)-g\d+-\d+$", os.environ.get("POD_NAME", ""))
    if m is None or not sys.argv or sys.argv[0] != "-m" or os.environ.get("RLJOB_STANDIN_CHILD"):
        return
    index = m.group(1)
    if _listed("RLJOB_CRASH_CELLS", index):
        print(f"crash-loop stand-in: cell {index} exits", file=sys.stderr, flush=True)
        os._exit(1)
    if _listed("RLJOB_STANDIN_CELLS", index):
        os.environ["RLJOB_STANDIN_CHILD"] = "1"
        from rljob_engine_standin import serve

        serve(sys.argv[1:], index)
        os._exit(0)


_dispatch()

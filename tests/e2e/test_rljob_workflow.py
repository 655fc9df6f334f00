"""The user's workflow with a job: `kubectl apply -f` an RLJob, watch `kubectl get rlj` reach
Ready, read engine health and the weight version in `kubectl describe rlj`, lose an engine
and watch the cell come back. Real helm, kubectl and operator processes on the test cluster;
the four engines are light stand-ins (tests/engine_standin) started from the manifest
builder's own vLLM command line. The trainer is played by the test through the real
trainer-side client (`InferenceControllerClient`) with a ServiceAccount token bound to the
chart's `<release>-control` ClusterRole, exactly as the README tells users to do.

Timings (apply -> 4/4 Ready, kill -> replacement pod Running) are printed, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import yaml
from rljob_client.controller_client import InferenceControllerClient

from tests.cluster.fixtures import wait_for
from tests.e2e.conftest import API_PORT, PID_ANNOTATION, OperatorRelease, pid_alive
from tests.e2e.rljob_manifest import e2e_rljob

JOB = "llama-8b-grpo"  # the example's name
CELLS = 4
TRAINER_SA = "rljob-trainer"  # the example's spec.trainer.serviceAccountName


# -- reading kubectl's text ---------------------------------------------------------------


def get_row(release: OperatorRelease) -> dict[str, str]:
    """`kubectl get rlj JOB` as {column: value} (the CRD's printer columns)."""
    lines = release.kubectl("get", "rlj", JOB).stdout.splitlines()
    header, row = lines[0], lines[1]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    cols = {}
    for i, name in enumerate(names):
        end = starts[i + 1] if i + 1 < len(starts) else None
        cols[name] = row[starts[i]:end].strip()
    return cols


def describe(release: OperatorRelease) -> str:
    return release.kubectl("describe", "rlj", JOB).stdout


def describe_engines(text: str) -> dict[str, dict[str, Any]]:
    """The `Engines:` list of `kubectl describe rlj` as {cell name: {field: value}}.

    kubectl prints each list item's fields sorted by name, four spaces in; an item starts at
    its first field, `Consecutive Failures`. `Pods:` is followed by its items six spaces in.
    """
    section = text.split("\n  Engines:\n", 1)[1]
    engines: list[dict[str, Any]] = []
    current_list: str | None = None
    for line in section.splitlines():
        if not line.startswith("    "):  # back at the status level: the list is over
            break
        m = re.match(r"^ {4}(\S[^:]*):\s*(.*)$", line)
        if m:
            key, value = m.group(1), m.group(2).strip()
            if key == "Consecutive Failures":
                engines.append({})
            engines[-1][key] = value
            current_list = key if value == "" else None
            continue
        if current_list and line.startswith("      "):
            item = line.strip()
            prev = engines[-1][current_list]
            engines[-1][current_list] = [*prev, item] if isinstance(prev, list) else [item]
    return {e["Name"]: e for e in engines}


def events_text(release: OperatorRelease) -> str:
    return release.kubectl("get", "events", "--field-selector", f"involvedObject.name={JOB}",
                           "--sort-by=.metadata.creationTimestamp").stdout


# -- the trainer's side -------------------------------------------------------------------


def bind_trainer(release: OperatorRelease) -> str:
    """The README's recipe: a ServiceAccount for the trainer, bound to `<release>-control`; its token."""
    release.kubectl("create", "serviceaccount", TRAINER_SA)
    release.kubectl("create", "rolebinding", f"{TRAINER_SA}-control", f"--clusterrole={release.name}-control",
                    f"--serviceaccount={release.namespace}:{TRAINER_SA}")
    return release.kubectl("create", "token", TRAINER_SA).stdout.strip()


async def push_weights(base_url: str, namespace: str, token: str, version: str) -> list[str]:
    """One weight update as a trainer does it: open the window, reload every engine, close it.

    Returns the cells that took part.
    """
    client = InferenceControllerClient(base_url, JOB, namespace, token=token, token_file=None,
                                       holder="trainer-0", retry_timeout=30)
    try:
        async with client.update_weights(weight_version=version) as window, aiohttp.ClientSession() as http:
            for engine in window.engines:
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": f"/checkpoints/v{version}"}}
                async with http.post(f"{engine.endpoint}/collective_rpc", json=rpc) as r:
                    r.raise_for_status()
                async with http.post(f"{engine.endpoint}/update_weight_version", json={"new_version": version}) as r:
                    r.raise_for_status()
            return [e.cell for e in window.engines]
    finally:
        await client.close()


def control_status(url: str, token: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- the shared first half: apply, Ready, leader ------------------------------------------


def apply_and_wait_ready(release: OperatorRelease) -> tuple[float, list[dict[str, str]]]:
    """kubectl apply the job; seconds until `kubectl get rlj` shows Running 4/4, and the rows seen."""
    manifest = yaml.safe_dump(e2e_rljob())
    t0 = time.monotonic()
    out = release.kubectl("apply", "-f", "-", input=manifest).stdout
    assert f"rljob.rljob.io/{JOB} created" in out
    rows: list[dict[str, str]] = []

    def ready() -> bool:
        row = get_row(release)
        if not rows or rows[-1] != {k: v for k, v in row.items() if k != "AGE"}:
            rows.append({k: v for k, v in row.items() if k != "AGE"})
        return row["PHASE"] == "Running" and row["READY"] == f"{CELLS}/{CELLS}"

    wait_for(ready, timeout=180, interval=0.25, what=f"kubectl get rlj {JOB}: Running {CELLS}/{CELLS}")
    return time.monotonic() - t0, rows


def leader_url(release: OperatorRelease) -> str:
    pods = wait_for(lambda: release.running_pods(2), timeout=120, what="2 Running operator pods")
    leader = release.wait_leader(pods)
    return f"http://{leader['status']['podIP']}:{API_PORT}"


# -- the tests ----------------------------------------------------------------------------


def test_applied_rljob_becomes_ready_and_describe_shows_engines_weights_and_events(
    operator: OperatorRelease,
) -> None:
    seconds, rows = apply_and_wait_ready(operator)
    print(f"\n[e2e] kubectl apply -> {CELLS}/{CELLS} Ready: {seconds:.1f} s; rows seen: {rows}")
    assert list(rows[-1]) == ["NAME", "PHASE", "READY", "WEIGHTS", "ROLLOUT", "QUEUE", "PASS@1"]
    assert rows[-1]["NAME"] == JOB

    text = describe(operator)
    engines = describe_engines(text)
    assert sorted(engines) == [f"{JOB}-cell-{i}" for i in range(CELLS)]
    pods = json.loads(operator.kubectl("get", "pods", "-l", f"rljob.io/job={JOB},rljob.io/role=engine",
                                       "-o", "json").stdout)["items"]
    ip_of = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    for name, e in engines.items():
        assert e["State"] == "Serving", e
        assert e["Consecutive Failures"] == "0" and e["Restarts"] == "0", e
        (pod,) = e["Pods"]
        assert pod == f"{name}-g0-0"
        assert e["Endpoint"] == f"http://{ip_of[pod]}:8000"  # the stand-in listens on the pod IP
        assert e["Last Probe Time"].endswith("Z")
    for pattern in (r"^  Phase:\s+Running$", r"^  Ready:\s+4/4$", r"^    Reason:\s+AllEnginesServing$",
                    r"^    Reason:\s+NoFailures$"):
        assert re.search(pattern, text, re.M), (pattern, text)
    assert re.search(r"Normal\s+CellServing\s+.*\[llama-8b-grpo-cell-0\] Starting -> Serving", text), text

    # A ServiceAccount without the binding is refused by the controller API; bound, it may update.
    url = leader_url(operator)
    cells_url = f"{url}/apis/control.rljob.io/v1alpha1/namespaces/{operator.namespace}/rljobs/{JOB}/cells"
    stranger = operator.kubectl("create", "token", "default").stdout.strip()
    status, body = control_status(cells_url, stranger)
    assert status == 403 and body["reason"] == "Forbidden", body
    assert f"system:serviceaccount:{operator.namespace}:default may not update rljobs/control" in body["error"]

    token = bind_trainer(operator)
    took_part = asyncio.run(push_weights(url, operator.namespace, token, "1"))
    assert sorted(took_part) == sorted(engines)

    wait_for(lambda: get_row(operator)["WEIGHTS"] == "1", timeout=30, what="kubectl get rlj: WEIGHTS 1")
    text = describe(operator)
    # What a person sees (shown with `pytest -s`; the assertions are above and below).
    print("\n[e2e] $ kubectl get rlj\n" + operator.kubectl("get", "rlj").stdout)
    print(f"[e2e] $ kubectl describe rlj {JOB}\n{text}")
    assert re.search(r"^  Weight Version:\s+1$", text, re.M), text
    for e in describe_engines(text).values():
        assert e["State"] == "Serving" and e["Weight Version"] == "1", e
    assert re.search(r"Normal\s+WeightsUpdated\s+.*weights updated to v1", text), text


def test_killed_engine_is_replaced_and_rejoins_after_the_next_weight_update(operator: OperatorRelease) -> None:
    apply_and_wait_ready(operator)
    url = leader_url(operator)
    token = bind_trainer(operator)
    asyncio.run(push_weights(url, operator.namespace, token, "1"))
    wait_for(lambda: get_row(operator)["WEIGHTS"] == "1", timeout=30, what="WEIGHTS 1")

    victim_cell, victim_pod = f"{JOB}-cell-2", f"{JOB}-cell-2-g0-0"
    pod = json.loads(operator.kubectl("get", "pod", victim_pod, "-o", "json").stdout)
    pid = int(pod["metadata"]["annotations"][PID_ANNOTATION])
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    seen: list[tuple[str, str, str]] = []  # (state, restarts, pods) of the victim, as describe showed them
    seen_at: list[float] = []  # seconds after the kill when each was first seen

    def replaced() -> bool:
        e = describe_engines(describe(operator))[victim_cell]
        now = (e["State"], e["Restarts"], ",".join(e.get("Pods") or []))
        if not seen or seen[-1] != now:
            seen.append(now)
            seen_at.append(time.monotonic() - killed_at)
        return e["State"] == "PendingWeights" and e["Restarts"] == "1"

    wait_for(replaced, timeout=90, interval=0.1, what=f"{victim_cell} PendingWeights with 1 restart")
    new_pod = f"{JOB}-cell-2-g1-0"
    fresh = operator.cluster.wait_pod(operator.namespace, new_pod,
                                      lambda p: p.status.phase == "Running" and PID_ANNOTATION in (p.metadata.annotations or {}),
                                      timeout=60, what=f"replacement pod {new_pod} Running")
    timeline = ", ".join(f"{state}/{pods} at +{t:.1f} s" for (state, _, pods), t in zip(seen, seen_at, strict=True))
    print(f"\n[e2e] engine kill -> describe showed {victim_cell}: {timeline}; "
          f"replacement pod {new_pod} started {fresh.status.start_time}")

    assert not pid_alive(pid)
    states = [s for s, _, _ in seen]
    assert "Unhealthy" in states, seen
    assert states.index("Unhealthy") < states.index("PendingWeights"), seen
    assert seen[-1] == ("PendingWeights", "1", new_pod), seen
    assert get_row(operator)["READY"] == f"{CELLS - 1}/{CELLS}"  # out of serving until new weights

    text = describe(operator)
    assert re.search(rf"Warning\s+CellUnhealthy\s+.*\[{victim_cell}\] Serving -> Unhealthy: pod failed", text), text
    assert re.search(rf"Normal\s+CellReplaced\s+.*\[{victim_cell}\] generation 0 -> 1 \(restart 1 of 5\)", text), text
    assert re.search(rf"\[{victim_cell}\] Starting -> PendingWeights: engine answered; waiting for the next weight update",
                     text), text
    assert re.search(r"^  Restarts Total:\s+1$", text, re.M), text

    # The next weight update brings the new cell into serving at the new version.
    took_part = asyncio.run(push_weights(url, operator.namespace, token, "2"))
    assert victim_cell in took_part
    wait_for(lambda: get_row(operator)["READY"] == f"{CELLS}/{CELLS}" and get_row(operator)["WEIGHTS"] == "2",
             timeout=30, what="READY 4/4 at WEIGHTS 2")
    e = describe_engines(describe(operator))[victim_cell]
    assert (e["State"], e["Restarts"], e["Generation"], e["Weight Version"]) == ("Serving", "1", "1", "2"), e

    story = events_text(operator)
    for reason in ("CellUnhealthy", "CellsUnhealthy", "CellReplaced", "CellPendingWeights", "WeightsUpdated"):
        assert reason in story, (reason, story)
    assert re.search(rf"\[{victim_cell}\] PendingWeights -> Serving: weights 2", story), story


"""One process that answers as the engine on every pod address of a namespace: the stand-in
for a fleet of thousands of engine pods (bench/scale_bench.py).

Why: a stand-in process per pod (rljob_engine_standin.py run by the agent) costs ~40 MiB and a
Python start each; 8,000 of them do not fit on this machine, and a fleet benchmark measures the
operator, not the engines. Here one aiohttp application (the stand-in's own routes,
`make_app`, one shared `EngineState`: every address reports the same engine) listens on
`<podIP>:<port>` of each pod of the namespace as soon as the pod has an address, and stops
listening when the pod goes. Pods are followed with a watch (after a list), so an address is
served within a watch event of kwok giving the pod its IP, like an engine that starts at once.

Only loopback addresses are ever bound (pod IPs of the loopback layout of tests/cluster); any
other address is skipped with a message, so this never listens on a real network.

    python tests/engine_standin/rljob_standin_fleet.py --kubeconfig K --namespace NS [--port 8000]

Prints `fleet ready` once the first list is served, then `serving N` whenever the count of
addresses changes (at most once a second).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import sys
import threading
import time
from collections.abc import Sequence

from aiohttp import web
from kubernetes import client, config, watch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from rljob_engine_standin import EngineState, make_app


def servable(ip: str | None) -> bool:
    """Whether `ip` may be bound: a loopback address (the test cluster's pod layout)."""
    if not ip:
        return False
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


class Fleet:
    """The sites of one shared app, one per pod address, kept in step with the pods."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port
        self.sites: dict[str, web.TCPSite] = {}  # ip -> site
        self.owner: dict[str, str] = {}  # pod name -> ip
        self.skipped: set[str] = set()

    async def pod_seen(self, name: str, ip: str | None, gone: bool) -> None:
        if gone or not ip:
            old = self.owner.pop(name, None)
            if old and old not in self.owner.values() and old in self.sites:
                await self.sites.pop(old).stop()
            return
        if not servable(ip):
            if ip not in self.skipped:
                self.skipped.add(ip)
                print(f"not binding non-loopback address {ip} of pod {name}", flush=True)
            return
        self.owner[name] = ip
        if ip not in self.sites:
            site = web.TCPSite(self.runner, ip, self.port, reuse_address=True)
            try:
                await site.start()
            except OSError as e:
                print(f"cannot listen on {ip}:{self.port}: {e}", flush=True)
                return
            self.sites[ip] = site


def follow_pods(
    api: client.CoreV1Api,
    namespace: str,
    loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue[tuple[str, str | None, bool] | None],
) -> None:
    """List then watch the namespace's pods (in a thread); hand (name, ip, gone) to the loop."""

    def put(item: tuple[str, str | None, bool] | None) -> None:
        loop.call_soon_threadsafe(events.put_nowait, item)

    while True:
        listing = api.list_namespaced_pod(namespace, _preload_content=False)
        body = json.loads(listing.data)
        for pod in body.get("items") or []:
            put((pod["metadata"]["name"], (pod.get("status") or {}).get("podIP"), False))
        put(None)  # the list is in
        rv = body["metadata"]["resourceVersion"]
        try:
            for ev in watch.Watch().stream(
                api.list_namespaced_pod,
                namespace,
                resource_version=rv,
                timeout_seconds=240,
                deserialize=False,
            ):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    break
                meta = obj.get("metadata") or {}
                gone = ev["type"] == "DELETED" or bool(meta.get("deletionTimestamp"))
                put((meta.get("name", ""), (obj.get("status") or {}).get("podIP"), gone))
        except Exception as e:  # a broken watch: list again
            print(f"watch ended: {e!r}", flush=True)


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(EngineState(model=args.model)), access_log=None)
    await runner.setup()
    fleet = Fleet(runner, args.port)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, str | None, bool] | None] = asyncio.Queue()
    api = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    threading.Thread(target=follow_pods, args=(api, args.namespace, loop, events), daemon=True).start()
    announced, last_count, last_print = False, -1, 0.0
    while True:
        item = await events.get()
        if item is None:
            if not announced:
                print("fleet ready", flush=True)
                announced = True
            continue
        await fleet.pod_seen(*item)
        now = time.monotonic()
        if len(fleet.sites) != last_count and now - last_print >= 1.0:
            last_count, last_print = len(fleet.sites), now
            print(f"serving {last_count}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="standin")
    args = p.parse_args(argv)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()

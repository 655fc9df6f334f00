"""The `rljob` command: `rljob run MANIFEST` (local mode), `rljob status` (a job on a cluster) and
`rljob audit` (a job's history from audit records: a local run's logs or the operator's log)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rljob", description="Run RLJob manifests locally, or look at jobs on a cluster.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a manifest on this machine: local vLLM engines, Ray, executor, trainer")
    r.add_argument("manifest", type=Path, help="RLJob manifest (YAML), e.g. examples/tiny-cpu.yaml")
    r.add_argument("--out", type=Path, help="output directory (default: rljob-runs/<job>)")
    r.add_argument("--steps", type=int, help="training steps (default: spec.trainer.reference.steps)")
    r.add_argument("--trainer-process", action="store_true",
                   help="run the trainer as `python -m rljob_client.trainer` over the HTTP controller API and Ray "
                        "Client, exactly as in a trainer pod (default: in this process)")
    r.add_argument("--metrics-port", type=int, default=0,
                   help="serve the trainer's Prometheus /metrics on 127.0.0.1:PORT (the executor's: its data_url)")
    r.add_argument("--env-file", type=Path, default=None,
                   help="NAME=value lines: values of spec env entries that read a Secret or ConfigMap (valueFrom)")
    r.add_argument("-v", "--verbose", action="store_true", help="log controller and trainer details")
    s = sub.add_parser("status", help="show an RLJob's engines, weight version and lock from the cluster")
    s.add_argument("name")
    s.add_argument("-n", "--namespace", default=None)
    s.add_argument("--kubeconfig", default=None)
    a = sub.add_parser("audit", help="print a job's history from audit records (local logs, a file, kubectl logs)")
    a.add_argument("name", help="the RLJob's name")
    a.add_argument("source", nargs="?", default="-",
                   help="a local run's logs dir, a JSONL file or saved `kubectl logs` output; - (default): stdin")
    a.add_argument("-n", "--namespace", default=None, help="only records of this namespace (cluster mode)")
    a.add_argument("--type", action="append", default=[], help="only records of this type (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "status":
        from rljob_cli.status import status

        return status(args.name, args.namespace, args.kubeconfig)
    if args.command == "audit":
        from rljob_cli.audit import audit

        return audit(args.name, args.source, args.namespace, args.type)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # controller events are shown by the progress display already
        logging.getLogger("controller_runtime").setLevel(logging.ERROR)
    from rljob_cli.run import RunOptions, run

    out = args.out or Path("rljob-runs") / args.manifest.stem
    code = run(RunOptions(manifest=args.manifest, out=out, steps=args.steps, cwd=Path.cwd(),
                           trainer_process=args.trainer_process, metrics_port=args.metrics_port,
                           env_file=args.env_file))
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        # Every child process is gone by now; a thread still blocked in a Ray client call
        # would only hold the interpreter's exit.
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

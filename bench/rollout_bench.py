"""The executor's single-turn path before and after the rollout-function API, and generation
while a slow synchronous reward runs.

    .venv/bin/python bench/rollout_bench.py [--rounds 3] [--rollouts 4] [--before d122bc8] [--json-out FILE]

One stand-in engine process on loopback (tests/engine_standin, `--standin-delay`), and per
measurement a fresh executor process: `after` imports this tree's rollout_executor, `before`
the `--before` commit's (extracted with `git archive` into a temporary directory, nothing
checked out). Rounds interleave before and after so the shared machine's load falls on both.

  samples/s   `rollouts` rollouts of 8 prompts x 8 samples, token_set_fraction (a built-in,
              scored inline), engine delay 0; and the executor process's CPU time per sample
              (process_time), which the machine's other load moves far less than wall time
  gen/s       completions per second until every sample of one rollout (2 prompts x 8) was
              generated, engine delay 0.2 s, with a fast reward and with a 1-s synchronous
              reward (`slow_reward`; after: in the default 2 reward workers)

Prints one JSON object, then a one-line summary (after/before samples/s, gen/s with the 1-s reward).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "engine_standin" / "rljob_engine_standin.py"
PROMPTS, SAMPLES = 8, 8
SLOW_PROMPTS = 2  # the 1-s reward runs: 16 samples (before, each one holds the loop for 1 s)


def slow_reward(sample: Any, seconds: float = 1.0) -> float:
    """A reward like a sandboxed run or a judge call: a second of blocking work."""
    time.sleep(seconds)
    return 0.5


CHILD = r"""
import asyncio, json, sys, time
from rollout_executor.config import EngineSource, ExecutorConfig
from rollout_executor.executor import RolloutExecutor
url, dataset, rollouts, reward, prompts, samples = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
args = {"vocab_size": 1000} if reward.endswith("token_set_fraction") else {"seconds": 1.0}
cfg = ExecutorConfig(job="bench", dataset_path=dataset, model="standin", n_samples_per_prompt=samples, batch_size=prompts,
                     max_tokens=16, reward_function=reward, reward_args=args, concurrency=64,
                     engines=EngineSource(endpoints=(url,)), max_staleness=100)

async def main():
    ex = RolloutExecutor(cfg)
    await ex.start()
    await ex.get_batch(0)  # warm-up: connections, model name, reward workers
    n = prompts * samples
    t0 = time.perf_counter()
    if rollouts == 0:  # generation only: until every sample of one rollout was generated
        base = ex.generator.stats.completed
        ex.generate(1)
        while ex.generator.stats.completed - base < n:
            await asyncio.sleep(0.005)
        took = time.perf_counter() - t0
        await ex.close()
        print(json.dumps({"gen_per_s": n / took}))
        return
    c0 = time.process_time()
    for r in range(1, rollouts + 1):
        await ex.get_batch(r)
    took = time.perf_counter() - t0
    cpu = time.process_time() - c0
    await ex.close()
    print(json.dumps({"samples_per_s": rollouts * n / took, "cpu_ms_per_sample": 1000 * cpu / (rollouts * n)}))

asyncio.run(main())
"""


def start_standin(port: int, delay: float, log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    p = subprocess.Popen([sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(port), "--standin-delay", str(delay)],
                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while "serving" not in log.read_text():
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"stand-in engine did not start: {log.read_text()}")
        time.sleep(0.1)
    return p


def run_child(tree: Path, url: str, dataset: Path, rollouts: int, reward: str, prompts: int = PROMPTS) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "executor_image"), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(dataset), str(rollouts), reward, str(prompts), str(SAMPLES)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode:
        raise RuntimeError(f"executor child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--before", default="d122bc8")
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    from rollout_executor.rayhead import free_port

    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp_s:
        tmp = Path(tmp_s)
        before = tmp / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.before, "executor_image", "controller_runtime"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        dataset = tmp / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": f"q{i}", "label": "x"}) + "\n" for i in range(64)))
        fast_port, slow_port = free_port(), free_port()
        engines = [start_standin(fast_port, 0.0, tmp / "fast.log"), start_standin(slow_port, 0.2, tmp / "slow.log")]
        fast, slow = f"http://127.0.0.1:{fast_port}", f"http://127.0.0.1:{slow_port}"
        trees = {"before": before, "after": ROOT}
        builtin, sleepy = "rollout_executor.rewards:token_set_fraction", "bench.rollout_bench:slow_reward"
        res: dict[str, list[float]] = {}
        try:
            for _ in range(a.rounds):
                for name, tree in trees.items():
                    r = run_child(tree, fast, dataset, a.rollouts, builtin)
                    res.setdefault(f"{name}_samples_per_s", []).append(r["samples_per_s"])
                    res.setdefault(f"{name}_cpu_ms_per_sample", []).append(r["cpu_ms_per_sample"])
                    g = run_child(tree, slow, dataset, 0, builtin, SLOW_PROMPTS)
                    res.setdefault(f"{name}_gen_per_s_fast_reward", []).append(g["gen_per_s"])
                    s = run_child(tree, slow, dataset, 0, sleepy, SLOW_PROMPTS)
                    res.setdefault(f"{name}_gen_per_s_1s_reward", []).append(s["gen_per_s"])
        finally:
            for p in engines:
                p.kill()
                p.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"runs": res, "median": med, "ratio_samples_per_s": med["after_samples_per_s"] / med["before_samples_per_s"],
           "ratio_cpu_per_sample": med["after_cpu_ms_per_sample"] / med["before_cpu_ms_per_sample"],
           "rounds": a.rounds, "rollouts": a.rollouts, "prompts": PROMPTS, "samples": SAMPLES, "before": a.before}
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))
    print(f"samples/s after/before {out['ratio_samples_per_s']:.3f}x ({med['after_samples_per_s']:.0f} vs "
          f"{med['before_samples_per_s']:.0f}), executor CPU per sample {out['ratio_cpu_per_sample']:.3f}x "
          f"({med['after_cpu_ms_per_sample']:.3f} vs {med['before_cpu_ms_per_sample']:.3f} ms); gen/s with a 1-s sync reward: after {med['after_gen_per_s_1s_reward']:.1f} "
          f"(fast reward {med['after_gen_per_s_fast_reward']:.1f}), before {med['before_gen_per_s_1s_reward']:.1f} "
          f"(fast reward {med['before_gen_per_s_fast_reward']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The pure parts of `rljob`: manifest errors and paths, the summary, the progress lines, the vLLM command."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rljob_cli import report
from rljob_cli.manifest import ManifestError, ensure_model, load_manifest, resolve_paths
from rljob_cli.progress import Progress, engines_text
from rljob_cli.status import render
from rljob_cli.vllm_process import VLLMArgs, vllm_command, vllm_env
from rljob_client.trainer.loop import StepRecord

from controller_runtime.api.status import EngineStatus
from controller_runtime.events import ControllerEvent

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"


def record(step: int, reward: float) -> StepRecord:
    return StepRecord(step=step, weight_version=step + 1, reward_mean=reward, reward_std=0.1, loss=0.0,
                      samples=64, response_tokens=1024, step_seconds=0.5)


def test_summary_compares_the_first_and_last_five_steps() -> None:
    s = report.summarize([record(i, 0.1 * i) for i in range(12)], job="j")
    assert s["steps"] == 12 and s["weight_versions"] == list(range(1, 13))
    assert s["first5_mean_reward"] == pytest.approx(0.2)
    assert s["last5_mean_reward"] == pytest.approx(0.9)
    assert s["reward_gain"] == pytest.approx(0.7)
    assert s["job"] == "j" and len(s["per_step"]) == 12


def test_summary_and_curve_are_written_atomically(tmp_path: Path) -> None:
    records = [record(i, 0.1 + 0.05 * i) for i in range(6)]
    path = report.write_summary(tmp_path, report.summarize(records))
    assert json.loads(path.read_text())["steps"] == 6
    png = report.plot_rewards(tmp_path, records, "t")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reward_curve.png", "summary.json"]


def test_an_empty_run_has_no_means() -> None:
    s = report.summarize([])
    assert s["first5_mean_reward"] is None and s["reward_gain"] is None


def test_relative_paths_become_absolute_and_a_missing_dataset_names_the_field(tmp_path: Path) -> None:
    manifest = load_manifest(EXAMPLE)
    resolved = resolve_paths(manifest, REPO)
    assert resolved.spec.model.path == str(REPO / ".cache" / "tiny-model")
    assert resolved.spec.rollout.dataset.path == str(REPO / "examples" / "data" / "tiny-prompts.jsonl")
    assert resolved.spec.rollout.dataset.label_field == manifest.spec.rollout.dataset.label_field  # untouched
    with pytest.raises(ManifestError, match=r"spec\.rollout\.dataset\.path: examples/data/tiny-prompts\.jsonl does not exist"):
        resolve_paths(manifest, tmp_path)


def test_a_manifest_without_rollout_is_refused_by_local_mode_naming_the_field(tmp_path: Path) -> None:
    """Valid for a cluster (a workloadRef trainer that generates by itself), but local mode has
    nothing to run without an executor."""
    data = yaml.safe_load(EXAMPLE.read_text())
    del data["spec"]["rollout"]
    data["spec"]["trainer"] = {"workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "mine"}}
    path = tmp_path / "no-rollout.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match=r"spec\.rollout: local mode runs the rollout executor"):
        resolve_paths(load_manifest(path), REPO)


def test_validation_errors_name_the_field(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["spec"]["rollout"]["sampling"]["nSamplesPerPrompt"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match=r"spec\.rollout\.sampling\.nSamplesPerPrompt"):
        load_manifest(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ManifestError, match="expected an RLJob object"):
        load_manifest(bad)
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "absent.yaml")


def test_only_the_toy_model_dir_is_built_when_missing(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"spec\.model\.path"):
        ensure_model(str(tmp_path / "my-model"))


def test_progress_lines_without_a_terminal() -> None:
    out = io.StringIO()
    statuses = [EngineStatus(name="job-cell-0", state="Serving"), EngineStatus(name="job-cell-1", state="Starting")]
    p = Progress(3, lambda: statuses, stream=out)
    p.status("waiting")
    p.status("waiting")  # the same status is printed once
    p.event(ControllerEvent("CellServing", "ready", cell="job-cell-0"))
    p.step(record(0, 0.25))
    p.close()
    text = out.getvalue()
    assert text.count("waiting | engines 1/2 serving (cell-1 Starting)") == 1
    assert "[controller] Normal CellServing [job-cell-0]: ready" in text
    assert "step 1/3: reward 0.250" in text and "weights v1" in text and "128 samples/s" in text
    assert engines_text([]) == "0/0 serving"


def test_vllm_command_and_env() -> None:
    cmd = vllm_command(VLLMArgs(model="/m", port=8123, tokenizer="/t", extra_args=("--seed", "3"), python="py"))
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--tokenizer") + 1] == "/t"
    assert cmd[-2:] == ["--seed", "3"] and "--enforce-eager" in cmd
    env = vllm_env({"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "2"}, {"EXTRA": "1"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # control routes on
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the caller's setting wins over the default
    assert env["EXTRA"] == "1" and env["PATH"] == "/bin"


def test_status_render_shows_engines_and_lock() -> None:
    text = render("toy", "ns", {"status": {
        "phase": "Running", "ready": "1/2", "weightVersion": "7", "rolloutId": 6,
        "lock": {"holder": "trainer-0", "since": "2026-01-01T00:00:00Z", "expires": "2026-01-01T00:10:00Z"},
        "engines": [{"name": "toy-cell-0", "state": "Serving", "generation": 1, "weightVersion": "7"},
                    {"name": "toy-cell-1", "state": "Unhealthy", "message": "probe failed"}],
    }})
    assert "RLJob ns/toy: Running  ready 1/2  weights v7  rollout 6" in text
    assert "held by trainer-0" in text and "probe failed" in text


def test_local_mode_runs_a_trainer_command_with_a_trainer_pods_environment(tmp_path: Path) -> None:
    import sys

    from rljob_cli.capacity import local_mode_problems
    from rljob_cli.run import local_command, trainer_env

    from controller_runtime.api.spec import RLJobSpec

    byo = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "byo-trainer.yaml").spec
    assert byo.trainer.command and not local_mode_problems(byo, 64 * 2**30)
    data = byo.model_dump(by_alias=True, exclude_none=True)
    data["trainer"].pop("command")
    data["trainer"]["workloadRef"] = {"apiVersion": "batch/v1", "kind": "Job", "name": "t"}
    problems = local_mode_problems(RLJobSpec.model_validate(data), 64 * 2**30)
    assert any(p.startswith("spec.trainer.workloadRef: local mode runs the trainer itself") for p in problems)
    env = trainer_env(byo, "byo", tmp_path, 7, "http://127.0.0.1:1", "/tok", "ray://127.0.0.1:2",
                      tmp_path / "steps.jsonl", overlap=False)
    from rljob_client.env import read

    sdk = read(env)
    assert (sdk.name, sdk.steps, sdk.weights_dir, sdk.weight_update_method) == ("byo", 7, tmp_path / "weights", "disk")
    assert env["LEARNING_RATE"] == "0.003" and env["RLJOB_EXECUTOR_PYTHON"].count(".") == 2
    assert local_command(["python", "t.py", "--x"]) == [sys.executable, "t.py", "--x"]
    assert local_command(["/bin/train"]) == ["/bin/train"]

"""Local mode and pod settings: env values it honours (plain, or from an env file), the rest refused by name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from rljob_cli.capacity import LocalModeError, check_local_mode
from rljob_cli.manifest import ManifestError
from rljob_cli.podsettings import EnvFileError, parse_env_file, pod_settings_problems, process_env
from rljob_cli.run import read_env_file

from controller_runtime.api import RLJobManifest
from controller_runtime.api.spec import EnvVar, RLJobSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
SECRET = {"secretKeyRef": {"name": "hf", "key": "token"}}


def tiny(**edits: Any) -> RLJobSpec:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    for role, fields in edits.items():
        manifest["spec"][role].update(fields)
    return RLJobManifest.model_validate(manifest).spec


def test_the_tiny_example_has_no_pod_setting_problem() -> None:
    assert pod_settings_problems(tiny(), {}) == []


def test_env_file_lines() -> None:
    text = "# tokens\n\nHF_TOKEN=hf_abc\nexport WANDB_API_KEY='k=1'\nEMPTY=\n"
    assert parse_env_file(text) == {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k=1", "EMPTY": ""}
    with pytest.raises(EnvFileError, match="line 2: expected NAME=value"):
        parse_env_file("A=1\nnot a pair\n")


def test_plain_env_passes_and_secret_env_comes_from_the_env_file() -> None:
    env = [EnvVar(name="A", value="1"), EnvVar.model_validate({"name": "HF_TOKEN", "valueFrom": SECRET})]
    assert process_env("inference", env, {"HF_TOKEN": "hf_abc"}) == ({"A": "1", "HF_TOKEN": "hf_abc"}, [])
    values, problems = process_env("inference", env, {})
    assert values == {"A": "1"}
    assert problems == [
        "spec.inference.env HF_TOKEN reads a Secret, which local mode cannot (no API server); "
        "put `HF_TOKEN=...` in an env file and pass it with `rljob run --env-file FILE`"
    ]


def test_node_affinity_selector_and_templates_are_refused_naming_the_field() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    spec = tiny(
        inference={"placement": {"affinity": affinity}, "template": {"spec": {"schedulerName": "volcano"}}},
        trainer={"placement": {"nodeSelector": {"zone": "a"}}},
    )
    problems = "\n".join(pod_settings_problems(spec, {}))
    assert "spec.inference.placement.affinity: local mode runs on this one machine; remove it" in problems
    assert "spec.trainer.placement.nodeSelector: local mode runs on this one machine; remove it" in problems
    assert "spec.inference.template.spec (schedulerName): local mode runs processes, not pods" in problems


def test_template_with_metadata_only_is_harmless() -> None:
    assert pod_settings_problems(tiny(trainer={"template": {"metadata": {"labels": {"team": "rl"}}}}), {}) == []


def test_check_local_mode_lists_pod_problems_with_the_machine_ones() -> None:
    spec = tiny(trainer={"env": [{"name": "WANDB_API_KEY", "valueFrom": SECRET}]})
    with pytest.raises(LocalModeError, match=r"spec\.trainer\.env WANDB_API_KEY reads a Secret"):
        check_local_mode(spec, 64 * 2**30)
    check_local_mode(spec, 64 * 2**30, {"WANDB_API_KEY": "k"})


def test_run_reads_the_env_file_and_names_it_when_broken(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.env", tmp_path / "bad.env"
    good.write_text("HF_TOKEN=x\n")
    bad.write_text("HF_TOKEN\n")
    assert read_env_file(good) == {"HF_TOKEN": "x"}
    assert read_env_file(None) == {}
    with pytest.raises(ManifestError, match=re.escape(f"{bad} line 1")):
        read_env_file(bad)
    with pytest.raises(ManifestError, match=r"--env-file .*missing\.env"):
        read_env_file(tmp_path / "missing.env")

"""What local mode makes of the pod settings of a manifest: env it honours, the rest it refuses.

Local mode runs processes on one machine, not pods: it has no Secrets or ConfigMaps to read,
no nodes to select and no pod to merge a template into. Plain `env` values are passed to the
engine and trainer processes; an entry whose value comes from a Secret or ConfigMap
(`valueFrom`) takes its value from an env file (`rljob run --env-file`, `NAME=value` lines)
instead; the rest is refused with a message saying what to change, as for GPUs. Pure: the
caller reads the file.
"""

from __future__ import annotations

from controller_runtime.api.spec import EnvVar, Placement, RLJobSpec


class EnvFileError(ValueError):
    """An env file line that is not `NAME=value`."""


def parse_env_file(text: str, source: str = "env file") -> dict[str, str]:
    """`NAME=value` lines (blank lines and `#` comments skipped; `export ` and one pair of quotes allowed)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise EnvFileError(f"{source} line {number}: expected NAME=value, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[name] = value
    return out


def _source(env: EnvVar) -> str:
    kinds = {"secretKeyRef": "a Secret", "configMapKeyRef": "a ConfigMap", "fieldRef": "a pod field",
             "resourceFieldRef": "a container resource", "fileKeyRef": "a file in a volume"}  # fmt: skip
    return next((text for key, text in kinds.items() if key in (env.value_from or {})), "a valueFrom source")


def process_env(role: str, env: list[EnvVar], env_file: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(variables for the role's processes, problems): plain values as they are, valueFrom entries from the env file."""
    values: dict[str, str] = {}
    problems = []
    for e in env:
        if e.value_from is None:
            values[e.name] = e.value
        elif e.name in env_file:
            values[e.name] = env_file[e.name]
        else:
            problems.append(
                f"spec.{role}.env {e.name} reads {_source(e)}, which local mode cannot (no API server); "
                f"put `{e.name}=...` in an env file and pass it with `rljob run --env-file FILE`"
            )
    return values, problems


def _placement_problems(role: str, placement: Placement) -> list[str]:
    problems = []
    if placement.node_selector:
        problems.append(f"spec.{role}.placement.nodeSelector: local mode runs on this one machine; remove it")
    if placement.affinity:
        problems.append(f"spec.{role}.placement.affinity: local mode runs on this one machine; remove it")
    return problems


def pod_settings_problems(spec: RLJobSpec, env_file: dict[str, str]) -> list[str]:
    """Everything pod-level in the spec that local mode cannot honour; empty when it can run it."""
    problems = []
    for role, env in (("inference", spec.inference.env), ("trainer", spec.trainer.env)):
        problems += process_env(role, env, env_file)[1]
    problems += _placement_problems("inference", spec.inference.placement)
    problems += _placement_problems("trainer", spec.trainer.placement)
    templates = (("inference", spec.inference.template), ("trainer", spec.trainer.template),
                 ("rollout", spec.rollout.template if spec.rollout is not None else None))  # fmt: skip
    for role, template in templates:
        if template is not None and template.spec:
            fields = ", ".join(sorted(template.spec))
            hint = "" if role == "rollout" else f" (plain variables go in spec.{role}.env, Secrets' values in an env file)"
            problems.append(
                f"spec.{role}.template.spec ({fields}): local mode runs processes, not pods, and cannot apply a pod "
                f"template; remove it for local runs{hint}"
            )
    return problems

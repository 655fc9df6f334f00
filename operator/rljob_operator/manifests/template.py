"""Merge a role's pod template (`spec.<role>.template`) into the pod the operator built.

The rules KubeRay and JobSet users expect from a strategic merge:

* maps (labels, nodeSelector, resources, securityContext...) merge key by key, the template's
  value winning;
* lists of named things merge by their key: containers and initContainers by name (matching
  entries merge field by field, new ones are added), env, volumes and imagePullSecrets by
  name, ports by containerPort, volumeMounts by mountPath (a matching entry is replaced
  whole: a volume cannot keep the operator's source beside the template's);
* other lists (tolerations, envFrom) are appended; `affinity` is replaced whole (its terms
  are ORed, so appending would loosen it);
* any other field set in the template replaces the operator's default.

What the operator must keep (its command, ports, probes, GPU count, restart policy, DNS names)
is refused before it gets here (`controller_runtime.api.podtemplate.OWNED`), so nothing set
in a template is dropped. Pod labels the operator sets win: its own are under rljob.io/
(refused in a template) plus app.kubernetes.io/managed-by.
"""

from __future__ import annotations

import copy
from typing import Any

from controller_runtime.api.podtemplate import PodTemplate

# list field -> (key of its items, whether a matching item merges field by field or is replaced)
KEYED_LISTS: dict[str, tuple[str, bool]] = {
    "containers": ("name", True),
    "initContainers": ("name", True),
    "ports": ("containerPort", True),
    "env": ("name", False),
    "volumes": ("name", False),
    "volumeMounts": ("mountPath", False),
    "imagePullSecrets": ("name", False),
    "hostAliases": ("ip", False),
    "readinessGates": ("conditionType", False),
}
REPLACED_WHOLE = {"affinity"}


def merge(base: Any, overlay: Any, field: str = "") -> Any:
    """`overlay` merged over `base` by the rules above (neither is modified)."""
    if isinstance(base, dict) and isinstance(overlay, dict) and field not in REPLACED_WHOLE:
        out = dict(base)
        for key, value in overlay.items():
            out[key] = merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(overlay, list):
        if field in KEYED_LISTS:
            key, deep = KEYED_LISTS[field]
            return _merge_keyed(base, overlay, key, deep)
        return [*base, *copy.deepcopy(overlay)]
    return copy.deepcopy(overlay)


def _merge_keyed(base: list[Any], overlay: list[Any], key: str, deep: bool) -> list[Any]:
    out = list(base)
    index = {item.get(key): i for i, item in enumerate(out) if isinstance(item, dict)}
    for item in overlay:
        at = index.get(item.get(key)) if isinstance(item, dict) else None
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = merge(out[at], item) if deep else copy.deepcopy(item)
    return out


def apply_template(
    labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any], template: PodTemplate | None
) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """(labels, annotations, pod spec) of the operator's pod with the role's template merged in."""
    if template is None:
        return labels, annotations, spec
    merged_labels = {**template.metadata.labels, **labels}
    merged_annotations = {**template.metadata.annotations, **annotations}
    return merged_labels, merged_annotations, merge(spec, template.spec)

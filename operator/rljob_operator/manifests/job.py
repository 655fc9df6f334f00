"""The RLJob as the manifest builders see it, and the metadata every child object shares.

Builders take the RLJob object as kopf hands it over (`{"metadata": ..., "spec": ...}`),
with `spec` either the raw camelCase dict or an already parsed `RLJobSpec`; `JobView`
normalises both once so that each builder reads typed fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller_runtime.api.spec import RLJobSpec
from rljob_operator import labels as L
from rljob_operator.kinds import API_VERSION, KIND


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    uid: str
    spec: RLJobSpec

    @classmethod
    def of(cls, job: Mapping[str, Any] | JobView) -> JobView:
        if isinstance(job, JobView):
            return job
        meta = job.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise ValueError("RLJob object without metadata.name")
        spec = job.get("spec")
        if not isinstance(spec, RLJobSpec):
            spec = RLJobSpec.model_validate(spec or {})
        return cls(
            name=name, namespace=meta.get("namespace") or "default", uid=meta.get("uid") or "", spec=spec
        )

    def owner_reference(self) -> dict[str, Any]:
        """Controller owner reference: deleting the RLJob garbage-collects the child.

        blockOwnerDeletion makes a foreground deletion of the RLJob wait for its children.
        The uid is required by the API server; a job without one (not yet stored) cannot own.
        """
        if not self.uid:
            raise ValueError(
                f"RLJob {self.namespace}/{self.name} has no metadata.uid; owner references need it"
            )
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(
        self,
        name: str,
        role: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """metadata of a child object: name, namespace, labels, owner reference."""
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": {**L.job_labels(self.name, role), **(labels or {})},
            "annotations": {L.JOB_NAME_ANNOTATION: self.name, **(annotations or {})},
            "ownerReferences": [self.owner_reference()],
        }
        return meta

    def service_host(self, service: str) -> str:
        """In-cluster DNS name of a Service of this job's namespace."""
        return f"{service}.{self.namespace}.svc"

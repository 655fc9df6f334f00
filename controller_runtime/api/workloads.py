"""The trainer workloads a `spec.trainer.workloadRef` may name, and how each tells it finished.

One row per kind: the CRD's admission rule (`WORKLOAD_REF_RULE`), the pydantic validator and
the operator's reading of the workload's outcome (`rljob_operator.reconcile.workload_ref`) all
come from this table, so a kind is supported everywhere or nowhere. Adding a kind is a row: its
apiVersion, kind, REST resource, and the condition types its controller sets when it succeeds,
fails or is suspended (read from the controllers' API types: batch/v1 `JobComplete`,
JobSet `JobSetCompleted`, Kubeflow Trainer `TrainJobComplete`, training-operator `JobSucceeded`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadKind:
    """A kind the operator can follow to its end through its status conditions."""

    api_version: str
    kind: str
    plural: str  # the REST resource, for RBAC and the API path
    succeeded: str  # the condition type (status True) of a workload that finished well
    failed: str  # ... of one that failed for good
    suspended: str = "Suspended"  # ... of one held (spec.suspend, or Kueue not admitting it yet)

    @property
    def key(self) -> str:
        """`apiVersion kind`, as the admission rule compares it."""
        return f"{self.api_version} {self.kind}"

    @property
    def group(self) -> str:
        """The API group ('' for the core group), as RBAC names it."""
        return self.api_version.rpartition("/")[0]


TRAINER_WORKLOADS: tuple[WorkloadKind, ...] = (
    WorkloadKind("batch/v1", "Job", "jobs", succeeded="Complete", failed="Failed"),
    WorkloadKind("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", succeeded="Completed", failed="Failed"),
    WorkloadKind("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", succeeded="Complete", failed="Failed"),
    WorkloadKind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs", succeeded="Succeeded", failed="Failed"),
)
_BY_KEY = {w.key: w for w in TRAINER_WORKLOADS}


def workload_kind(api_version: str, kind: str) -> WorkloadKind | None:
    """The row of (`api_version`, `kind`), or None when the operator cannot follow that kind."""
    return _BY_KEY.get(f"{api_version} {kind}")


SUPPORTED_TEXT = ", ".join(f"{w.kind} ({w.api_version})" for w in TRAINER_WORKLOADS)
UNSUPPORTED_WORKLOAD_MSG = (
    "spec.trainer.workloadRef must name a kind the operator can follow to its end: one of "
    f"{SUPPORTED_TEXT}; run another kind of trainer inside one of these, or as spec.trainer.command"
)
# CEL on WorkloadRef: the pair is one of the table's (the list literal keeps the cost constant).
WORKLOAD_REF_RULE = "(self.apiVersion + ' ' + self.kind) in [" + ", ".join(f"'{w.key}'" for w in TRAINER_WORKLOADS) + "]"

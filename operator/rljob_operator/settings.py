"""Operator settings: command-line flags over environment variables over defaults.

One frozen model so that every part (kopf wiring, leader election, the controller API,
metrics) reads the same values, and a test can build one without a process environment.
Environment names are `RLJOB_OPERATOR_<FIELD>` (upper case) so the Helm chart can set them
without templating the command line.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENV_PREFIX = "RLJOB_OPERATOR_"
# `k=v,k=v`: label keys (with an optional DNS prefix) and values, comma-separated.
LABELS_PATTERN = r"^([A-Za-z0-9./_-]+=[A-Za-z0-9._-]*(,[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*)*)?$"


def default_identity() -> str:
    """Who holds the lease: the pod name in a cluster (downward API), else host + pid."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{socket.gethostname()}-{os.getpid()}"


class OperatorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[str, ...] = Field((), description="Namespaces to watch; empty with all_namespaces for cluster-wide.")
    all_namespaces: bool = Field(False, description="Watch RLJobs in every namespace (needs a ClusterRole).")
    identity: str = Field(default_factory=default_identity, description="This replica's name in the Lease.")

    api_host: str = Field("0.0.0.0", description="Bind address of the controller API.")
    api_port: int = Field(8080, ge=0, le=65535, description="Port of the controller API (0: pick a free one).")
    metrics_host: str = Field("0.0.0.0", description="Bind address of /metrics and /healthz.")
    metrics_port: int = Field(9090, ge=0, le=65535, description="Port of /metrics and /healthz (0: pick a free one).")

    lease_name: str = Field("rljob-operator-leader", min_length=1)
    lease_namespace: str = Field("", description="Namespace of the Lease; defaults to the first watched namespace or POD_NAMESPACE.")
    lease_duration_seconds: float = Field(15.0, gt=0, description="A standby takes over this long after the last renewal.")
    renew_deadline_seconds: float = Field(10.0, gt=0, description="The leader stops acting if it could not renew for this long.")
    retry_period_seconds: float = Field(2.0, gt=0, description="How often the lease is renewed or tried.")

    operator_namespace: str = Field("", max_length=63, description="The operator's namespace, whose operator pods each job's engine NetworkPolicy admits; defaults to POD_NAMESPACE, else the lease namespace.")
    metrics_scraper_namespace: str = Field("", max_length=63, description="Namespace of the Prometheus that scrapes the jobs' pods; each job's NetworkPolicies admit it to the metrics ports (empty: none).")
    metrics_scraper_labels: str = Field("", pattern=LABELS_PATTERN, description="Pod labels of that Prometheus, `k=v,k=v` (empty: every pod of its namespace).")
    controller_url: str = Field("", description="URL executor and trainer pods use to reach the controller API; defaults to http://rljob-operator.<ns>.svc:<port>.")
    resync_seconds: float = Field(10.0, gt=0, description="Upper bound between two reconcile passes of one job.")
    relist_seconds: float = Field(30.0, gt=0, description="How often one LIST of RLJobs makes up for watch events kopf lost (a new job, a spec edit, a deletion).")
    children_resync_seconds: float = Field(30.0, gt=0, description="How often each job checks that its children (Services, NetworkPolicies, executor, trainer Job) still hold what was applied, and repairs them; a child whose watched version has not moved since it was last seen holding it is not read again (read at least every 30 min).")
    pod_relist_seconds: float = Field(300.0, ge=0, description="Each job reads its engine pods from the operator's pod watch, and checks them against a quorum LIST at least this often (0: a LIST every pass).")
    watch_server_timeout: float = Field(300.0, gt=0, description="Server-side watch timeout: re-list at least this often (kopf settings.watching.server_timeout).")
    watch_client_timeout: float = Field(330.0, gt=0, description="Client-side bound of one watch request; catches a stalled TCP stream.")
    watch_connect_timeout: float = Field(10.0, gt=0, description="TCP connect timeout of watch requests.")
    auth_cache_seconds: float = Field(10.0, ge=0, description="How long a TokenReview/SubjectAccessReview answer is reused.")
    kubeconfig: str | None = Field(None, description="Path to a kubeconfig; in-cluster config when unset.")
    log_level: str = Field("INFO")
    log_format: str = Field("json", pattern="^(json|text)$")
    audit_log_file: str | None = Field(None, description="Also append the audit log (JSONL, logger rljob.audit) to this file.")

    @model_validator(mode="after")
    def _scope(self) -> OperatorSettings:
        if self.all_namespaces and self.namespaces:
            raise ValueError("choose --namespace or --all-namespaces, not both")
        if not self.all_namespaces and not self.namespaces:
            raise ValueError("set --namespace NS (repeatable) or --all-namespaces")
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError("renew deadline must be shorter than the lease duration, or two leaders could overlap")
        if self.retry_period_seconds >= self.renew_deadline_seconds:
            raise ValueError("retry period must be shorter than the renew deadline")
        return self

    @property
    def clusterwide(self) -> bool:
        return self.all_namespaces

    @property
    def effective_lease_namespace(self) -> str:
        if self.lease_namespace:
            return self.lease_namespace
        if self.namespaces:
            return self.namespaces[0]
        return os.environ.get("POD_NAMESPACE", "default")

    @property
    def effective_operator_namespace(self) -> str:
        return self.operator_namespace or os.environ.get("POD_NAMESPACE", "") or self.effective_lease_namespace

    @property
    def metrics_scraper_pod_labels(self) -> dict[str, str]:
        """`metrics_scraper_labels` as a dict."""
        pairs = (kv.split("=", 1) for kv in self.metrics_scraper_labels.split(",") if kv)
        return {k: v for k, v in pairs}

    def watches(self, namespace: str) -> bool:
        return self.all_namespaces or namespace in self.namespaces


_FLAGS: dict[str, str | tuple[str, ...]] = {
    "api_host": ("--controller-api-host", "--api-host"),
    "api_port": ("--controller-api-port", "--api-port"),
    "metrics_host": "--metrics-host",
    "metrics_port": "--metrics-port",
    "identity": "--identity",
    "lease_name": "--lease-name",
    "lease_namespace": "--lease-namespace",
    "lease_duration_seconds": "--lease-duration",
    "renew_deadline_seconds": "--renew-deadline",
    "retry_period_seconds": "--retry-period",
    "operator_namespace": "--operator-namespace",
    "metrics_scraper_namespace": "--metrics-scraper-namespace",
    "metrics_scraper_labels": "--metrics-scraper-labels",
    "controller_url": "--controller-url",
    "resync_seconds": "--resync",
    "relist_seconds": "--relist",
    "children_resync_seconds": "--children-resync",
    "pod_relist_seconds": "--pod-relist",
    "watch_server_timeout": "--watch-server-timeout",
    "watch_client_timeout": "--watch-client-timeout",
    "watch_connect_timeout": "--watch-connect-timeout",
    "auth_cache_seconds": "--auth-cache",
    "kubeconfig": "--kubeconfig",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "audit_log_file": "--audit-log-file",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rljob-operator", description="Run the RLJob operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", help="Watch this namespace (repeatable).")
    scope.add_argument("-A", "--all-namespaces", action="store_true", default=None, help="Watch every namespace.")
    for field, flags in _FLAGS.items():
        names = (flags,) if isinstance(flags, str) else flags
        p.add_argument(*names, dest=field, default=None, help=OperatorSettings.model_fields[field].description)
    return p


def load_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> OperatorSettings:
    """Flags win over `RLJOB_OPERATOR_*` variables, which win over defaults."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for field in OperatorSettings.model_fields:
        raw = env.get(ENV_PREFIX + field.upper())
        if raw is not None and raw != "":
            values[field] = raw
    if "namespaces" in values:
        values["namespaces"] = tuple(n.strip() for n in str(values["namespaces"]).split(",") if n.strip())
    if "all_namespaces" in values:
        values["all_namespaces"] = str(values["all_namespaces"]).lower() in ("1", "true", "yes")
    if "kubeconfig" not in values and env.get("KUBECONFIG"):
        values["kubeconfig"] = env["KUBECONFIG"]
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.namespaces:
        values["namespaces"] = tuple(args.namespaces)
        values["all_namespaces"] = False
    if args.all_namespaces:
        values["all_namespaces"] = True
        values["namespaces"] = ()
    for field in _FLAGS:
        v = getattr(args, field)
        if v is not None:
            values[field] = v
    return OperatorSettings.model_validate(values)

{{- define "rljob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rljob.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rljob.labels" -}}
{{ include "rljob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rljob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rljob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rljob.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- join "," .Values.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Namespaced permissions the operator uses, shared by the ClusterRole and the Roles: exactly
what its code calls (tests/reliability/test_rbac.py keeps it so). Children are server-side
applied (patch, and create when absent) and removed by garbage collection through their owner
reference, so only pods (cells) and the trainer Job (recreated on a template change) are deleted
by the operator; kopf lists, watches and patches RLJobs and posts core/v1 Events. */}}
{{- define "rljob.namespacedRules" -}}
- apiGroups: ["rljob.io"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["rljob.io"]
  resources: ["rljobs/status"]
  verbs: ["patch"]
# Engine pods: watched (kopf) so that a job's loop wakes when its pods run or fail.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete", "patch"]
# Children are applied, and read back by the resync: re-applied only when they drifted; their
# versions are watched (list, watch), so that an unchanged child is not read again.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The job's Ray token Secret: created once, never read back.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Trainers the user runs (spec.trainer.workloadRef): read for their outcome, never written
# (batch/v1 Jobs are covered above). One entry per row of controller_runtime/api/workloads.py.
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "create", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end -}}

{{/* Chart name, overridable. */}}
{{- define "mirrorflow.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix: the release name, with the chart name unless it already has it. */}}
{{- define "mirrorflow.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator's Deployment, Service, (Cluster)Role and their binding. */}}
{{- define "mirrorflow.operatorName" -}}
{{- printf "%s-operator" (include "mirrorflow.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mirrorflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mirrorflow.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mirrorflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "mirrorflow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mirrorflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: mirrorflow
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator image reference: repository, then @digest or :tag (default appVersion). */}}
{{- define "mirrorflow.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs, shared by the ClusterRole and the watchNamespace Role. Only the
verbs it uses: server-side apply is a PATCH, and a PATCH that creates an object also needs
`create`; `delete` is for children a flow no longer needs (the rest go by garbage collection
through owner references).
*/}}
{{- define "mirrorflow.rules" -}}
# Watch MirrorFlows and write their status (no write to spec, no delete).
- apiGroups: [mirrorflow.io]
  resources: [mirrorflows]
  verbs: [get, list, watch]
- apiGroups: [mirrorflow.io]
  resources: [mirrorflows/status]
  verbs: [patch]
# The children of each flow, applied in the flow's namespace. ConfigMaps and StatefulSets are
# watched (by label: list and watch cannot be narrowed to them, so the operator's token can
# read every ConfigMap); Services and PodDisruptionBudgets are only read by name (to leave a
# foreign object of that name alone), applied and deleted.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# The NetworkPolicy in front of each flow's replicator pods (replicatorNetworkPolicy): read by
# name, applied and deleted like the other children.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# Secrets a flow references, one by name: to check they exist and opted in to the flow, for
# the probe's credentials, and to roll pods when they change. No list or watch: the operator
# never needs to see a Secret no flow names.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# Events about flows (new and core API; a repeated Event is a PATCH of its count).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# The Events of a flow's StatefulSet, listed (by field selector, at most 10) only while one
# of its replicator pods is missing: the StatefulSet controller's FailedCreate says why the
# cluster refuses to create it (a quota, a LimitRange, Pod Security, a webhook).
- apiGroups: [""]
  resources: [events]
  verbs: [list]
# A flow's replicator pods, read by name (`<flow>-<ordinal>`) when one is not ready, to say
# why; deleted when its node was lost for replicaReplaceAfterSeconds (only pods its
# StatefulSet controls, by uid). No list or watch.
- apiGroups: [""]
  resources: [pods]
  verbs: [get{{ if gt (int .Values.replicaReplaceAfterSeconds) 0 }}, delete{{ end }}]
{{- end }}

{{/*
A resource list ({cpu: 100m, memory: 1Gi}) as the operator's flags take it: `cpu=100m,memory=1Gi`.
*/}}
{{- define "mirrorflow.quantities" -}}
{{- $pairs := list }}
{{- range $name, $value := . }}
{{- $pairs = append $pairs (printf "%s=%v" $name $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
The replicator NetworkPolicy settings as the operator reads them (JSON): the scrapers allowed
to reach port 9464 (Prometheus-like pods in the named namespaces, the release namespace by
default, plus any extra peers), the egress allow-list and where DNS may be asked.
*/}}
{{- define "mirrorflow.replicatorNetworkPolicy" -}}
{{- $np := .Values.replicatorNetworkPolicy }}
{{- $peers := list }}
{{- range (default (list .Release.Namespace) $np.metrics.namespaces) }}
{{- $peers = append $peers (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .)) "podSelector" $np.metrics.podSelector) }}
{{- end }}
{{- $peers = concat $peers $np.metrics.extraFrom }}
{{- dict "enabled" $np.enabled "metricsFrom" $peers "egressCidrs" $np.egressCidrs "dnsTo" $np.dnsTo | toJson }}
{{- end }}

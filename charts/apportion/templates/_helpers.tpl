{{/* Chart name, truncated to a DNS label. */}}
{{- define "apportion.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, prefixed with the chart name unless it contains it. */}}
{{- define "apportion.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "apportion.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "apportion.selectorLabels" -}}
app.kubernetes.io/name: {{ include "apportion.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "apportion.labels" -}}
{{ include "apportion.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ include "apportion.chart" . }}
{{- end }}

{{- define "apportion.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "apportion.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image; also the default image of ResourceCluster pods. */}}
{{- define "apportion.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Rules for the namespaced objects the operator reads and writes. */}}
{{- define "apportion.namespacedRules" -}}
- apiGroups: ["apportion.dev"]
  resources: ["resourceclusters", "resourceclusters/status"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["apportion.dev"]
  resources: ["resourceworkergroups", "resourceworkergroups/status"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# ResourceJobs: the clusters they make, their submitter pods' logs, their Kueue Workloads.
- apiGroups: ["apportion.dev"]
  resources: ["resourcejobs", "resourcejobs/status"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["apportion.dev"]
  resources: ["resourceclusters"]
  verbs: ["create", "delete"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads", "workloads/status"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
{{- end }}

{{/* Cluster-scoped reads that kopf needs in every mode. */}}
{{- define "apportion.crdRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# The node labels and tolerations of the flavors Kueue admits a ResourceJob with.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
A label selector ({matchLabels, matchExpressions}) with every label value a string, as the
API server wants: `--set ...matchLabels.team=true` gives YAML's boolean otherwise.
*/}}
{{- define "apportion.labelSelector" -}}
{{- with .matchLabels }}
matchLabels:
  {{- range $key, $value := . }}
  {{ $key }}: {{ $value | toString | quote }}
  {{- end }}
{{- end }}
{{- with .matchExpressions }}
matchExpressions:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Names and labels shared by every template. */}}

{{- define "dtrain-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The operator's objects are "<release>-operator" ("dtrain-operator" for `helm install dtrain`),
or the release name when it already ends in "-operator".
*/}}
{{- define "dtrain-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if hasSuffix "-operator" .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "dtrain-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dtrain-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dtrain-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dtrain-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dtrain
{{- end }}

{{- define "dtrain-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dtrain-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dtrain-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespaces that get the trainers' ServiceAccount, one per line: the watched and the listed ones, never the
release namespace (the operator's own, where no job runs). */}}
{{- define "dtrain-operator.trainerNamespaces" -}}
{{- range without (concat .Values.watchNamespaces .Values.trainerServiceAccount.namespaces | uniq) .Release.Namespace }}
{{ . }}
{{- end }}
{{- end }}

{{/* Names and labels shared by every object of the chart. */}}
{{- define "kpssh.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kpssh.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kpssh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kpssh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kpssh.labels" -}}
{{ include "kpssh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kpssh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kpssh.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kpssh.jobNamespace" -}}
{{- default .Release.Namespace .Values.jobExecutor.namespace -}}
{{- end -}}

{{/* The subject every binding grants to. */}}
{{- define "kpssh.subject" -}}
- kind: ServiceAccount
  name: {{ include "kpssh.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

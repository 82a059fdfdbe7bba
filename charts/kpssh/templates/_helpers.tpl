{{/* Names and labels shared by every object of the chart. */}}
{{- define "kpssh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kpssh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
kpssh.annotations renders the metadata annotations of an object, on a new
line at metadata's indent: additionalAnnotations and the object's own (own),
the object's winning; nothing when both are empty. Use it as
`  {{- include "kpssh.annotations" (dict "ctx" .) }}`.
*/}}
{{- define "kpssh.annotations" -}}
{{- with merge (deepCopy (default dict .own)) .ctx.Values.additionalAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end -}}
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

{{/*
kpssh.cidrs checks a list of CIDRs and renders it as NetworkPolicy peers
(ipBlock). Arguments: name (the value's path, for messages), list, why (what
an empty list would cut off). Every entry is an IPv4 (a.b.c.d/n) or IPv6
(hex with at most one ::, /0–128) prefix; anything else fails the render.
*/}}
{{- define "kpssh.cidrs" -}}
{{- if not .list -}}
{{- fail (printf "%s is empty: with networkPolicy.egress.enabled the controller reaches only what is listed; give %s as CIDRs" .name .why) -}}
{{- end -}}
{{- $o := "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])" -}}
{{- $v4 := printf "^(%s[.]){3}%s/(3[0-2]|[12]?[0-9])$" $o $o -}}
{{- $h := "[0-9a-fA-F]{1,4}" -}}
{{- $forms := list "(H:){7}H" "(H:){1,7}:" "(H:){1,6}:H" "(H:){1,5}(:H){1,2}" "(H:){1,4}(:H){1,3}" "(H:){1,3}(:H){1,4}" "(H:){1,2}(:H){1,5}" "H:(:H){1,6}" ":((:H){1,7}|:)" -}}
{{- $v6 := printf "^(%s)/(12[0-8]|1[01][0-9]|[1-9]?[0-9])$" (join "|" $forms | replace "H" $h) -}}
{{- range .list }}
{{- if not (or (regexMatch $v4 .) (regexMatch $v6 .)) -}}
{{- fail (printf "%s: %q is not a CIDR (an IPv4 or IPv6 address with a prefix length, e.g. 192.168.10.0/24, 10.0.0.10/32, fd00::/64)" $.name .) -}}
{{- end }}
- ipBlock:
    cidr: {{ . | quote }}
{{- end -}}
{{- end -}}

{{/* kpssh.ports renders TCP ports of a NetworkPolicy rule; an empty list fails (it would mean every port). */}}
{{- define "kpssh.ports" -}}
{{- if not .list -}}
{{- fail (printf "%s is empty: a rule without ports would open every port" .name) -}}
{{- end -}}
{{- range .list }}
- port: {{ . }}
  protocol: TCP
{{- end -}}
{{- end -}}

{{/*
kpssh.env is the controller's environment as the chart sets it: the options
cmd/controller reads (internal/operator/options and Karpenter core's).
Arguments: ctx (the root context), image (the controller image). The
Deployment appends extraEnv and refuses names that are already here.
*/}}
{{- define "kpssh.env" -}}
{{- $ctx := .ctx -}}
{{- $image := .image -}}
- name: POOL_NAMESPACE
  value: {{ $ctx.Values.poolNamespace | quote }}
- name: EXECUTOR
  value: {{ $ctx.Values.executor | quote }}
{{- if eq $ctx.Values.executor "job" }}
- name: JOB_NAMESPACE
  value: {{ include "kpssh.jobNamespace" $ctx | quote }}
- name: JOB_IMAGE
  value: {{ default $image $ctx.Values.jobExecutor.image | quote }}
- name: JOB_IMAGE_PULL_POLICY
  value: {{ $ctx.Values.image.pullPolicy | quote }}
- name: JOB_TTL
  value: {{ $ctx.Values.jobExecutor.ttl | quote }}
- name: JOB_HOST_NETWORK
  value: {{ $ctx.Values.jobExecutor.hostNetwork | quote }}
- name: JOB_MEMORY_LIMIT
  value: {{ $ctx.Values.jobExecutor.memoryLimit | quote }}
{{- with $ctx.Values.jobExecutor.nodeSelector }}
{{- $sel := list }}
{{- range $k, $v := . }}{{ $sel = append $sel (printf "%s=%s" $k $v) }}{{ end }}
- name: JOB_NODE_SELECTOR
  value: {{ join "," $sel | quote }}
{{- end }}
- name: JOB_ALLOW_MANAGED_NODES
  value: {{ $ctx.Values.jobExecutor.allowManagedNodes | quote }}
{{- end }}
{{- $content := include "kpssh.content" $ctx | fromYaml }}
{{- with $content.rolesPath }}
- name: KPSSH_ROLES_PATH
  value: {{ join ":" . | quote }}
{{- end }}
{{- with $content.collectionsPath }}
- name: KPSSH_COLLECTIONS_PATH
  value: {{ join ":" . | quote }}
{{- end }}
{{- if and (eq $ctx.Values.executor "job") (or $content.volumes $content.initContainers) }}
- name: KPSSH_JOB_CONTENT
  value: {{ pick $content "volumes" "volumeMounts" "initContainers" | toJson | quote }}
{{- end }}
- name: PROBE_INTERVAL
  value: {{ $ctx.Values.probe.interval | quote }}
- name: PROBE_TIMEOUT
  value: {{ $ctx.Values.probe.timeout | quote }}
- name: PROBE_CONCURRENCY
  value: {{ $ctx.Values.probe.concurrency | quote }}
- name: REPAIR_REBOOT_AFTER
  value: {{ $ctx.Values.repair.rebootAfter | quote }}
- name: REPAIR_REPLACE_AFTER
  value: {{ $ctx.Values.repair.replaceAfter | quote }}
- name: METRICS_PORT
  value: {{ $ctx.Values.metrics.port | quote }}
- name: HEALTH_PROBE_PORT
  value: {{ $ctx.Values.healthProbePort | quote }}
{{- with $ctx.Values.settings }}
- name: BATCH_MAX_DURATION
  value: {{ .batchMaxDuration | quote }}
- name: BATCH_IDLE_DURATION
  value: {{ .batchIdleDuration | quote }}
- name: PREFERENCE_POLICY
  value: {{ .preferencePolicy | quote }}
- name: MIN_VALUES_POLICY
  value: {{ .minValuesPolicy | quote }}
{{- with .featureGates }}
{{- $gates := list }}
{{- range $k, $v := . }}{{ $gates = append $gates (printf "%s=%t" $k $v) }}{{ end }}
- name: FEATURE_GATES
  value: {{ join "," $gates | quote }}
{{- end }}
{{- end }}
- name: LOG_LEVEL
  value: {{ $ctx.Values.logLevel | quote }}
- name: DISABLE_LEADER_ELECTION
  value: {{ (not $ctx.Values.leaderElection.enabled) | quote }}
- name: LEADER_ELECTION_NAME
  value: {{ $ctx.Values.leaderElection.name | quote }}
- name: LEADER_ELECTION_NAMESPACE
  value: {{ $ctx.Release.Namespace | quote }}
{{- /* Karpenter core sets Go's soft memory limit to 90 % of MEMORY_LIMIT.
From the request, not the limit: the GC returns the start's burst and keeps
the heap near what the scheduler reserved; the container limit stays the
hard stop (and room for the local executor's ansible-playbook children).
Only a limit set: Kubernetes makes the request equal to it. */}}
{{- $res := $ctx.Values.resources | default dict }}
{{- if or (dig "requests" "memory" "" $res) (dig "limits" "memory" "" $res) }}
- name: MEMORY_LIMIT
  valueFrom:
    resourceFieldRef:
      containerName: controller
      resource: requests.memory
      divisor: "0"
{{- end }}
{{- end -}}

{{/*
kpssh.content is the operator content of the `content` values as YAML:
volumes, volumeMounts and initContainers (the controller's pod and, through
KPSSH_JOB_CONTENT, every phase pod get the same ones at the same paths),
rolesPath and collectionsPath (KPSSH_ROLES_PATH, KPSSH_COLLECTIONS_PATH:
searched after the shipped roles and collection). Every mount is read-only.
*/}}
{{- define "kpssh.content" -}}
{{- $c := .Values.content -}}
{{- $root := trimSuffix "/" $c.root -}}
{{- $vols := list -}}
{{- $mounts := list -}}
{{- $inits := list -}}
{{- $roles := list -}}
{{- $colls := list -}}
{{- $seen := dict -}}
{{- range $c.roles -}}
{{- $dns := include "kpssh.contentName" .name -}}
{{- if hasKey $seen (printf "role-%s" $dns) -}}{{- fail (printf "content.roles: %q is given twice (or differs from another only by _ and -)" .name) -}}{{- end -}}
{{- $_ := set $seen (printf "role-%s" $dns) true -}}
{{- $paths := .paths -}}
{{- if .configMap -}}
{{- if .files -}}{{- fail (printf "content.roles %s: set configMap (an existing ConfigMap, with paths) or files (the chart makes the ConfigMap), not both" .name) -}}{{- end -}}
{{- if not $paths -}}{{- fail (printf "content.roles %s: configMap %s needs paths, the role's files (tasks/join.yml, …): ConfigMap keys cannot hold '/', the key of tasks/join.yml is tasks__join.yml" .name .configMap) -}}{{- end -}}
{{- else -}}
{{- if not .files -}}{{- fail (printf "content.roles %s: needs files (path in the role: content) or configMap" .name) -}}{{- end -}}
{{- $paths = keys .files | sortAlpha -}}
{{- end -}}
{{- $items := list -}}
{{- range $paths -}}
{{- if or (hasPrefix "/" .) (contains ".." .) (contains "__" .) -}}{{- fail (printf "content.roles: file %q must be a relative path inside the role without .. or __" .) -}}{{- end -}}
{{- $items = append $items (dict "key" (replace "/" "__" .) "path" .) -}}
{{- end -}}
{{- $cm := default (printf "%s-role-%s" (include "kpssh.fullname" $) $dns) .configMap -}}
{{- /* optional: a missing ConfigMap or key must not keep the controller's pod
(and every phase pod) from starting; the class of the role says what is
missing instead. */ -}}
{{- $vols = append $vols (dict "name" (printf "content-role-%s" $dns) "configMap" (dict "name" $cm "items" $items "optional" true)) -}}
{{- $mounts = append $mounts (dict "name" (printf "content-role-%s" $dns) "mountPath" (printf "%s/roles/%s" $root .name) "readOnly" true) -}}
{{- end -}}
{{- if $c.roles }}{{ $roles = append $roles (printf "%s/roles" $root) }}{{ end -}}
{{- range $c.images -}}
{{- if hasKey $seen (printf "image-%s" .name) -}}{{- fail (printf "content.images: %q is given twice" .name) -}}{{- end -}}
{{- $_ := set $seen (printf "image-%s" .name) true -}}
{{- $vol := printf "content-image-%s" .name -}}
{{- $dir := printf "%s/images/%s" $root .name -}}
{{- $src := trimAll "/" (default "/" .sourcePath) -}}
{{- if .copy -}}
{{- $vols = append $vols (dict "name" $vol "emptyDir" (dict "sizeLimit" (default "256Mi" .sizeLimit))) -}}
{{- $inits = append $inits (dict "name" (printf "copy-%s" .name) "image" .reference "imagePullPolicy" (default "IfNotPresent" .pullPolicy)
    "command" (list "cp" "-R" (printf "%s/." (trimSuffix "/" (printf "/%s" $src))) "/kpssh-content/")
    "volumeMounts" (list (dict "name" $vol "mountPath" "/kpssh-content"))
    "resources" (dict "requests" (dict "cpu" "10m" "memory" "16Mi") "limits" (dict "memory" "64Mi"))
    "securityContext" (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "capabilities" (dict "drop" (list "ALL")))) -}}
{{- $mounts = append $mounts (dict "name" $vol "mountPath" $dir "readOnly" true) -}}
{{- else -}}
{{- $vols = append $vols (dict "name" $vol "image" (dict "reference" .reference "pullPolicy" (default "IfNotPresent" .pullPolicy))) -}}
{{- $m := dict "name" $vol "mountPath" $dir "readOnly" true -}}
{{- if $src }}{{ $_ := set $m "subPath" $src }}{{ end -}}
{{- $mounts = append $mounts $m -}}
{{- end -}}
{{- if ne (toString .roles) "" }}{{ $roles = append $roles (printf "%s/%s" $dir (trimAll "/" (default "roles" .roles))) }}{{ end -}}
{{- if ne (toString .collections) "" }}{{ $colls = append $colls (printf "%s/%s" $dir (trimAll "/" (default "collections" .collections))) }}{{ end -}}
{{- end -}}
{{- range $c.rolesPath }}{{ $roles = append $roles . }}{{ end -}}
{{- range $c.collectionsPath }}{{ $colls = append $colls . }}{{ end -}}
{{- range $c.volumes }}{{ $vols = append $vols . }}{{ end -}}
{{- range $c.volumeMounts }}{{ $m := deepCopy . }}{{ $_ := set $m "readOnly" true }}{{ $mounts = append $mounts $m }}{{ end -}}
{{- toYaml (dict "volumes" $vols "volumeMounts" $mounts "initContainers" $inits "rolesPath" $roles "collectionsPath" $colls) -}}
{{- end -}}

{{/* A role name as a DNS label (volume and ConfigMap names): _ becomes -. */}}
{{- define "kpssh.contentName" -}}
{{- replace "_" "-" . | lower -}}
{{- end -}}

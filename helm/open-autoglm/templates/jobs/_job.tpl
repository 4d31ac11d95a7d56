{{/*
Base URL the job sends to: job.endpoint, else this release's batcher Service, over https when
batcher.webConfig serves TLS.
*/}}
{{- define "autoglm.job.endpoint" -}}
{{- if .Values.job.endpoint }}
{{- .Values.job.endpoint | trimSuffix "/" }}
{{- else }}
{{- printf "%s://%s.%s.svc:%v" (include "autoglm.scheme" .Values.batcher) (include "autoglm.componentName" (list . "batcher")) .Release.Namespace .Values.batcher.port }}
{{- end }}
{{- end }}

{{/*
The CA the job checks the batchers' certificate against, as a projected volume source (YAML),
empty for the system CAs: job.endpointAuth.caSecret or caConfigMap; else, toward this
release's batcher serving TLS, ca.crt of batcher.webConfig.tlsSecret (as the ServiceMonitor
checks it). Only that key is projected: the batcher's private key never reaches the job's pods.
*/}}
{{- define "autoglm.job.caSource" -}}
{{- $auth := .Values.job.endpointAuth }}
{{- $items := list (dict "key" $auth.caKey "path" "ca.crt") }}
{{- if $auth.caSecret }}
{{- toYaml (dict "secret" (dict "name" $auth.caSecret "items" $items)) }}
{{- else if $auth.caConfigMap }}
{{- toYaml (dict "configMap" (dict "name" $auth.caConfigMap "items" $items)) }}
{{- else if and (not .Values.job.endpoint) (include "autoglm.webConfig.tls" .Values.batcher) .Values.batcher.webConfig.tlsSecret }}
{{- toYaml (dict "secret" (dict "name" .Values.batcher.webConfig.tlsSecret "items" (list (dict "key" "ca.crt" "path" "ca.crt")))) }}
{{- end }}
{{- end }}

{{/*
The job's credentials toward the batchers, one projected volume at /etc/autoglm/endpoint:
password, ca.crt, client.crt and client.key, each present only when set. Empty when none is.
*/}}
{{- define "autoglm.job.endpointSources" -}}
{{- $auth := .Values.job.endpointAuth }}
{{- $sources := list }}
{{- if $auth.passwordSecret }}
{{- $sources = append $sources (dict "secret" (dict "name" $auth.passwordSecret "items" (list (dict "key" $auth.passwordKey "path" "password")))) }}
{{- end }}
{{- with include "autoglm.job.caSource" . }}
{{- $sources = append $sources (fromYaml .) }}
{{- end }}
{{- if $auth.clientCertSecret }}
{{- $sources = append $sources (dict "secret" (dict "name" $auth.clientCertSecret "items" (list (dict "key" "tls.crt" "path" "client.crt") (dict "key" "tls.key" "path" "client.key")))) }}
{{- end }}
{{- if $sources }}
{{- toYaml $sources }}
{{- end }}
{{- end }}

{{/* The runner's flags for the files of autoglm.job.endpointSources. */}}
{{- define "autoglm.job.endpointArgs" -}}
{{- $auth := .Values.job.endpointAuth }}
{{- if $auth.username }}
- {{ printf "--username=%s" $auth.username | quote }}
- --password-file=/etc/autoglm/endpoint/password
{{- end }}
{{- if include "autoglm.job.caSource" . }}
- --ca-file=/etc/autoglm/endpoint/ca.crt
{{- end }}
{{- if $auth.clientCertSecret }}
- --cert-file=/etc/autoglm/endpoint/client.crt
- --key-file=/etc/autoglm/endpoint/client.key
{{- end }}
{{- end }}

{{/* Checks of the job values that JSON schema cannot phrase clearly. */}}
{{- define "autoglm.job.validate" -}}
{{- $values := .Values.job }}
{{- if eq (empty $values.input.persistentVolumeClaim) (empty $values.input.configMap) }}
{{- fail "job.input: set exactly one of persistentVolumeClaim (a claim holding job.input.path) and configMap (a ConfigMap with key job.input.path)" }}
{{- end }}
{{- if not $values.output.persistentVolumeClaim }}
{{- fail "job.output.persistentVolumeClaim is required: a claim the job's pods can write answers and journals to (ReadWriteMany when job.parallelism > 1)" }}
{{- end }}
{{- if and (not $values.endpoint) (not .Values.batcher.enabled) }}
{{- fail "job.endpoint is empty and batcher.enabled is false: set job.endpoint to the batchers' base URL, e.g. http://my-batcher.default.svc:8000" }}
{{- end }}
{{- if gt (int $values.parallelism) (int $values.completions) }}
{{- fail (printf "job.parallelism %v is more than job.completions %v: the extra pods would have no shard" $values.parallelism $values.completions) }}
{{- end }}
{{- include "autoglm.webConfig.validate" (list "job" $values) }}
{{- /* The runner refuses these at start (exit 2), which fails the whole Job: say so now. */}}
{{- $auth := $values.endpointAuth }}
{{- if ne (empty $auth.username) (empty $auth.passwordSecret) }}
{{- fail "job.endpointAuth: basic auth needs both username and passwordSecret (a Secret holding the password under passwordKey)" }}
{{- end }}
{{- if and $auth.caSecret $auth.caConfigMap }}
{{- fail "job.endpointAuth: set either caSecret or caConfigMap, not both (the job checks the batchers' certificate against one CA file)" }}
{{- end }}
{{- $endpoint := include "autoglm.job.endpoint" . }}
{{- if and (hasPrefix "http://" $endpoint) (or $auth.caSecret $auth.caConfigMap $auth.clientCertSecret) }}
{{- fail (printf "job.endpointAuth: caSecret, caConfigMap and clientCertSecret are for TLS, but the job sends to %s: use an https:// job.endpoint (or turn TLS on in batcher.webConfig)" $endpoint) }}
{{- end }}
{{- /* Toward this release's batcher the chart can read an inline web config: a job it would refuse fails now. */}}
{{- $batcher := .Values.batcher.webConfig }}
{{- if and (not $values.endpoint) (include "autoglm.webConfig.enabled" .Values.batcher) $batcher.config }}
{{- if and $batcher.config.basic_auth_users (not $auth.username) }}
{{- fail "batcher.webConfig.config sets basic_auth_users but job.endpointAuth.username is empty: the batcher would refuse every request of the job; set job.endpointAuth.username and passwordSecret" }}
{{- end }}
{{- $tls := $batcher.config.tls_server_config | default dict }}
{{- if and (has (toString $tls.client_auth_type) (list "RequireAndVerifyClientCert" "RequireAnyClientCert")) (not $auth.clientCertSecret) }}
{{- fail (printf "batcher.webConfig.config requires client certificates (client_auth_type %s) but job.endpointAuth.clientCertSecret is empty: set it to a kubernetes.io/tls Secret holding the job's certificate" $tls.client_auth_type) }}
{{- end }}
{{- end }}
{{- end }}

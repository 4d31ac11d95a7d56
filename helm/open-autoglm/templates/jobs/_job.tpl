{{/* Base URL the job sends to: job.endpoint, else this release's batcher Service. */}}
{{- define "autoglm.job.endpoint" -}}
{{- if .Values.job.endpoint }}
{{- .Values.job.endpoint | trimSuffix "/" }}
{{- else }}
{{- printf "http://%s.%s.svc:%v" (include "autoglm.componentName" (list . "batcher")) .Release.Namespace .Values.batcher.port }}
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
{{- end }}

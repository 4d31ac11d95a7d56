{{/*
Names. The chart name can be overridden; a release whose name already contains the chart name
is not repeated ("autoglm" stays "autoglm", "gpu" becomes "gpu-open-autoglm").
Kubernetes names are limited to 63 characters (DNS labels).
*/}}
{{- define "autoglm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "autoglm.fullname" -}}
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

{{/*
Name of one component's objects: "<fullname>-<component>".
Usage: include "autoglm.componentName" (list . "exporter")
*/}}
{{- define "autoglm.componentName" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- printf "%s-%s" (include "autoglm.fullname" $root | trunc (int (sub 62 (len $component)))) $component | trimSuffix "-" }}
{{- end }}

{{- define "autoglm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The recommended labels (app.kubernetes.io/*) of every object of a component, plus commonLabels.
A common label that repeats one of the chart's is dropped (the chart's value wins): written
twice, the key would make invalid YAML, and the selector labels must never change.
Usage: include "autoglm.labels" (list . "exporter")
*/}}
{{- define "autoglm.labels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $chart := include "autoglm.chartLabels" (list $root $component) }}
{{- if $root.Values.commonLabels }}
{{- toYaml (merge (fromYaml $chart) (deepCopy $root.Values.commonLabels)) }}
{{- else }}
{{- $chart }}
{{- end }}
{{- end }}

{{- define "autoglm.chartLabels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 -}}
helm.sh/chart: {{ include "autoglm.chart" $root }}
{{ include "autoglm.selectorLabels" (list $root $component) }}
app.kubernetes.io/version: {{ include "autoglm.imageTag" $root | quote }}
app.kubernetes.io/part-of: open-autoglm
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
{{- end }}

{{/* Labels that select a component's pods; never change between upgrades (selectors are immutable). */}}
{{- define "autoglm.selectorLabels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 -}}
app.kubernetes.io/name: {{ include "autoglm.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ $component }}
{{- end }}

{{- define "autoglm.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The container image: repository:tag, or repository@digest when a digest is pinned. */}}
{{- define "autoglm.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "autoglm.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
Whether to render prometheus-operator objects (ServiceMonitor, PrometheusRule): monitoring.enabled
"auto" follows the cluster (the monitoring.coreos.com/v1 API is served), true/false force it.
Returns "true" or "".
*/}}
{{- define "autoglm.monitoring" -}}
{{- $mode := .Values.monitoring.enabled }}
{{- if eq (toString $mode) "auto" }}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- else if $mode }}true
{{- end }}
{{- end }}

{{/* Labels of ServiceMonitors and the PrometheusRule: the common ones plus what Prometheus selects on. */}}
{{- define "autoglm.monitoringLabels" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 -}}
{{ include "autoglm.labels" (list $root $component) }}
{{- with $root.Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Web config (TLS, basic auth) of a component: "true" when on.
Usage: include "autoglm.webConfig.enabled" .Values.exporter
*/}}
{{- define "autoglm.webConfig.enabled" -}}
{{- if and .webConfig .webConfig.enabled }}true{{ end }}
{{- end }}

{{/* The Secret holding a component's web config file: the user's, or the one the chart makes. */}}
{{- define "autoglm.webConfig.secretName" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $values := index $root.Values $component }}
{{- if $values.webConfig.existingSecret }}
{{- $values.webConfig.existingSecret }}
{{- else }}
{{- printf "%s-web-config" (include "autoglm.componentName" (list $root $component)) }}
{{- end }}
{{- end }}

{{/*
"true" when a component serves TLS: its web config is on and either names a tls_server_config
(webConfig.config, which the chart can read) or says so with webConfig.tls (for an
existingSecret, whose content the chart cannot see).
Usage: include "autoglm.webConfig.tls" .Values.exporter
*/}}
{{- define "autoglm.webConfig.tls" -}}
{{- if include "autoglm.webConfig.enabled" . }}
{{- if or .webConfig.tls (and .webConfig.config .webConfig.config.tls_server_config) }}true{{ end }}
{{- end }}
{{- end }}

{{/* "https" when the component serves TLS, else "http": used by probes and ServiceMonitors. */}}
{{- define "autoglm.scheme" -}}
{{- if include "autoglm.webConfig.tls" . }}https{{ else }}http{{ end }}
{{- end }}

{{/*
exporter.naming=prometheus serves autoglm_gpu_* names, but the PrometheusRule, the GPU dashboards
and a predictor query on DCGM_FI_* read dcgm-exporter's names: they would stay empty without a
word, so the render fails naming what to turn off or rewrite.
*/}}
{{- define "autoglm.exporter.validateNaming" -}}
{{- if and .Values.exporter.enabled (eq (toString .Values.exporter.naming) "prometheus") }}
{{- $uses := list }}
{{- if and .Values.monitoring.prometheusRule.enabled (ne (toString .Values.monitoring.enabled) "false") }}
{{- $uses = append $uses "the alert rules (set monitoring.prometheusRule.enabled=false)" }}
{{- end }}
{{- if .Values.dashboards.enabled }}
{{- $uses = append $uses "the dashboards (set dashboards.enabled=false)" }}
{{- end }}
{{- if .Values.predictor.enabled }}
{{- range .Values.predictor.config.targets }}
{{- if contains "DCGM_" (toString .query) }}
{{- $uses = append $uses (printf "the predictor target %q (rewrite its query on the autoglm_gpu_* names, docs/exporter.md)" (toString .name)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $uses }}
{{- fail (printf "exporter.naming=prometheus: the exporter would serve autoglm_gpu_* names, but these read dcgm-exporter's DCGM_FI_* names and would stay empty: %s. Keep exporter.naming=dcgm (the default), or change each of them" (join "; " $uses)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Checks of a component's web config values that JSON schema cannot phrase clearly. */}}
{{- define "autoglm.webConfig.validate" -}}
{{- $component := index . 0 }}
{{- $values := index . 1 }}
{{- if and $values.webConfig $values.webConfig.enabled }}
{{- if and (not $values.webConfig.existingSecret) (not $values.webConfig.config) }}
{{- fail (printf "%s.webConfig.enabled is true but there is no web config: set %s.webConfig.existingSecret to a Secret holding %s, or %s.webConfig.config to its content (tls_server_config, basic_auth_users)" $component $component $values.webConfig.key $component) }}
{{- end }}
{{- if and $values.webConfig.existingSecret $values.webConfig.config }}
{{- fail (printf "%s.webConfig: set either existingSecret or config, not both (the chart would not know which file to use)" $component) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Volumes and mounts of a component's web config: the file at /etc/autoglm/web/<key> (relative
paths inside it resolve there), and an optional kubernetes.io/tls Secret at /etc/autoglm/tls.
*/}}
{{- define "autoglm.webConfig.volumes" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $values := index $root.Values $component }}
{{- if include "autoglm.webConfig.enabled" $values }}
- name: web-config
  secret:
    secretName: {{ include "autoglm.webConfig.secretName" (list $root $component) }}
{{- with $values.webConfig.tlsSecret }}
- name: web-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "autoglm.webConfig.mounts" -}}
{{- if include "autoglm.webConfig.enabled" . }}
- name: web-config
  mountPath: /etc/autoglm/web
  readOnly: true
{{- if .webConfig.tlsSecret }}
- name: web-tls
  mountPath: /etc/autoglm/tls
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "autoglm.webConfig.args" -}}
{{- if include "autoglm.webConfig.enabled" . }}
- --web-config-file=/etc/autoglm/web/{{ .webConfig.key }}
{{- end }}
{{- end }}

{{/* A Secret made from <component>.webConfig.config, when the user gives the content inline. */}}
{{- define "autoglm.webConfig.secret" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $values := index $root.Values $component }}
{{- if and (include "autoglm.webConfig.enabled" $values) (not $values.webConfig.existingSecret) }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "autoglm.webConfig.secretName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "autoglm.labels" (list $root $component) | nindent 4 }}
type: Opaque
stringData:
  {{ $values.webConfig.key }}: |
    {{- toYaml $values.webConfig.config | nindent 4 }}
{{- end }}
{{- end }}

{{/*
A component's securityContext or podSecurityContext: the chart-wide one with the component's
keys merged over it, so that a component setting one key (say readOnlyRootFilesystem) keeps the
chart-wide rest (drop: [ALL], no privilege escalation, runAsNonRoot, seccomp). A list is
replaced, not appended to: a component's capabilities.drop is its whole list.
Usage: include "autoglm.securityContext" (list .Values.securityContext $values.securityContext)
*/}}
{{- define "autoglm.securityContext" -}}
{{- $chartWide := index . 0 | default dict }}
{{- $component := index . 1 | default dict }}
{{- toYaml (mustMergeOverwrite (deepCopy $chartWide) (deepCopy $component)) }}
{{- end }}

{{/*
Labels of a component's pod template: <component>.podLabels plus the chart's, which win, so that
podLabels can never change what the selector and the Service match.
Usage: include "autoglm.podLabels" (list (include "autoglm.labels" (list . "exporter")) $values.podLabels)
*/}}
{{- define "autoglm.podLabels" -}}
{{- $chart := index . 0 | fromYaml }}
{{- $user := index . 1 | default dict }}
{{- toYaml (merge $chart $user) }}
{{- end }}

{{/*
Annotations of a component's pod template: the chart's (checksums that roll the pods) plus
<component>.podAnnotations; the chart's win. Empty when there are none.
Usage: include "autoglm.podAnnotations" (list (dict "checksum/config" ...) $values.podAnnotations)
*/}}
{{- define "autoglm.podAnnotations" -}}
{{- $chart := index . 0 }}
{{- $user := index . 1 | default dict }}
{{- with merge $chart $user }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
topologySpreadConstraints of a Deployment's or Job's pods. A constraint without labelSelector
spreads the component's own pods (its selector labels).
Usage: include "autoglm.topologySpreadConstraints" (list $ "predictor" $values.topologySpreadConstraints)
*/}}
{{- define "autoglm.topologySpreadConstraints" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $constraints := index . 2 }}
{{- if $constraints }}
topologySpreadConstraints:
{{- range $constraints }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "autoglm.selectorLabels" (list $root $component) | fromYaml)) }}
{{- end }}
  - {{- toYaml $constraint | nindent 4 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The exporter's nodeSelector: exporter.nodeSelector when set (it replaces the default whole);
else, with exporter.gpuNodesOnly, the label the GPU operator's feature discovery puts on GPU
nodes; else none (every node). YAML, empty for none.
*/}}
{{- define "autoglm.exporter.nodeSelector" -}}
{{- $values := .Values.exporter }}
{{- if $values.nodeSelector }}
{{- toYaml $values.nodeSelector }}
{{- else if $values.gpuNodesOnly }}
nvidia.com/gpu.present: "true"
{{- end }}
{{- end }}

{{/* Milliseconds of a Prometheus duration: "1m30s" is 90000. */}}
{{- define "autoglm.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" . -1 }}
{{- $number := regexFind "^[0-9]+" . }}
{{- $total = add $total (mul (atoi $number) (index $units (trimPrefix $number .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
interval and scrapeTimeout of a ServiceMonitor or PodMonitor endpoint, as YAML: the given ones,
else the chart-wide monitoring.interval and monitoring.scrapeTimeout. Prometheus and the
operator refuse a timeout longer than the interval, so such a timeout is cut to the interval
(`--set monitoring.interval=5s` scrapes every 5s with a 5s timeout).
Usage: include "autoglm.scrapeTiming" (list $ $values.serviceMonitor.interval $values.serviceMonitor.scrapeTimeout) | fromYaml
*/}}
{{- define "autoglm.scrapeTiming" -}}
{{- $root := index . 0 }}
{{- $interval := index . 1 | default $root.Values.monitoring.interval }}
{{- $timeout := index . 2 | default $root.Values.monitoring.scrapeTimeout }}
{{- if gt (int64 (include "autoglm.durationMs" $timeout)) (int64 (include "autoglm.durationMs" $interval)) }}
{{- $timeout = $interval }}
{{- end }}
interval: {{ $interval | quote }}
scrapeTimeout: {{ $timeout | quote }}
{{- end }}

{{/* Pod-level settings every workload shares: pull secrets, scheduling, security. */}}
{{- define "autoglm.podScheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{- define "autoglm.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The tlsConfig of a scrape over https that the user did not write: Prometheus checks the
certificate for serverName, against the CA of webConfig.tlsSecret (its ca.crt, as cert-manager
writes it for a CA issuer) when there is one, else the system CAs. YAML.
Usage: include "autoglm.scrapeTLSConfig" (list $values "<service>.<namespace>.svc") | fromYaml
*/}}
{{- define "autoglm.scrapeTLSConfig" -}}
{{- $values := index . 0 }}
{{- $tlsConfig := dict "serverName" (index . 1) }}
{{- with $values.webConfig.tlsSecret }}
{{- $_ := set $tlsConfig "ca" (dict "secret" (dict "name" . "key" "ca.crt")) }}
{{- end }}
{{- toYaml $tlsConfig }}
{{- end }}

{{/*
The ServiceMonitor endpoint of a component, as a dict, with <component>.serviceMonitor.endpoint
merged over it (so users can add tlsConfig, basicAuth, metricRelabelings). The chart's
relabelings come first, then <component>.serviceMonitor.extraRelabelings; an
endpoint.relabelings replaces them all.
Usage: include "autoglm.serviceMonitorEndpoint" (list $ "exporter" "metrics")
*/}}
{{- define "autoglm.serviceMonitorEndpoint" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $port := index . 2 }}
{{- $values := index $root.Values $component }}
{{- $scheme := include "autoglm.scheme" $values }}
{{- $endpoint := dict "port" $port "path" "/metrics" "scheme" $scheme }}
{{- $endpoint = merge $endpoint (include "autoglm.scrapeTiming" (list $root $values.serviceMonitor.interval $values.serviceMonitor.scrapeTimeout) | fromYaml) }}
{{- if and (eq $scheme "https") (not (hasKey $values.serviceMonitor.endpoint "tlsConfig")) }}
{{- $serverName := printf "%s.%s.svc" (include "autoglm.componentName" (list $root $component)) $root.Release.Namespace }}
{{- $_ := set $endpoint "tlsConfig" (include "autoglm.scrapeTLSConfig" (list $values $serverName) | fromYaml) }}
{{- end }}
{{- /*
job is "autoglm-<component>" whatever the release is called, as with a plain scrape config
(job_name: autoglm-exporter); alerts/rules.yaml finds the exporter by it.
*/}}
{{- $relabelings := list (dict "targetLabel" "job" "replacement" (printf "autoglm-%s" $component)) }}
{{- if eq $component "exporter" }}
{{- /*
GPU series carry the pod, namespace and container that hold the GPU (from the kubelet). The
operator would add the exporter pod's own pod/namespace/container as target labels and rename
the GPU's to exported_*; dropping the target's keeps the GPU's names, which alerts/rules.yaml and
the dashboards use. The exporter pod is still known by instance and the added node label.
*/}}
{{- $node := dict "sourceLabels" (list "__meta_kubernetes_pod_node_name") "targetLabel" "node" }}
{{- $drop := dict "action" "labeldrop" "regex" "pod|namespace|container" }}
{{- $relabelings = concat $relabelings (list $node $drop) }}
{{- end }}
{{- if eq $component "autoscaler" }}
{{- /*
The autoscaler's series carry the namespace of the GPUAutoscaler they describe; honoring it keeps
the operator from renaming it to exported_namespace, which the rules and dashboards would miss.
*/}}
{{- $_ := set $endpoint "honorLabels" true }}
{{- end }}
{{- $relabelings = concat $relabelings ($values.serviceMonitor.extraRelabelings | default list) }}
{{- $_ := set $endpoint "relabelings" $relabelings }}
{{- toYaml (mergeOverwrite $endpoint (deepCopy $values.serviceMonitor.endpoint)) }}
{{- end }}

{{- define "autoglm.autoscaler.serviceAccountName" -}}
{{- if .Values.autoscaler.serviceAccount.create }}
{{- default (include "autoglm.componentName" (list . "autoscaler")) .Values.autoscaler.serviceAccount.name }}
{{- else }}
{{- required "autoscaler.serviceAccount.name is required when autoscaler.serviceAccount.create is false (the ServiceAccount the autoscaler runs as)" .Values.autoscaler.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "autoglm.autoscaler.watchNamespace" -}}
{{- default .Release.Namespace .Values.autoscaler.watchNamespace }}
{{- end }}

{{/*
A PodDisruptionBudget for a component that runs more than one replica, so a node drain never
takes them all at once. None for a single replica: a budget of one would block every drain.
Usage: include "autoglm.podDisruptionBudget" (list $ "autoscaler" .Values.autoscaler)
*/}}
{{- define "autoglm.podDisruptionBudget" -}}
{{- $root := index . 0 }}
{{- $component := index . 1 }}
{{- $values := index . 2 }}
{{- if and $values.enabled $values.podDisruptionBudget.enabled (gt (int $values.replicas) 1) }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "autoglm.componentName" (list $root $component) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "autoglm.labels" (list $root $component) | nindent 4 }}
spec:
  maxUnavailable: {{ $values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "autoglm.selectorLabels" (list $root $component) | nindent 6 }}
{{- end }}
{{- end }}

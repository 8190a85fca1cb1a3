{{/*
Names and labels, in the shape `helm create` gives them, so tools that key on the
app.kubernetes.io labels (the InferencePool selector in deploy/gateway, dashboards) find the pods.
*/}}
{{- define "sampan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sampan.fullname" -}}
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

{{- define "sampan.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sampan.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sampan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sampan.labels" -}}
helm.sh/chart: {{ include "sampan.chart" . }}
{{ include "sampan.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: model-server
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sampan.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sampan.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The volume that holds the model files: modelRepository.volume, or the existingClaim shorthand,
or nothing (the image's own repository).
*/}}
{{- define "sampan.modelVolume" -}}
{{- $r := .Values.modelRepository }}
{{- if $r.volume }}
{{- toYaml $r.volume }}
{{- else if $r.existingClaim }}
{{- toYaml (dict "persistentVolumeClaim" (dict "claimName" $r.existingClaim "readOnly" $r.readOnly)) }}
{{- end }}
{{- end }}

{{/* Whether the chart renders a ConfigMap (model config.json files or serve.json). */}}
{{- define "sampan.hasConfigMap" -}}
{{- if or .Values.modelRepository.models .Values.server.config }}true{{ end }}
{{- end }}

{{/*
--threads: server.threads when set, else the whole cores of resources.limits.cpu (or
requests.cpu), else nothing (the server then counts the node's online cores, which ignores the
container's CPU quota).
*/}}
{{- define "sampan.threads" -}}
{{- $t := int .Values.server.threads }}
{{- if gt $t 0 }}
{{- $t }}
{{- else }}
{{- $res := .Values.resources | default dict }}
{{- $cpu := "" }}
{{- if and $res.limits $res.limits.cpu }}
{{- $cpu = toString $res.limits.cpu }}
{{- else if and $res.requests $res.requests.cpu }}
{{- $cpu = toString $res.requests.cpu }}
{{- end }}
{{- if regexMatch "^[0-9]+m$" $cpu }}
{{- max 1 (div (atoi (trimSuffix "m" $cpu)) 1000) }}
{{- else if regexMatch "^[0-9]+(\\.[0-9]+)?$" $cpu }}
{{- max 1 (int (floor (float64 $cpu))) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the value when given (it must exceed drain delay + drain
timeout, or the pod would be killed mid-drain), else drain delay + drain timeout + 30 s.
*/}}
{{- define "sampan.terminationGracePeriod" -}}
{{- $drain := int .Values.server.drainTimeoutSeconds }}
{{- $pre := int .Values.server.drainDelaySeconds }}
{{- $v := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $v }}
{{- add $drain $pre 30 }}
{{- else if le (int $v) (add $drain $pre) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be larger than server.drainTimeoutSeconds (%d) + server.drainDelaySeconds (%d)" (int $v) $drain $pre) }}
{{- else }}
{{- int $v }}
{{- end }}
{{- end }}

{{/*
Where the tenants Secret is mounted: a directory (a subPath mount would never see the Secret's
updates, and the server reloads the file when it changes).
*/}}
{{- define "sampan.tenantsDir" -}}
/etc/sampan/tenants
{{- end }}

{{/*
"true" when the server gets API keys some way: the tenants Secret, the apiKey Secret, or the
same flags given by hand in server.extraArgs or server.config.
*/}}
{{- define "sampan.hasKeys" -}}
{{- $s := .Values.server }}
{{- $byHand := false }}
{{- range $s.extraArgs }}
{{- if regexMatch "^--(tenants|api-key)(=.+)?$" (toString .) }}{{ $byHand = true }}{{ end }}
{{- end }}
{{- $cfg := $s.config | default dict }}
{{- if or $s.tenants.existingSecret $s.apiKey.existingSecret $byHand (get $cfg "tenants") (get $cfg "api-key") }}true{{ end }}
{{- end }}

{{/*
"true" when the server runs without keys on purpose (server.insecureOpen, or --insecure-open by
hand).
*/}}
{{- define "sampan.openByHand" -}}
{{- $open := false }}
{{- range .Values.server.extraArgs }}
{{- if eq (toString .) "--insecure-open" }}{{ $open = true }}{{ end }}
{{- end }}
{{- if or $open (get (.Values.server.config | default dict) "insecure-open") }}true{{ end }}
{{- end }}

{{/*
The ServiceMonitor's bearer token Secret as "name/key": metrics.serviceMonitor.bearerTokenSecret,
else server.apiKey's Secret (that key has every scope), else "" (no token).
*/}}
{{- define "sampan.scrapeTokenSecret" -}}
{{- $b := .Values.metrics.serviceMonitor.bearerTokenSecret | default dict }}
{{- if $b.name }}
{{- printf "%s/%s" $b.name ($b.key | default "key") }}
{{- else if .Values.server.apiKey.existingSecret }}
{{- printf "%s/%s" .Values.server.apiKey.existingSecret .Values.server.apiKey.key }}
{{- end }}
{{- end }}

{{/* Checks that stop a bad combination of values at render time with a clear message. */}}
{{- define "sampan.validate" -}}
{{- if and .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled }}
{{- fail "enable autoscaling.hpa or autoscaling.keda, not both (KEDA creates its own HPA)" }}
{{- end }}
{{- if and .Values.modelRepository.models (not (include "sampan.modelVolume" .)) }}
{{- fail "modelRepository.models needs modelRepository.existingClaim or modelRepository.volume for the model files" }}
{{- end }}
{{- range .Values.modelRepository.models }}
{{- if not (regexMatch "^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$" (toString .name)) }}
{{- fail (printf "modelRepository.models: name %q must be 1-128 letters, digits, '-', '_' or '.' (it names a ConfigMap key and a directory)" (toString .name)) }}
{{- end }}
{{- if not .versions }}
{{- fail (printf "modelRepository.models[%s].versions: list the version directories to mount" .name) }}
{{- end }}
{{- end }}
{{- with .Values.modelRepository.s3 }}
{{- if .url }}
{{- if not (hasPrefix "s3://" .url) }}
{{- fail "modelRepository.s3.url must be s3://BUCKET/PREFIX" }}
{{- end }}
{{- if or $.Values.modelRepository.models (include "sampan.modelVolume" $) }}
{{- fail "modelRepository.s3.url serves the repository from the object store: leave modelRepository.existingClaim, volume and models empty" }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (has .Values.modelRepository.controlMode (list "none" "poll" "explicit")) }}
{{- fail "modelRepository.controlMode must be none, poll or explicit" }}
{{- end }}
{{- if lt (int .Values.gpu.count) 0 }}
{{- fail "gpu.count must be 0 (CPU only) or more" }}
{{- end }}
{{- if and (gt (int .Values.gpu.count) 0) (not .Values.gpu.imageHasCuda) }}
{{- fail "gpu.count > 0: deploy/Dockerfile's default (cpu) and minimal images are CPU-only (no CUDA runtime), so the GPU would sit idle. Build its cuda target (docker build --target cuda -t REPO:0.1.0-cuda), point image.repository/tag at it and set gpu.imageHasCuda=true; the CUDA backend has only run under emulation so far (docs/cuda.md)" }}
{{- end }}
{{- if and (hasPrefix "nvidia.com/mig-" (toString .Values.gpu.resourceName)) (gt (int .Values.gpu.count) 1) }}
{{- fail "gpu.count > 1 with a MIG resource: a CUDA process uses one MIG instance, the others would sit idle; use gpu.count: 1 and scale with replicas" }}
{{- end }}
{{- if not (or (include "sampan.hasKeys" .) .Values.server.insecureOpen (include "sampan.openByHand" .)) }}
{{- fail "no API keys: set server.tenants.existingSecret (a Secret with a tenants file made by `sampan keys add`) or server.apiKey.existingSecret, or set server.insecureOpen=true to serve without keys (anyone who can reach the port may use every route, model load and unload included). The server refuses to listen on 0.0.0.0 without one of them; see docs/operations.md, \"Deploying on Kubernetes\"" }}
{{- end }}
{{- if and .Values.server.tenants.existingSecret (not .Values.server.tenants.key) }}
{{- fail "server.tenants.key: name the Secret's key that holds the tenants file (default tenants.json)" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (include "sampan.hasKeys" .) (not .Values.server.metricsOpen) (not (include "sampan.scrapeTokenSecret" .)) }}
{{- fail "metrics.serviceMonitor: with server.tenants, /metrics needs a key with the metrics scope: set metrics.serviceMonitor.bearerTokenSecret (name, key) to a Secret holding one, or set server.metricsOpen=true (only where the port is not reachable from outside the cluster)" }}
{{- end }}
{{- end }}

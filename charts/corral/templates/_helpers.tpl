{{/* Names ------------------------------------------------------------------------------------------- */}}

{{- define "corral.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The resource name prefix: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "corral.fullname" -}}
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

{{/* <fullname>-<suffix>, kept a valid DNS label. Call with (list $ "suffix"). */}}
{{- define "corral.componentName" -}}
{{- $ctx := index . 0 }}
{{- printf "%s-%s" (include "corral.fullname" $ctx) (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "corral.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "corral.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "corral.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "corral.imageTag" .) }}
{{- end }}

{{/* Labels --------------------------------------------------------------------------------------------- */}}

{{/* Labels of every resource; call with (list $ "component") or (list $ "") for none. */}}
{{- define "corral.labels" -}}
{{- $ctx := index . 0 }}
{{- $component := index . 1 -}}
helm.sh/chart: {{ include "corral.chart" $ctx }}
{{ include "corral.selectorLabels" (list $ctx $component) }}
app.kubernetes.io/version: {{ include "corral.imageTag" $ctx | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/part-of: corral
{{- end }}

{{- define "corral.selectorLabels" -}}
{{- $ctx := index . 0 }}
{{- $component := index . 1 -}}
app.kubernetes.io/name: {{ include "corral.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
{{- if $component }}
app.kubernetes.io/component: {{ $component }}
{{- end }}
{{- end }}

{{/* Settings derived from several values ------------------------------------------------------------- */}}

{{/* The namespace where discovered Devices are registered. */}}
{{- define "corral.deviceNamespace" -}}
{{- .Values.controller.deviceNamespace | default .Release.Namespace }}
{{- end }}

{{/* JSON list of the namespaces the controller watches: [] for all, else watchNamespaces plus the device namespace. */}}
{{- define "corral.watchNamespaces" -}}
{{- $watched := list }}
{{- if .Values.controller.watchNamespaces }}
{{- $watched = concat .Values.controller.watchNamespaces (list (include "corral.deviceNamespace" .)) | uniq }}
{{- end }}
{{- toJson $watched }}
{{- end }}

{{/* JSON list of the namespaces the gateway serves. */}}
{{- define "corral.gatewayNamespaces" -}}
{{- if .Values.gateway.namespaces }}
{{- toJson (uniq .Values.gateway.namespaces) }}
{{- else }}
{{- toJson (list (include "corral.deviceNamespace" .)) }}
{{- end }}
{{- end }}

{{- define "corral.mqttUrlDefault" -}}mqtt://mosquitto:1883{{- end }}

{{/* The broker URL without credentials: mqtt.url, or the bundled broker when it is on and mqtt.url is the default. */}}
{{- define "corral.mqttBaseUrl" -}}
{{- if and .Values.mosquitto.enabled (eq .Values.mqtt.url (include "corral.mqttUrlDefault" .)) }}
{{- printf "mqtt://%s:1883" (include "corral.componentName" (list . "mosquitto")) }}
{{- else }}
{{- .Values.mqtt.url }}
{{- end }}
{{- end }}

{{/* The broker URL with the credentials of mqtt.username/password, URL-encoded (a space as %20, not +). */}}
{{- define "corral.mqttUrl" -}}
{{- $base := include "corral.mqttBaseUrl" . }}
{{- $u := urlParse $base }}
{{- if not (regexMatch "^mqtts?$" $u.scheme) }}
{{- fail (printf "mqtt.url %q must start with mqtt:// or mqtts://" $base) }}
{{- end }}
{{- if and .Values.mqtt.password (not .Values.mqtt.username) }}
{{- fail "mqtt.password needs mqtt.username" }}
{{- end }}
{{- if .Values.mqtt.username }}
{{- if $u.userinfo }}
{{- fail "mqtt.url carries credentials already; remove them from the URL or leave mqtt.username/password empty" }}
{{- end }}
{{- $user := .Values.mqtt.username | urlquery | replace "+" "%20" }}
{{- $cred := $user }}
{{- if .Values.mqtt.password }}
{{- $cred = printf "%s:%s" $user (.Values.mqtt.password | urlquery | replace "+" "%20") }}
{{- end }}
{{- printf "%s://%s@%s%s" $u.scheme $cred $u.host $u.path }}{{ if $u.query }}?{{ $u.query }}{{ end }}
{{- else }}
{{- $base }}
{{- end }}
{{- end }}

{{/* A number as a command-line argument: whole numbers without exponent (86400, not 8.64e+04). */}}
{{- define "corral.num" -}}
{{- $v := . }}
{{- if eq (float64 $v) (floor $v) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- end }}

{{/* Pods -------------------------------------------------------------------------------------------------- */}}

{{/* Pod security context of the restricted Pod Security Standard; call with the uid/gid. */}}
{{- define "corral.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "corral.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* nodeSelector, tolerations, affinity, priorityClassName and pull secrets; call with (list $ .Values.<component>). */}}
{{- define "corral.scheduling" -}}
{{- $ctx := index . 0 }}
{{- $c := index . 1 }}
{{- with $ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $ctx.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

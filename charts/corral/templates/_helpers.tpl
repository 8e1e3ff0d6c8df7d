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

{{/* The namespace the home's devices are enrolled in: always watched, the gateway's default. */}}
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

{{/* The controller's account on a broker Corral manages (controller/corral/devcluster/files.py BROKER_CONTROLLER). */}}
{{- define "corral.brokerController" -}}corral-controller{{- end }}

{{/* "true" when the controller uses the bundled Mosquitto: it is on and mqtt.url is left at its default. */}}
{{- define "corral.bundledBroker" -}}
{{- if and .Values.mosquitto.enabled (eq .Values.mqtt.url (include "corral.mqttUrlDefault" .)) }}true{{ end }}
{{- end }}

{{/* The bundled broker's Service name, and the names its generated certificate is for. */}}
{{- define "corral.mosquittoName" -}}
{{- include "corral.componentName" (list . "mosquitto") }}
{{- end }}

{{- define "corral.mosquittoServerNames" -}}
{{- $svc := include "corral.mosquittoName" . }}
{{- $ns := .Release.Namespace }}
{{- toJson (concat (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) .Values.mosquitto.tls.extraNames | uniq) }}
{{- end }}

{{/* The controller's Service name (the audit log's HTTPS server and metrics), and the names its generated
serving certificate is for: the Service's DNS names, loopback (for `kubectl port-forward`) and audit.serving.extraNames. */}}
{{- define "corral.controllerName" -}}
{{- include "corral.componentName" (list . "controller") }}
{{- end }}

{{- define "corral.servingNames" -}}
{{- $svc := include "corral.controllerName" . }}
{{- $ns := .Release.Namespace }}
{{- toJson (concat (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost" "127.0.0.1" "::1") .Values.audit.serving.extraNames | uniq) }}
{{- end }}

{{/* The fixed names of the AuditCheckpoint objects in the release namespace (`--audit-checkpoint`). */}}
{{- define "corral.controllerCheckpoint" -}}corral-controller{{- end }}
{{- define "corral.gatewayCheckpoint" -}}corral-gateway{{- end }}

{{/* "true" when the gateway keeps a durable log of its own and publishes its checkpoints: one gateway writes
one log and one AuditCheckpoint object, so with gateway.replicas above 1 each pod keeps its log in an emptyDir
and publishes none (two chains would overwrite one object). */}}
{{- define "corral.gatewayPublishes" -}}
{{- if and .Values.gateway.enabled (le (int .Values.gateway.replicas) 1) }}true{{ end }}
{{- end }}

{{/* The Secret holding the audit signing keys (controller.pem, gateway.pem). */}}
{{- define "corral.auditKeySecret" -}}
{{- .Values.audit.existingKeySecret | default (include "corral.componentName" (list . "audit-keys")) }}
{{- end }}

{{/* The controller's serving certificate Secret (kubernetes.io/tls). */}}
{{- define "corral.servingSecret" -}}
{{- .Values.audit.serving.existingSecret | default (include "corral.componentName" (list . "controller-serving")) }}
{{- end }}

{{/* An audit log's volume: (list $ persistenceValues "suffix") -> the PVC's name, or "" for an emptyDir. */}}
{{- define "corral.auditClaim" -}}
{{- $ctx := index . 0 }}
{{- $p := index . 1 }}
{{- if $p.enabled }}
{{- $p.existingClaim | default (include "corral.componentName" (list $ctx (index . 2))) }}
{{- end }}
{{- end }}

{{/*
A CA and a server certificate for a list of names (DNS names or IP addresses), kept across upgrades from
the Secret that holds them (keys ca.crt, ca.key, tls.crt, tls.key; annotation corral.dev/server-names):
the same CA always, and a new certificate from it when the names change. Call with
(list $ "<Secret name>" "<CA common name>" <names>); returns JSON {names, caCert, caKey, cert, key}.
*/}}
{{- define "corral.keptServerCert" -}}
{{- $ctx := index . 0 }}
{{- $names := index . 3 }}
{{- $ips := list }}
{{- $dns := list }}
{{- range $names }}
{{- if regexMatch "^([0-9]{1,3}(\\.[0-9]{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:.]*)$" . }}
{{- $ips = append $ips . }}
{{- else }}
{{- $dns = append $dns . }}
{{- end }}
{{- end }}
{{- $namesKey := join "," $names }}
{{- $old := lookup "v1" "Secret" $ctx.Release.Namespace (index . 1) | default dict }}
{{- $oldData := $old.data | default dict }}
{{- $oldNames := ((($old.metadata | default dict).annotations | default dict) | dig "corral.dev/server-names" "") }}
{{- $tls := dict "names" $namesKey }}
{{- if and (hasKey $oldData "ca.crt") (hasKey $oldData "ca.key") (hasKey $oldData "tls.crt") (hasKey $oldData "tls.key") }}
{{- $_ := set $tls "caCert" (index $oldData "ca.crt" | b64dec) }}
{{- $_ := set $tls "caKey" (index $oldData "ca.key" | b64dec) }}
{{- if eq $oldNames $namesKey }}
{{- $_ := set $tls "cert" (index $oldData "tls.crt" | b64dec) }}
{{- $_ := set $tls "key" (index $oldData "tls.key" | b64dec) }}
{{- else }}
{{- $ca := buildCustomCert (index $oldData "ca.crt") (index $oldData "ca.key") }}
{{- $cert := genSignedCert (first $dns) $ips $dns 3650 $ca }}
{{- $_ := set $tls "cert" $cert.Cert }}
{{- $_ := set $tls "key" $cert.Key }}
{{- end }}
{{- else }}
{{- $ca := genCA (index . 2) 3650 }}
{{- $cert := genSignedCert (first $dns) $ips $dns 3650 $ca }}
{{- $_ := set $tls "caCert" $ca.Cert }}
{{- $_ := set $tls "caKey" $ca.Key }}
{{- $_ := set $tls "cert" $cert.Cert }}
{{- $_ := set $tls "key" $cert.Key }}
{{- end }}
{{- toJson $tls }}
{{- end }}

{{/*
What the chart generates, made once per render (every template sees the same values) and kept across
upgrades with `lookup` (which answers nothing under `helm template`: then it is new every time):
  controllerPassword  the controller's account on the bundled broker (Secret <fullname>-mqtt, key controller-password)
  tls                 the bundled broker's CA and server certificate, unless mosquitto.tls.secretName
                      (Secret <fullname>-mosquitto-tls; a new certificate from the same CA when the names change)
  auditKeys           the Ed25519 audit signing keys {controller, gateway} (PEM, PKCS8), unless
                      audit.existingKeySecret (Secret <fullname>-audit-keys; each key kept on its own)
  serving             the controller's serving CA and certificate, unless audit.serving.existingSecret
                      (Secret <fullname>-controller-serving; a new certificate from the same CA when the names change)
Returned as JSON; the memo lives in .Values, which every template of a render shares.
*/}}
{{- define "corral.generated" -}}
{{- if not (hasKey .Values "__corralGenerated") }}
{{- $g := dict }}
{{- if .Values.mosquitto.enabled }}
{{- $mqtt := lookup "v1" "Secret" .Release.Namespace (include "corral.componentName" (list . "mqtt")) }}
{{- $kept := (($mqtt | default dict).data | default dict) }}
{{- if hasKey $kept "controller-password" }}
{{- $_ := set $g "controllerPassword" (index $kept "controller-password" | b64dec) }}
{{- else }}
{{- $_ := set $g "controllerPassword" (randAlphaNum 32) }}
{{- end }}
{{- if not .Values.mosquitto.tls.secretName }}
{{- $names := include "corral.mosquittoServerNames" . | fromJsonArray }}
{{- $tls := include "corral.keptServerCert" (list . (include "corral.componentName" (list . "mosquitto-tls")) (printf "%s CA" (include "corral.mosquittoName" .)) $names) | fromJson }}
{{- $_ := set $g "tls" $tls }}
{{- end }}
{{- end }}
{{- if not .Values.audit.existingKeySecret }}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "corral.auditKeySecret" .) | default dict }}
{{- $oldData := $old.data | default dict }}
{{- $keys := dict }}
{{- range $component := list "controller" "gateway" }}
{{- $file := printf "%s.pem" $component }}
{{- if hasKey $oldData $file }}
{{- $_ := set $keys $component (index $oldData $file | b64dec) }}
{{- else }}
{{- $_ := set $keys $component (genPrivateKey "ed25519") }}
{{- end }}
{{- end }}
{{- $_ := set $g "auditKeys" $keys }}
{{- end }}
{{- if not .Values.audit.serving.existingSecret }}
{{- $names := include "corral.servingNames" . | fromJsonArray }}
{{- $serving := include "corral.keptServerCert" (list . (include "corral.servingSecret" .) (printf "%s serving CA" (include "corral.controllerName" .)) $names) | fromJson }}
{{- $_ := set $g "serving" $serving }}
{{- end }}
{{- $_ := set .Values "__corralGenerated" $g }}
{{- end }}
{{- toJson (index .Values "__corralGenerated") }}
{{- end }}

{{/* The broker URL without credentials: mqtt.url, or the bundled broker's TLS listener. */}}
{{- define "corral.mqttBaseUrl" -}}
{{- if include "corral.bundledBroker" . }}
{{- printf "mqtts://%s:8883" (include "corral.mosquittoName" .) }}
{{- else }}
{{- .Values.mqtt.url }}
{{- end }}
{{- end }}

{{/* The broker URL with the controller's credentials: the bundled broker's generated account, or
mqtt.username/password URL-encoded (a space as %20, not +). */}}
{{- define "corral.mqttUrl" -}}
{{- if include "corral.bundledBroker" . }}
{{- if or .Values.mqtt.username .Values.mqtt.password }}
{{- fail "mqtt.username/mqtt.password are for a broker of your own: with mosquitto.enabled (and mqtt.url at its default) the controller uses the bundled broker's account corral-controller, whose password the chart generates. Leave them empty." }}
{{- end }}
{{- $password := (include "corral.generated" . | fromJson).controllerPassword }}
{{- printf "mqtts://%s:%s@%s:8883" (include "corral.brokerController" .) $password (include "corral.mosquittoName" .) }}
{{- else }}
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
{{- end }}

{{/* The Secret and key of the CA the controller verifies the broker with (--mqtt-ca), as JSON; {} for none
(the system's CAs). mqtt.caSecret, else the bundled broker's CA when the controller uses it. */}}
{{- define "corral.mqttCa" -}}
{{- if .Values.mqtt.caSecret }}
{{- toJson (dict "secret" .Values.mqtt.caSecret "key" .Values.mqtt.caSecretKey) }}
{{- else if include "corral.bundledBroker" . }}
{{- toJson (dict "secret" (.Values.mosquitto.tls.secretName | default (include "corral.componentName" (list . "mosquitto-ca"))) "key" "ca.crt") }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/* Refusals that concern several values, with what to set instead. Included by the controller Deployment. */}}
{{- define "corral.checks" -}}
{{- if and .Values.signing.require (not .Values.signing.keysSecret) }}
{{- fail "signing.require is true (the default), so the controller refuses device contracts without a valid signature, but signing.keysSecret is empty. Set signing.keysSecret to a Secret in the release namespace whose data entries are the trusted base64 Ed25519 public keys (kubectl create secret generic corral-signing-keys -n NAMESPACE --from-file=KEY_NAME=PUBLIC_KEY_FILE), or set signing.require=false to accept unsigned contracts (only on a network you trust)." }}
{{- end }}
{{- if .Values.mosquitto.enabled }}
{{- if .Values.mqtt.existingSecret }}
{{- fail "mqtt.existingSecret cannot be used with mosquitto.enabled: the chart generates the controller's account on the bundled broker into its own Secret <fullname>-mqtt. Leave mqtt.existingSecret empty." }}
{{- end }}
{{- if and (include "corral.bundledBroker" .) (not .Values.mqtt.manageAccounts) }}
{{- fail "mqtt.manageAccounts=false cannot be used with the bundled broker: it admits only the accounts the controller makes for enrolled devices, so no device could connect. Leave mqtt.manageAccounts true, or use a broker of your own (mqtt.url)." }}
{{- end }}
{{- end }}
{{- if and .Values.gateway.enabled (gt (int .Values.gateway.replicas) 1) .Values.audit.gatewayPersistence.enabled }}
{{- fail (printf "gateway.replicas is %d, but audit.gatewayPersistence.enabled gives the gateway ONE audit log volume, and a log has one writer (the second pod would find it locked and exit). Run one gateway replica, or set audit.gatewayPersistence.enabled=false: then each gateway pod keeps its own log in an emptyDir (lost with the pod) and none publishes an AuditCheckpoint." (int .Values.gateway.replicas)) }}
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

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

{{/* JSON list of the namespaces the controller watches: [] for all, else watchNamespaces plus the device namespace
(and, with bridge.enabled, the release namespace: the bridge's broker Secret is there), and the bridge namespaces. */}}
{{- define "corral.watchNamespaces" -}}
{{- $watched := list }}
{{- if .Values.controller.watchNamespaces }}
{{- $watched = concat .Values.controller.watchNamespaces (list (include "corral.deviceNamespace" .)) | uniq }}
{{- if .Values.bridge.enabled }}
{{- $watched = append $watched .Release.Namespace | uniq }}
{{- end }}
{{- $watched = concat $watched (include "corral.bridgeNamespaces" . | fromJsonArray) | uniq }}
{{- end }}
{{- toJson $watched }}
{{- end }}

{{/* JSON list of the only namespaces whose bridge and source Secrets make broker accounts (`--bridge-namespace`):
controller.bridgeNamespaces, else the device namespace (where people register sources: a source's devices are
accepted in its namespace) and, with bridge.enabled, the release namespace (the chart's bridge Secret). Without the
bridge the release namespace stays unwatched: the controller reads only its own Secrets there, by name. */}}
{{- define "corral.bridgeNamespaces" -}}
{{- if .Values.controller.bridgeNamespaces }}
{{- toJson (uniq .Values.controller.bridgeNamespaces) }}
{{- else if .Values.bridge.enabled }}
{{- toJson (list .Release.Namespace (include "corral.deviceNamespace" .) | uniq) }}
{{- else }}
{{- toJson (list (include "corral.deviceNamespace" .)) }}
{{- end }}
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

{{/* The bundled broker's Service name, and the names the certificate made for it at run time is for. */}}
{{- define "corral.mosquittoName" -}}
{{- include "corral.componentName" (list . "mosquitto") }}
{{- end }}

{{- define "corral.mosquittoServerNames" -}}
{{- $svc := include "corral.mosquittoName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := concat (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) .Values.mosquitto.tls.extraNames }}
{{- if include "corral.lanHostPort" (list . .Values.mosquitto.service 8883) }}
{{- $names = append $names .Values.nodeAddress }}
{{- end }}
{{- toJson ($names | uniq) }}
{{- end }}

{{/* Reaching the Services from the LAN (nodeAddress) ----------------------------------------------------- */}}

{{/* nodeAddress as the host part of a URL or a Host header: an IPv6 address in brackets. */}}
{{- define "corral.nodeHost" -}}
{{- if contains ":" .Values.nodeAddress }}[{{ .Values.nodeAddress }}]{{ else }}{{ .Values.nodeAddress }}{{ end }}
{{- end }}

{{/* HOST:PORT at which devices, agents and browsers on the LAN reach a Service, or "" when it is not exposed
(type ClusterIP) or nodeAddress is empty; call with (list $ serviceValues servicePort). NodePort: the node port
("*", any, when the cluster picks it); LoadBalancer (k3s ServiceLB answers on the node's addresses): the
Service's own port. */}}
{{- define "corral.lanHostPort" -}}
{{- $ctx := index . 0 }}
{{- $svc := index . 1 }}
{{- if and $ctx.Values.nodeAddress (ne $svc.type "ClusterIP") }}
{{- if eq $svc.type "NodePort" }}
{{- printf "%s:%v" (include "corral.nodeHost" $ctx) ($svc.nodePort | default "*") }}
{{- else }}
{{- printf "%s:%v" (include "corral.nodeHost" $ctx) (index . 2) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The URL of a Service from the LAN, http://HOST:PORT, or "" when it has none or its node port is left to the
cluster (unknown when rendering); call as corral.lanHostPort. */}}
{{- define "corral.lanUrl" -}}
{{- $hostPort := include "corral.lanHostPort" . }}
{{- if and $hostPort (not (hasSuffix ":*" $hostPort)) }}http://{{ $hostPort }}{{ end }}
{{- end }}

{{/* "true" when a kept object may be rendered by this release: it is absent (or there is no cluster to ask:
`helm template`), or Helm's ownership annotations name this release. Call with (list $ (lookup ...)). An object
kept by `helm.sh/resource-policy: keep` still names the release that made it, and Helm refuses to install a
release whose manifest holds an object another release (or nobody) owns: such an object is used as it is. */}}
{{- define "corral.ownsOrAbsent" -}}
{{- $ctx := index . 0 }}
{{- $found := index . 1 }}
{{- $annotations := dig "metadata" "annotations" dict $found }}
{{- if or (not $found) (and (eq (index $annotations "meta.helm.sh/release-name" | default "") $ctx.Release.Name)
                            (eq (index $annotations "meta.helm.sh/release-namespace" | default "") $ctx.Release.Namespace)) }}true{{ end }}
{{- end }}

{{/* The controller's Service name (the audit log's HTTPS server and metrics), and the names the serving
certificate made at run time is for: the Service's DNS names, loopback (for `kubectl port-forward`) and audit.serving.extraNames. */}}
{{- define "corral.controllerName" -}}
{{- include "corral.componentName" (list . "controller") }}
{{- end }}

{{/* The headless Service that gives the StatefulSet's pods their DNS names (<pod>.<headless>.<ns>.svc). */}}
{{- define "corral.controllerHeadless" -}}
{{- include "corral.componentName" (list . "controller-pods") }}
{{- end }}

{{/* The controller pods' names, ordinal 0 to controller.replicas - 1, as JSON: each one's broker account, its
AuditCheckpoint object and its serving certificate's names are made ahead for exactly these. */}}
{{- define "corral.controllerPods" -}}
{{- $pods := list }}
{{- range $i := until (int .Values.controller.replicas) }}
{{- $pods = append $pods (printf "%s-%d" (include "corral.controllerName" $) $i) }}
{{- end }}
{{- toJson $pods }}
{{- end }}

{{/* The prefix of the controller's Leases (<prefix>-shard-<k>, <prefix>-member-<pod>): leaderElection.leasePrefix,
or <fullname>-controller. */}}
{{- define "corral.leasePrefix" -}}
{{- .Values.controller.leaderElection.leasePrefix | default (include "corral.controllerName" .) }}
{{- end }}

{{/* The AuditCheckpoint objects of the controller, one per pod (one chain per ordinal), as JSON. */}}
{{- define "corral.controllerCheckpoints" -}}
{{- $names := list }}
{{- range include "corral.controllerPods" . | fromJsonArray }}
{{- $names = append $names (printf "%s-%s" (include "corral.controllerCheckpoint" $) .) }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{- define "corral.servingNames" -}}
{{- $svc := include "corral.controllerName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- /* Each replica serves its own chain: a reader reaches one pod by its name under the headless Service. */}}
{{- $headless := include "corral.controllerHeadless" . }}
{{- range include "corral.controllerPods" . | fromJsonArray }}
{{- $names = concat $names (list (printf "%s.%s.%s.svc" . $headless $ns) (printf "%s.%s.%s.svc.cluster.local" . $headless $ns)) }}
{{- end }}
{{- toJson (concat $names (list "localhost" "127.0.0.1" "::1") .Values.audit.serving.extraNames | uniq) }}
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

{{/* The Secret holding the audit signing keys (controller.pem, gateway.pem): yours, or made at run time. */}}
{{- define "corral.auditKeySecret" -}}
{{- .Values.audit.existingKeySecret | default (include "corral.componentName" (list . "audit-keys")) }}
{{- end }}

{{/* The controller's serving certificate Secret (kubernetes.io/tls): yours, or made at run time. */}}
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
Keys, certificates and passwords: never generated here. What a template generates lands in every Helm release
record and changes with every `helm template` or GitOps render. The controller pod's init container makes them
at run time instead (`corral secrets ensure`, controller/corral/cli/secrets.py): each Secret below is created
when absent and kept when present, and the controller's own files are written from it into memory-backed
volumes. Those made at run time, unless a value names a Secret of your own:
  <fullname>-audit-keys             the Ed25519 audit signing keys controller.pem, gateway.pem (audit.existingKeySecret)
  <fullname>-controller-serving     the controller's serving CA and certificate (audit.serving.existingSecret);
                                    its CA also in the ConfigMap <fullname>-controller-serving-ca and the readings
                                    APIService's caBundle
  <fullname>-mosquitto-tls          the bundled broker's CA and certificate (mosquitto.tls.secretName); its CA also
                                    in the Secret <fullname>-mosquitto-ca, for devices
  <fullname>-broker-accounts        the controller's password on the bundled broker (controller-password)
*/}}
{{- define "corral.mosquittoTlsSecret" -}}
{{- .Values.mosquitto.tls.secretName | default (include "corral.componentName" (list . "mosquitto-tls")) }}
{{- end }}

{{/* The bridge's broker password (bridge.enabled): an Opaque Secret the controller's init container makes, labelled
so that the controller keeps the bridge's broker account from it (devices/bridge_accounts.py). */}}
{{- define "corral.bridgeSecret" -}}
{{- include "corral.componentName" (list . "bridge-broker") }}
{{- end }}

{{- define "corral.brokerAccountsSecret" -}}
{{- include "corral.componentName" (list . "broker-accounts") }}
{{- end }}

{{- define "corral.servingCaConfigMap" -}}
{{- include "corral.componentName" (list . "controller-serving-ca") }}
{{- end }}

{{- define "corral.readingsApiService" -}}v1alpha1.readings.corral.dev{{- end }}

{{/* The mount paths of the controller's credential files (--audit-key, --serve-cert/--serve-key, --mqtt-ca,
--mqtt-password-file): each a Secret volume of your own, or a memory-backed volume the init container fills. */}}
{{- define "corral.controllerPasswordFile" -}}/etc/corral/mqtt/password{{- end }}

{{/* What the init container makes (JSON): {secrets: [names], configMaps: [names], apiService: bool, args: [...],
mounts: [volume names it fills]}; {secrets: []} when the values name every Secret. */}}
{{- define "corral.ownSecrets" -}}
{{- $secrets := list }}
{{- $configMaps := list }}
{{- $mounts := list }}
{{- $args := list }}
{{- $apiService := false }}
{{- if not .Values.audit.existingKeySecret }}
{{- $keys := include "corral.auditKeySecret" . }}
{{- $secrets = append $secrets $keys }}
{{- $args = concat $args (list "--ed25519" (printf "%s/controller.pem" $keys)) }}
{{- if .Values.gateway.enabled }}
{{- $args = concat $args (list "--ed25519" (printf "%s/gateway.pem" $keys)) }}
{{- end }}
{{- if .Values.audit.keepOnUninstall }}
{{- $args = concat $args (list "--keep" $keys) }}
{{- end }}
{{- $args = concat $args (list "--write" (printf "%s/controller.pem=/etc/corral/audit-keys/controller.pem" $keys)) }}
{{- $mounts = append $mounts "audit-key" }}
{{- end }}
{{- if not .Values.audit.serving.existingSecret }}
{{- $serving := include "corral.servingSecret" . }}
{{- $secrets = append $secrets $serving }}
{{- $configMaps = append $configMaps (include "corral.servingCaConfigMap" .) }}
{{- $apiService = true }}
{{- $args = concat $args (list "--server-cert" (printf "%s=%s" $serving (include "corral.servingNames" . | fromJsonArray | join ","))
    "--publish-ca" (printf "%s=configmap/%s" $serving (include "corral.servingCaConfigMap" .))
    "--publish-ca" (printf "%s=apiservice/%s" $serving (include "corral.readingsApiService" .))
    "--write" (printf "%s/tls.crt=/etc/corral/serving/tls.crt" $serving)
    "--write" (printf "%s/tls.key=/etc/corral/serving/tls.key" $serving)) }}
{{- $mounts = append $mounts "serving" }}
{{- end }}
{{- if .Values.mosquitto.enabled }}
{{- $accounts := include "corral.brokerAccountsSecret" . }}
{{- $secrets = append $secrets $accounts }}
{{- $args = concat $args (list "--password" (printf "%s/controller-password" $accounts)) }}
{{- if include "corral.bundledBroker" . }}
{{- $args = concat $args (list "--write" (printf "%s/controller-password=%s" $accounts (include "corral.controllerPasswordFile" .))) }}
{{- $mounts = append $mounts "mqtt-password" }}
{{- end }}
{{- if not .Values.mosquitto.tls.secretName }}
{{- $tls := include "corral.mosquittoTlsSecret" . }}
{{- $ca := include "corral.componentName" (list . "mosquitto-ca") }}
{{- $secrets = concat $secrets (list $tls $ca) }}
{{- $args = concat $args (list "--server-cert" (printf "%s=%s" $tls (include "corral.mosquittoServerNames" . | fromJsonArray | join ","))
    "--publish-ca" (printf "%s=secret/%s" $tls $ca)) }}
{{- if and (include "corral.bundledBroker" .) (not .Values.mqtt.caSecret) }}
{{- $args = concat $args (list "--write" (printf "%s/ca.crt=/etc/corral/mqtt-ca/ca.crt" $tls)) }}
{{- $mounts = append $mounts "mqtt-ca" }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson (dict "secrets" $secrets "configMaps" $configMaps "apiService" $apiService "args" $args "mounts" $mounts) }}
{{- end }}

{{/* The broker URL the controller connects with, its username and never a password (`corral run` refuses
one: the password is a file, --mqtt-password-file): the bundled broker's TLS listener as corral-controller, or
mqtt.url with mqtt.username. */}}
{{- define "corral.mqttUrl" -}}
{{- if include "corral.bundledBroker" . }}
{{- if or .Values.mqtt.username .Values.mqtt.password .Values.mqtt.existingSecret }}
{{- fail "mqtt.username, mqtt.password and mqtt.existingSecret are for a broker of your own: with mosquitto.enabled (and mqtt.url at its default) the controller uses the bundled broker's account corral-controller, whose password the controller's init container makes at run time (Secret <fullname>-broker-accounts). Leave them empty." }}
{{- end }}
{{- /* Each replica its own account, its pod name (Kubernetes expands $(POD_NAME) in the container's arguments);
the bundled broker's init container makes one per ordinal (corral.controllerPods). */}}
{{- printf "mqtts://$(POD_NAME)@%s:8883" (include "corral.mosquittoName" .) }}
{{- else }}
{{- $base := .Values.mqtt.url }}
{{- $u := urlParse $base }}
{{- if not (regexMatch "^mqtts?$" $u.scheme) }}
{{- fail (printf "mqtt.url %q must start with mqtt:// or mqtts://" $base) }}
{{- end }}
{{- if contains ":" $u.userinfo }}
{{- fail "mqtt.url carries a password, which would be in the controller's arguments for every local account to read. Keep only the username in it (or in mqtt.username) and give the password as a Secret: mqtt.existingSecret (key mqtt.existingSecretKey), mounted as a file" }}
{{- end }}
{{- if and (or .Values.mqtt.password .Values.mqtt.existingSecret) (not (or .Values.mqtt.username $u.userinfo)) }}
{{- fail "mqtt.password and mqtt.existingSecret need the account's username: set mqtt.username (or put it in mqtt.url, mqtt://USER@host:1883)" }}
{{- end }}
{{- if and .Values.mqtt.password .Values.mqtt.existingSecret }}
{{- fail "mqtt.password and mqtt.existingSecret both give the broker password: keep one (mqtt.existingSecret keeps it out of the release record)" }}
{{- end }}
{{- if .Values.mqtt.username }}
{{- if $u.userinfo }}
{{- fail "mqtt.url carries a username already; remove it from the URL or leave mqtt.username empty" }}
{{- end }}
{{- printf "%s://%s@%s%s" $u.scheme (.Values.mqtt.username | urlquery | replace "+" "%20") $u.host $u.path }}{{ if $u.query }}?{{ $u.query }}{{ end }}
{{- else }}
{{- $base }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret and key of the controller's broker password, as JSON ({} for none): mqtt.existingSecret, the
chart's Secret of mqtt.password, or (bundled broker, {"own": true}) the file the init container writes. */}}
{{- define "corral.mqttPassword" -}}
{{- if include "corral.bundledBroker" . }}
{{- toJson (dict "own" true) }}
{{- else if .Values.mqtt.existingSecret }}
{{- toJson (dict "secret" .Values.mqtt.existingSecret "key" .Values.mqtt.existingSecretKey) }}
{{- else if .Values.mqtt.password }}
{{- toJson (dict "secret" (include "corral.componentName" (list . "mqtt")) "key" "password") }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/* The Secret and key of the CA the controller verifies the broker with (--mqtt-ca), as JSON; {} for none
(the system's CAs). mqtt.caSecret, else the bundled broker's CA when the controller uses it: mosquitto.tls.secretName,
or ({"own": true}) the file the init container writes from the CA it made. */}}
{{- define "corral.mqttCa" -}}
{{- if .Values.mqtt.caSecret }}
{{- toJson (dict "secret" .Values.mqtt.caSecret "key" .Values.mqtt.caSecretKey) }}
{{- else if include "corral.bundledBroker" . }}
{{- if .Values.mosquitto.tls.secretName }}
{{- toJson (dict "secret" .Values.mosquitto.tls.secretName "key" "ca.crt") }}
{{- else }}
{{- toJson (dict "own" true "key" "ca.crt") }}
{{- end }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/* Refusals that concern several values, with what to set instead. Included by the controller StatefulSet. */}}
{{- define "corral.checks" -}}
{{- if and .Values.signing.require (not .Values.signing.keysSecret) }}
{{- fail "signing.require is true (the default), so the controller refuses device contracts without a valid signature, but signing.keysSecret is empty. Make a signing key and trust it (corral contracts keygen --key vendor.pem --secret NAMESPACE/corral-signing-keys), sign your firmware's contracts with it (corral contracts sign --key vendor.pem --out signed.json), and set signing.keysSecret=corral-signing-keys: a Secret in the release namespace whose data entries are the trusted Ed25519 public keys (or kubectl create secret generic corral-signing-keys -n NAMESPACE --from-file=vendor=PUBLIC_KEY_FILE). Or set signing.require=false to accept unsigned contracts (only on a network you trust)." }}
{{- end }}
{{- if .Values.mosquitto.enabled }}
{{- if and (include "corral.bundledBroker" .) (not .Values.mqtt.manageAccounts) }}
{{- fail "mqtt.manageAccounts=false cannot be used with the bundled broker: it admits only the accounts the controller makes for enrolled devices, so no device could connect. Leave mqtt.manageAccounts true, or use a broker of your own (mqtt.url)." }}
{{- end }}
{{- end }}
{{- if and .Values.mosquitto.enabled (ne .Values.mosquitto.service.type "ClusterIP") (not .Values.nodeAddress) (not .Values.mosquitto.tls.extraNames) (not .Values.mosquitto.tls.secretName) }}
{{- fail (printf "mosquitto.service.type is %s, so devices on your LAN connect to this node's address, but nodeAddress is empty: the broker's certificate (made at run time) would not name that address and every device's TLS check would fail. Set nodeAddress to the node's IP address or DNS name as devices use it (--set nodeAddress=192.168.1.10; values-k3s.yaml), or name it in mosquitto.tls.extraNames." .Values.mosquitto.service.type) }}
{{- end }}
{{- if and .Values.gateway.enabled (ne .Values.gateway.service.type "ClusterIP") (not .Values.nodeAddress) (not .Values.gateway.allowedHosts) (not .Values.gateway.publicUrl) }}
{{- fail (printf "gateway.service.type is %s, so agents on your LAN reach the gateway at this node's address, but nodeAddress is empty: the gateway answers a request for a host it does not know with 421 (Invalid Host header; its DNS rebinding protection). Set nodeAddress to the node's IP address or DNS name as agents use it (--set nodeAddress=192.168.1.10; values-k3s.yaml), or name the host in gateway.allowedHosts (HOST:PORT) or gateway.publicUrl." .Values.gateway.service.type) }}
{{- end }}
{{- if and .Values.audit.persistence.enabled .Values.audit.persistence.existingClaim (gt (int .Values.controller.replicas) 1) }}
{{- fail (printf "controller.replicas is %d, but audit.persistence.existingClaim gives every controller pod ONE audit log volume, and a log has one writer (the second pod would find it locked and exit). Leave existingClaim empty (each replica gets a claim of its own from the StatefulSet, one chain per ordinal), or run controller.replicas=1." (int .Values.controller.replicas)) }}
{{- end }}
{{- $election := .Values.controller.leaderElection }}
{{- if not (gt (float64 $election.leaseDurationSeconds) (float64 $election.renewDeadlineSeconds)) }}
{{- fail (printf "controller.leaderElection.renewDeadlineSeconds (%v) must be below leaseDurationSeconds (%v): a leader that cannot renew must stop acting before another replica may take its Lease." $election.renewDeadlineSeconds $election.leaseDurationSeconds) }}
{{- end }}
{{- if not (gt (float64 $election.renewDeadlineSeconds) (mulf $election.retryPeriodSeconds 1.2)) }}
{{- fail (printf "controller.leaderElection.renewDeadlineSeconds (%v) must be more than 1.2 x retryPeriodSeconds (%v), as in client-go: a leader must get more than one try at renewing before its deadline." $election.renewDeadlineSeconds $election.retryPeriodSeconds) }}
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

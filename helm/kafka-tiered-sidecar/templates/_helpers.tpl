{{/*
Names and labels.
*/}}
{{- define "kafka-tiered-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-tiered-sidecar.fullname" -}}
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

{{- define "kafka-tiered-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-tiered-sidecar.labels" -}}
helm.sh/chart: {{ include "kafka-tiered-sidecar.chart" . }}
app.kubernetes.io/name: {{ include "kafka-tiered-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Name of the bundled Kafka's StatefulSet (and of its pods' prefix). */}}
{{- define "kafka-tiered-sidecar.kafkaName" -}}
{{- printf "%s-kafka" (include "kafka-tiered-sidecar.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* Labels selecting the bundled Kafka's pods. */}}
{{- define "kafka-tiered-sidecar.kafkaSelectorLabels" -}}
app.kubernetes.io/name: kafka
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end }}

{{/* Labels of the broker pods that carry the sidecar: the bundled Kafka's or metrics.podSelector. */}}
{{- define "kafka-tiered-sidecar.brokerPodSelector" -}}
{{- if .Values.kafka.enabled }}
{{- include "kafka-tiered-sidecar.kafkaSelectorLabels" . }}
{{- else if .Values.metrics.podSelector }}
{{- toYaml .Values.metrics.podSelector }}
{{- else }}
{{- fail "metrics.podSelector is required with kafka.enabled=false: the labels of the broker pods that run the sidecar" }}
{{- end }}
{{- end }}

{{- define "kafka-tiered-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-tiered-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kafka-tiered-sidecar.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The sidecar's configuration as a dict: chart defaults < values.config < what the pod layout fixes.
*/}}
{{- define "kafka-tiered-sidecar.configDict" -}}
{{- $user := deepCopy (.Values.config | default dict) }}
{{- $owned := list "state_dir" "read_server.socket_path" "read_server.cache_dir" "metrics.host" "metrics.port" }}
{{- range $owned }}
{{- $parts := splitList "." . }}
{{- if eq (len $parts) 1 }}
{{- if hasKey $user (index $parts 0) }}
{{- fail (printf "config.%s is set by the chart from the pod layout; remove it from values (the metrics port is sidecar.metricsPort)" .) }}
{{- end }}
{{- else if and (hasKey $user (index $parts 0)) (hasKey (index $user (index $parts 0) | default dict) (index $parts 1)) }}
{{- fail (printf "config.%s is set by the chart from the pod layout; remove it from values (the metrics port is sidecar.metricsPort)" .) }}
{{- end }}
{{- end }}
{{- $secrets := list (list "s3" "access_key_id" "s3.existingSecret") (list "s3" "secret_access_key" "s3.existingSecret") (list "kafka" "sasl_password" "kafkaAuth.existingSecret") }}
{{- range $secrets }}
{{- $section := index $user (index . 0) | default dict }}
{{- if hasKey $section (index . 1) }}
{{- fail (printf "config.%s.%s is a secret: store it in a Secret and set %s (values end up in the ConfigMap and the release history)" (index . 0) (index . 1) (index . 2)) }}
{{- end }}
{{- end }}
{{- $defaults := dict }}
{{- if .Values.kafka.enabled }}
{{- $_ := set $defaults "remote_log_metadata" (dict "replication_factor" 1) }}
{{- end }}
{{- $layout := dict
  "state_dir" "/var/lib/kafka-tiered-sidecar"
  "read_server" (dict "socket_path" "/run/kafka-tiered-sidecar/read.sock" "cache_dir" "/var/cache/kafka-tiered-sidecar")
  "metrics" (dict "host" "0.0.0.0" "port" (int .Values.sidecar.metricsPort)) }}
{{- $cfg := mustMergeOverwrite $defaults $user $layout }}
{{- toJson $cfg }}
{{- end }}

{{/*
Render a dict as TOML: scalars and lists first, then one [table] per nested dict, without blank
lines (they would carry trailing spaces once indented). Values go through toJson, so whole
numbers stay integers (Helm's toToml writes 9464 as 9464.0) and strings are TOML basic strings;
a list of tables (retention.overrides) is a list of inline tables.
*/}}
{{- define "kafka-tiered-sidecar.toml" -}}
{{- $table := .table }}
{{- $header := .header }}
{{- range $key, $value := $table }}
{{- if and (not (kindIs "map" $value)) (not (kindIs "invalid" $value)) }}
{{ include "kafka-tiered-sidecar.tomlKey" $key }} = {{ include "kafka-tiered-sidecar.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- if kindIs "map" $value }}
{{- $name := printf "%s%s" $header (include "kafka-tiered-sidecar.tomlKey" $key) }}
[{{ $name }}]
{{- include "kafka-tiered-sidecar.toml" (dict "table" $value "header" (printf "%s." $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A TOML value on one line: a table (an entry of a list of tables such as retention.overrides) as
an inline table, a list item by item, anything else through toJson.
*/}}
{{- define "kafka-tiered-sidecar.tomlValue" -}}
{{- if kindIs "map" . }}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- if not (kindIs "invalid" $value) }}
{{- $pairs = append $pairs (printf "%s = %s" (include "kafka-tiered-sidecar.tomlKey" $key) (include "kafka-tiered-sidecar.tomlValue" $value)) }}
{{- end }}
{{- end }}
{{- printf "{ %s }" (join ", " $pairs) }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}
{{- $items = append $items (include "kafka-tiered-sidecar.tomlValue" .) }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- toJson . }}
{{- end }}
{{- end }}

{{- define "kafka-tiered-sidecar.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* Fail early on settings that cannot work together. */}}
{{- define "kafka-tiered-sidecar.validate" -}}
{{- if not (has .Values.sidecar.mode (list "native" "container")) }}
{{- fail (printf "sidecar.mode must be native or container, not %q" .Values.sidecar.mode) }}
{{- end }}
{{- if and (eq .Values.sidecar.mode "native") (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "sidecar.mode=native needs Kubernetes 1.29 or newer (this is %s); set sidecar.mode=container" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- $cfg := include "kafka-tiered-sidecar.configDict" . | fromJson }}
{{- $broker := $cfg.broker | default dict }}
{{- $mount := trimSuffix "/" .Values.logVolume.mountPath }}
{{- range ($broker.log_dirs | default list) }}
{{- if not (or (eq (trimSuffix "/" .) $mount) (hasPrefix (printf "%s/" $mount) .)) }}
{{- fail (printf "config.broker.log_dirs entry %s is not under logVolume.mountPath %s: the sidecar would not see it" . $mount) }}
{{- end }}
{{- end }}
{{- $drain := (($cfg.tiering | default dict).drain_timeout_s | default 30) | float64 }}
{{- if le (float64 .Values.terminationGracePeriodSeconds) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed config.tiering.drain_timeout_s (%v), or uploads are killed mid-drain" .Values.terminationGracePeriodSeconds $drain) }}
{{- end }}
{{- end }}

{{/* The sidecar container; `native` adds restartPolicy: Always (an init container). */}}
{{- define "kafka-tiered-sidecar.container" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- name: tiered-sidecar
  image: {{ include "kafka-tiered-sidecar.image" $root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  args:
    {{- toYaml $v.sidecar.args | nindent 4 }}
  {{- if or $v.s3.existingSecret $v.kafkaAuth.existingSecret $v.sidecar.extraEnv }}
  env:
    {{- if $v.s3.existingSecret }}
    - name: SIDECAR_S3__ACCESS_KEY_ID
      valueFrom:
        secretKeyRef:
          name: {{ $v.s3.existingSecret }}
          key: {{ $v.s3.accessKeyIdKey }}
    - name: SIDECAR_S3__SECRET_ACCESS_KEY
      valueFrom:
        secretKeyRef:
          name: {{ $v.s3.existingSecret }}
          key: {{ $v.s3.secretAccessKeyKey }}
    {{- end }}
    {{- if $v.kafkaAuth.existingSecret }}
    - name: SIDECAR_KAFKA__SASL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ $v.kafkaAuth.existingSecret }}
          key: {{ $v.kafkaAuth.passwordKey }}
    {{- end }}
    {{- with $v.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: metrics
      containerPort: {{ $v.sidecar.metricsPort }}
      protocol: TCP
  {{- with $v.sidecar.probes.startup }}
  {{- if and .enabled (not $.native) }}
  startupProbe:
    httpGet:
      path: /healthz
      port: metrics
    {{- toYaml (omit . "enabled") | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with $v.sidecar.probes.liveness }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    {{- toYaml (omit . "enabled") | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with $v.sidecar.probes.readiness }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    {{- toYaml (omit . "enabled") | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- with $v.sidecar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.sidecar.securityContext | nindent 4 }}
  volumeMounts:
    - name: {{ $v.logVolume.name }}
      mountPath: {{ $v.logVolume.mountPath }}
      readOnly: true
    - name: tiered-sidecar-config
      mountPath: /etc/kafka-tiered-sidecar
      readOnly: true
    - name: tiered-sidecar-state
      mountPath: /var/lib/kafka-tiered-sidecar
    - name: tiered-sidecar-cache
      mountPath: /var/cache/kafka-tiered-sidecar
    - name: tiered-sidecar-run
      mountPath: /run/kafka-tiered-sidecar
    - name: tiered-sidecar-tmp
      mountPath: /tmp
    {{- with $v.sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The broker plugin. The jar ships in the sidecar image; an init container copies it into the pod
volume tiered-sidecar-plugin, which the broker mounts at plugin.mountPath. The broker also mounts
the sidecar's socket directory (the socket is 0660, group fsGroup: the pod's fsGroup makes the
emptyDir group-owned and setgid), and the chunk cache read-only at the sidecar's own path: the
plugin reads cached chunk files itself (read_server.offer_cache_files) instead of being sent them.
*/}}
{{- define "kafka-tiered-sidecar.pluginJarInImage" -}}
/opt/kafka-tiered-sidecar/plugin/kafka-tiered-sidecar-plugin.jar
{{- end }}

{{- define "kafka-tiered-sidecar.pluginInitContainer" -}}
- name: tiered-sidecar-plugin
  image: {{ include "kafka-tiered-sidecar.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["cp", {{ include "kafka-tiered-sidecar.pluginJarInImage" . | quote }}, "/plugin/kafka-tiered-sidecar-plugin.jar"]
  {{- with .Values.plugin.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.sidecar.securityContext | nindent 4 }}
  volumeMounts:
    - name: tiered-sidecar-plugin
      mountPath: /plugin
{{- end }}

{{/* What the broker container mounts for the plugin: the jar's volume, the socket's and the
chunk cache's. */}}
{{- define "kafka-tiered-sidecar.pluginBrokerMounts" -}}
- name: tiered-sidecar-plugin
  mountPath: {{ .Values.plugin.mountPath }}
  readOnly: true
- name: tiered-sidecar-run
  mountPath: /run/kafka-tiered-sidecar
  readOnly: true
- name: tiered-sidecar-cache
  mountPath: /var/cache/kafka-tiered-sidecar
  readOnly: true
{{- end }}

{{/*
The broker properties as a JSON object: what `sidecar broker-config` prints for the rendered
sidecar.toml (tests/deploy compares the two). Defaults are the sidecar's own.
*/}}
{{- define "kafka-tiered-sidecar.brokerProperties" -}}
{{- $cfg := include "kafka-tiered-sidecar.configDict" . | fromJson }}
{{- $meta := $cfg.remote_log_metadata | default dict }}
{{- $read := $cfg.read_server | default dict }}
{{- if and (hasKey $meta "topic") (ne $meta.topic "__remote_log_metadata") }}
{{- fail (printf "config.remote_log_metadata.topic is %s, but Kafka's metadata manager always uses __remote_log_metadata: plugin.enabled needs the default topic" $meta.topic) }}
{{- end }}
{{- $idle := mulf (float64 (hasKey $read "fetch_timeout_s" | ternary $read.fetch_timeout_s 30)) 1000 | int64 }}
{{- $props := dict
  "remote.log.storage.system.enable" "true"
  "remote.log.storage.manager.class.name" "io.github.kafkatieredsidecar.plugin.SidecarRemoteStorageManager"
  "remote.log.storage.manager.class.path" (printf "%s/kafka-tiered-sidecar-plugin.jar" (trimSuffix "/" .Values.plugin.mountPath))
  "rsm.config.socket.path" $read.socket_path
  "rsm.config.read.idle.timeout.ms" (toString $idle)
  "remote.log.metadata.manager.class.name" "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
  "remote.log.metadata.manager.listener.name" .Values.plugin.listenerName
  "rlmm.config.remote.log.metadata.topic.num.partitions" (toString (int64 (hasKey $meta "num_partitions" | ternary $meta.num_partitions 50)))
  "rlmm.config.remote.log.metadata.topic.replication.factor" (toString (int64 (hasKey $meta "replication_factor" | ternary $meta.replication_factor 3)))
  "rlmm.config.remote.log.metadata.topic.retention.ms" (toString (int64 (hasKey $meta "retention_ms" | ternary $meta.retention_ms -1))) }}
{{- if and (hasKey $read "offer_cache_files") (not $read.offer_cache_files) }}
{{- $_ := set $props "rsm.config.fetch.files" "false" }}
{{- end }}
{{- toJson $props }}
{{- end }}

{{/* The pod volumes the sidecar needs besides the broker's log volume. */}}
{{- define "kafka-tiered-sidecar.volumes" -}}
- name: tiered-sidecar-config
  configMap:
    name: {{ include "kafka-tiered-sidecar.fullname" . }}
- name: tiered-sidecar-state
  {{- toYaml .Values.stateVolume | nindent 2 }}
- name: tiered-sidecar-cache
  {{- toYaml .Values.cacheVolume | nindent 2 }}
- name: tiered-sidecar-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: tiered-sidecar-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.plugin.enabled }}
- name: tiered-sidecar-plugin
  emptyDir:
    sizeLimit: 16Mi
{{- end }}
{{- end }}

{{/* `sidecar broker-config --check` as the install notes print it: run in the sidecar container,
with the jar path and listener of the broker properties above. */}}
{{- define "kafka-tiered-sidecar.notesCheck" -}}
sidecar broker-config -c /etc/kafka-tiered-sidecar/sidecar.toml --check --plugin-jar {{ trimSuffix "/" .Values.plugin.mountPath }}/kafka-tiered-sidecar-plugin.jar --listener {{ .Values.plugin.listenerName }}
{{- end }}

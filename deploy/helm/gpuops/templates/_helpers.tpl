{{/* Names and labels shared by every object of the chart. */}}
{{- define "gpuops.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "gpuops.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpuops.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuops.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpuops.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name | default (include "gpuops.fullname" .) }}
{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{- define "gpuops.secretName" -}}
{{ .Values.existingSecret | default (printf "%s-secrets" (include "gpuops.fullname" .)) }}
{{- end -}}

{{/* The service config file (docs/serve.md) for one kind of serve process; arg: dict root, scoring */}}
{{- define "gpuops.serviceConfig" -}}
{{- $v := .root.Values -}}
{{- $adapterOptions := $v.controlPlane.adapter.options | default dict -}}
{{- if eq $v.controlPlane.adapter.name "kubernetes" -}}
{{- $adapterOptions = merge (dict "in_cluster" true) $adapterOptions -}}
{{- end -}}
{{- $cfg := dict
  "host" "0.0.0.0"
  "port" (int $v.controlPlane.port)
  "state_dir" "/var/lib/gpuops"
  "kafka_bootstrap" $v.kafka.bootstrap
  "adapter" (dict "name" $v.controlPlane.adapter.name "options" $adapterOptions)
  "safety" $v.safety
  "policy" ($v.policy | default dict)
  "scoring" (dict "enabled" .scoring "workers" (int $v.scoringWorkers.workersPerPod) "group" $v.scoringWorkers.group)
-}}
{{- if $v.commands.enabled -}}
{{- $_ := set $cfg "commands" (dict "key_file" "/etc/gpuops/secrets/commands.key" "ttl_s" $v.commands.ttl_s) -}}
{{- end -}}
{{- toYaml (mergeOverwrite (deepCopy ($v.config | default dict)) $cfg) -}}
{{- end -}}

{{/* Environment every serve process gets: its replica name, the store and the tokens from the Secret. */}}
{{- define "gpuops.serveEnv" -}}
- name: GPUOPS_REPLICA
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: GPUOPS_STORE_URL
  valueFrom: {secretKeyRef: {name: {{ include "gpuops.secretName" . }}, key: store-url}}
- name: GPUOPS_AUTH__TOKENS
  valueFrom: {secretKeyRef: {name: {{ include "gpuops.secretName" . }}, key: auth-tokens}}
- name: NUMBA_CACHE_DIR
  value: /tmp/numba
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- end -}}

{{/* The pod spec of a gpuops serve process; arg: dict root, file (config key), part (values section). */}}
{{- define "gpuops.servePod" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
serviceAccountName: {{ include "gpuops.serviceAccountName" $root }}
{{- with $v.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
containers:
  - name: gpuops
    image: {{ include "gpuops.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args: ["serve", "--config", "/etc/gpuops/{{ .file }}"]
    env: {{- include "gpuops.serveEnv" $root | nindent 6 }}
    ports:
      - {name: http, containerPort: {{ $v.controlPlane.port }}, protocol: TCP}
    readinessProbe:
      httpGet: {path: /readyz, port: http}
      periodSeconds: 10
    livenessProbe:
      httpGet: {path: /healthz, port: http}
      initialDelaySeconds: 30
      periodSeconds: 20
    resources: {{- toYaml .part.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
    volumeMounts:
      - {name: config, mountPath: /etc/gpuops, readOnly: true}
      - {name: state, mountPath: /var/lib/gpuops}
      - {name: tmp, mountPath: /tmp}
      {{- if $v.commands.enabled }}
      - {name: secrets, mountPath: /etc/gpuops/secrets, readOnly: true}
      {{- end }}
volumes:
  - name: config
    configMap: {name: {{ include "gpuops.fullname" $root }}-config}
  - name: state
    emptyDir: {}
  - name: tmp
    emptyDir: {}
  {{- if $v.commands.enabled }}
  - name: secrets
    secret:
      secretName: {{ include "gpuops.secretName" $root }}
      defaultMode: 0400
      items: [{key: commands.key, path: commands.key}]
  {{- end }}
{{- with .part.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .part.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .part.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

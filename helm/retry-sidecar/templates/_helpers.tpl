{{/* Names and labels. */}}
{{- define "retry-sidecar.name" -}}
{{- printf "%s-%s" .Release.Name "retry-sidecar" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "retry-sidecar.labels" -}}
app.kubernetes.io/name: retry-sidecar
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
{{- end -}}

{{/* The sidecar's config as YAML: values.config with the admin port bound on the pod's address, and who
besides loopback clients may use its console (consoleAllow), under which names besides IPs and localhost
(consoleHosts). */}}
{{- define "retry-sidecar.configYaml" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg "admin" (dict "listen" (printf "0.0.0.0:%d" (int .Values.adminPort)) "console_allow" (.Values.consoleAllow | default list) "console_hosts" (.Values.consoleHosts | default list)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "retry-sidecar.configMapName" -}}
{{- .Values.existingConfigMap | default (printf "%s-config" (include "retry-sidecar.name" .)) -}}
{{- end -}}

{{/* Pod annotations: a checksum of the config, so that a config change rolls the pods. */}}
{{- define "retry-sidecar.podAnnotations" -}}
checksum/retry-sidecar-config: {{ include "retry-sidecar.configYaml" . | sha256sum }}
{{- end -}}

{{/*
The sidecar as a native sidecar (KEP-753): one entry of the pod's initContainers, with restartPolicy Always.
It starts before the app containers (they wait for its startupProbe: /readyz, every listener bound) and stops
after them.
*/}}
{{- define "retry-sidecar.container" -}}
- name: retry-sidecar
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["run", "-c", "/etc/sidecar/{{ .Values.configKey }}"]
  ports:
    - {name: admin, containerPort: {{ .Values.adminPort }}, protocol: TCP}
  startupProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: {{ .Values.probes.startup.periodSeconds }}
    failureThreshold: {{ .Values.probes.startup.failureThreshold }}
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
    failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
    - {name: retry-sidecar-config, mountPath: /etc/sidecar, readOnly: true}
{{- end -}}

{{/* The volume the container mounts: the config's ConfigMap (mounted as a directory: updates reach the pod). */}}
{{- define "retry-sidecar.volumes" -}}
- name: retry-sidecar-config
  configMap:
    name: {{ include "retry-sidecar.configMapName" . }}
{{- end -}}

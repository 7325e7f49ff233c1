{{/*
The labels every object of deploy/ carries (app.kubernetes.io/name, part-of, and component when
given), then Helm's own. Call with (dict "root" $ "component" "extender").
*/}}
{{- define "gpu-extender.labels" -}}
app.kubernetes.io/name: gpu-extender
app.kubernetes.io/part-of: gpu-extender
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{ include "gpu-extender.helmLabels" .root }}
{{- end }}

{{/* The labels Helm adds to what deploy/ has, never in a selector. */}}
{{- define "gpu-extender.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The gpu-scheduler pods, as the Deployment, Service, PDB and NetworkPolicy select them. */}}
{{- define "gpu-extender.schedulerSelector" -}}
app.kubernetes.io/name: gpu-extender
app.kubernetes.io/component: gpu-scheduler
{{- end }}

{{- define "gpu-extender.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The port of a host:port (config.server.listen, config.server.adminListen). */}}
{{- define "gpu-extender.port" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end }}

{{/* Where the TLS Secret is mounted in each container. */}}
{{- define "gpu-extender.tlsDir" -}}/etc/gpu-extender/tls{{- end }}
{{- define "gpu-extender.schedulerTlsDir" -}}/etc/kubernetes/gpu-extender-tls{{- end }}
{{- define "gpu-extender.adminTlsDir" -}}/etc/gpu-extender/admin-tls{{- end }}
{{- define "gpu-extender.estimatorTlsDir" -}}/etc/gpu-extender/estimator-tls{{- end }}

{{/*
The extender's configuration file: config, with server.tls pointing at the mounted Secret when
tls.enabled, server.adminTls at its own when adminTls.enabled, and server.schedulerNames the profile's name (schedulerName) unless config sets it.
*/}}
{{- define "gpu-extender.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $server := get $config "server" | default dict -}}
{{- if .Values.tls.enabled -}}
{{- $dir := include "gpu-extender.tlsDir" . -}}
{{- $_ := set $server "tls" (dict "certFile" (printf "%s/tls.crt" $dir) "keyFile" (printf "%s/tls.key" $dir)) -}}
{{- end -}}
{{- if .Values.adminTls.enabled -}}
{{- $dir := include "gpu-extender.adminTlsDir" . -}}
{{- $_ := set $server "adminTls" (dict "certFile" (printf "%s/tls.crt" $dir) "keyFile" (printf "%s/tls.key" $dir)) -}}
{{- end -}}
{{- if not (hasKey $server "schedulerNames") -}}
{{- $_ := set $server "schedulerNames" (list .Values.schedulerName) -}}
{{- end -}}
{{- $_ := set $config "server" $server -}}
{{- toYaml $config -}}
{{- end }}

{{/*
kube-scheduler's URL of the extender: the sidecar's listen address on the pod's loopback (a
wildcard host is dialled as 127.0.0.1), its URL prefix, https with tls.enabled. The binary's
defaults (docs/configuration.md) where config leaves them out.
*/}}
{{- define "gpu-extender.urlPrefix" -}}
{{- $server := .Values.config.server | default dict -}}
{{- $listen := $server.listen | default "127.0.0.1:8888" -}}
{{- $host := regexReplaceAll ":[0-9]+$" $listen "" -}}
{{- if has $host (list "0.0.0.0" "[::]" "") -}}
{{- $host = "127.0.0.1" -}}
{{- end -}}
{{- printf "%s://%s:%s%s" (ternary "https" "http" .Values.tls.enabled) $host (include "gpu-extender.port" $listen) ($server.urlPrefix | default "/scheduler") -}}
{{- end }}

{{/* The extender's admin port (probes, /metrics). */}}
{{- define "gpu-extender.adminPort" -}}
{{- $server := .Values.config.server | default dict -}}
{{- include "gpu-extender.port" ($server.adminListen | default "0.0.0.0:9090") -}}
{{- end }}

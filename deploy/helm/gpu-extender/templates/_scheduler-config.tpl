{{/*
kube-scheduler's configuration (deploy/kube-scheduler-config.yaml; docs/install.md explains every
line): in-cluster credentials, leader election on its own Lease, the profile, the extender stanza.
*/}}
{{- define "gpu-extender.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.leaderElection.enabled }}
{{- if .Values.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ .Values.schedulerName }}
  resourceNamespace: {{ .Release.Namespace }}
  leaseDuration: {{ .Values.leaderElection.leaseDuration }}
  renewDeadline: {{ .Values.leaderElection.renewDeadline }}
  retryPeriod: {{ .Values.leaderElection.retryPeriod }}
{{- end }}
{{- /* Unset or 0: kube-scheduler's adaptive window, for every policy (decision 0012). */}}
{{- with .Values.kubeScheduler.percentageOfNodesToScore }}
percentageOfNodesToScore: {{ . }}
{{- end }}
profiles:
  - schedulerName: {{ .Values.schedulerName }}
    pluginConfig:
      - name: NodeResourcesFit
        args:
          # A per-GPU percentage: a node-wide sum would be wrong (the extender checks it per GPU).
          ignoredResources:
            - {{ (.Values.config.resources | default dict).gpuCore | default "aliyun.com/gpu-core.percentage" }}
extenders:
  - urlPrefix: {{ include "gpu-extender.urlPrefix" . }}
{{- if .Values.tls.enabled }}
    enableHTTPS: true
    tlsConfig:
      caFile: {{ include "gpu-extender.schedulerTlsDir" . }}/ca.crt
{{- with .Values.tls.serverName }}
      serverName: {{ . }}
{{- end }}
{{- end }}
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    bindVerb: bind
    weight: {{ .Values.extenderStanza.weight }}
    nodeCacheCapable: true
    httpTimeout: {{ .Values.extenderStanza.httpTimeout }}
    ignorable: {{ .Values.extenderStanza.ignorable }}
{{- end }}

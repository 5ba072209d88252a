{{/* Chart name. */}}
{{- define "gpusched.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: the release name if it contains the chart name, else "<release>-gpusched". */}}
{{- define "gpusched.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "gpusched.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; pass (dict "ctx" $ "component" "scheduler"). */}}
{{- define "gpusched.labels" -}}
helm.sh/chart: {{ include "gpusched.chart" .ctx }}
{{ include "gpusched.selectorLabels" . }}
app.kubernetes.io/part-of: gpusched
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/* Selector labels; pass (dict "ctx" $ "component" "scheduler"). */}}
{{- define "gpusched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpusched.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpusched.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The kube-scheduler's leader Lease (in the release namespace). */}}
{{- define "gpusched.kubeSchedulerLease" -}}
{{- printf "%s-kube-scheduler" (include "gpusched.fullname" .) }}
{{- end }}

{{/* Preferred anti-affinity spreading a component's replicas over nodes, unless .Values.affinity is set. */}}
{{- define "gpusched.affinity" -}}
{{- if .ctx.Values.affinity }}
{{- toYaml .ctx.Values.affinity }}
{{- else }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gpusched.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations and imagePullSecrets of every pod. */}}
{{- define "gpusched.podPlacement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Fail early on a bad mode. */}}
{{- define "gpusched.validate" -}}
{{- if not (has .Values.mode (list "standalone" "extender")) }}
{{- fail (printf "mode must be \"standalone\" or \"extender\", got %q" .Values.mode) }}
{{- end }}
{{- end }}

{{/* fabricxfer.name: the chart name. */}}
{{- define "fabricxfer.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* fabricxfer.fullname: the operator's object names; "fabricxfer-operator" for a release named fabricxfer. */}}
{{- define "fabricxfer.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s-operator" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* fabricxfer.labels: on every object. */}}
{{- define "fabricxfer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: fabricxfer
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* fabricxfer.selectorLabels: the operator pods; never change across upgrades (Deployment selectors are immutable). */}}
{{- define "fabricxfer.selectorLabels" -}}
app.kubernetes.io/name: fabricxfer-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* fabricxfer.operatorLabels: common labels plus the selector labels (instance is in both). */}}
{{- define "fabricxfer.operatorLabels" -}}
{{ include "fabricxfer.labels" . }}
app.kubernetes.io/name: fabricxfer-operator
app.kubernetes.io/component: operator
{{- end }}

{{/* fabricxfer.serviceAccountName */}}
{{- define "fabricxfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fabricxfer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* fabricxfer.image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "fabricxfer.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) }}
{{- end }}

{{/* fabricxfer.agentNamespace: where the operator runs every pool's agents (agent.namespace, else the release's). */}}
{{- define "fabricxfer.agentNamespace" -}}
{{- default .Release.Namespace .Values.agent.namespace -}}
{{- end }}

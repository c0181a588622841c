{{/* Labels and selectors. Keep them equal to deploy/kubernetes/. */}}
{{- define "warden.name" -}}
{{ .Values.nameOverride | default "warden" }}
{{- end }}

{{- define "warden.agent.labels" -}}
app.kubernetes.io/name: {{ include "warden.name" . }}-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: warden
{{- end }}

{{- define "warden.agent.selector" -}}
app.kubernetes.io/name: {{ include "warden.name" . }}-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "warden.controller.labels" -}}
app.kubernetes.io/name: {{ include "warden.name" . }}-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: warden
{{- end }}

{{- define "warden.controller.selector" -}}
app.kubernetes.io/name: {{ include "warden.name" . }}-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "warden.fullname" -}}
{{ .Values.fullnameOverride | default .Release.Name }}
{{- end }}

{{- define "warden.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.name }}
{{- .Values.agent.serviceAccount.name }}
{{- else }}
{{- include "warden.fullname" . }}-agent
{{- end }}
{{- end }}

{{- define "warden.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.name }}
{{- .Values.controller.serviceAccount.name }}
{{- else }}
{{- include "warden.fullname" . }}-controller
{{- end }}
{{- end }}

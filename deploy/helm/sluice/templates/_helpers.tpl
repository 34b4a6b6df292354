{{/* The release's name for its objects: the release name, plus "-sluice" unless it says sluice. */}}
{{- define "sluice.fullname" -}}
{{- if contains "sluice" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sluice" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" -}}
{{- end -}}

{{/* The services and their values keys. */}}
{{- define "sluice.services" -}}
ingester: ingester
state-updater: stateUpdater
resolver: resolver
dispatcher: dispatcher
api: api
{{- end -}}

{{/* Labels of every object; call with (dict "root" $ "component" "resolver"). */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" .root }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The Kafka user of a service (the ACL set's principal is User:<this>). */}}
{{- define "sluice.kafkaUser" -}}
{{ include "sluice.fullname" .root }}-{{ .component }}
{{- end -}}

{{/* Environment every service gets: its identity and its Kafka credentials. */}}
{{- define "sluice.env" -}}
# The StatefulSet ordinal: stable across restarts and reschedules, so the
# transactional id, the static group membership and the dispatcher's epochs
# of a restarted pod are its predecessor's (it fences the zombie).
- name: SLUICE_INSTANCE
  valueFrom: { fieldRef: { fieldPath: "metadata.labels['apps.kubernetes.io/pod-index']" } }
{{- if hasPrefix "SASL" .root.Values.kafka.securityProtocol }}
- name: SLUICE_RDKAFKA_SASL_USERNAME
  value: {{ include "sluice.kafkaUser" . }}
- name: SLUICE_RDKAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      {{- if .root.Values.kafka.strimzi.users }}
      name: {{ include "sluice.kafkaUser" . }}
      key: password
      {{- else }}
      name: {{ .root.Values.kafka.credentialsSecret }}
      key: {{ .component }}
      {{- end }}
{{- end }}
{{- if .root.Values.kafka.caSecret }}
- name: SLUICE_RDKAFKA_SSL_CA_LOCATION
  value: /etc/sluice/kafka-ca/ca.crt
{{- end }}
{{- end -}}

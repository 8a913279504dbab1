{{/* Resource name prefix: the release name, plus the chart name unless the release name already contains it. */}}
{{- define "flashdraft.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flashdraft.labels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "flashdraft.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flashdraft.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (pipeline parameter s3_secret_name). */}}
{{- define "flashdraft.s3SecretName" -}}
{{- default (printf "%s-s3" (include "flashdraft.fullname" .)) .Values.s3.existingSecret -}}
{{- end -}}

{{/* The Secret holding the trackers' MLflow/W&B variables (pipeline parameter tracking_secret_name; optional in
pods, so the name is set even when no such Secret exists). */}}
{{- define "flashdraft.trackingSecretName" -}}
{{- default (printf "%s-tracking" (include "flashdraft.fullname" .)) .Values.tracking.existingSecret -}}
{{- end -}}

{{/* The Secret holding HF_TOKEN / HF_ENDPOINT (pipeline parameter hub_secret_name; optional in pods, so the name is
set even when no such Secret exists). */}}
{{- define "flashdraft.hubSecretName" -}}
{{- default (printf "%s-hub" (include "flashdraft.fullname" .)) .Values.hub.existingSecret -}}
{{- end -}}

{{- define "flashdraft.objectStoreName" -}}
{{- printf "%s-objectstore" (include "flashdraft.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The S3 keys from the chart's S3 Secret, as env of the trial store's identity step. */}}
{{- define "flashdraft.objectStoreKeys" -}}
{{- range list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "flashdraft.s3SecretName" $ }}
      key: {{ . }}
{{- end }}
{{- end -}}

{{/* Writes SeaweedFS's S3 identity file ($S3_CONFIG) for the keys in the env: one identity with every action on
every bucket, no anonymous one. Keys outside [A-Za-z0-9+/=._-] are refused (they would need JSON escaping; AWS-style
keys never have them), and so are empty keys: the store would otherwise start open. The keys are never printed. */}}
{{- define "flashdraft.objectStoreIdentityScript" -}}
set -eu
for key in "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY"; do
  case "$key" in
    ""|*[!A-Za-z0-9+/=._-]*)
      echo "objectStore: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of Secret {{ include "flashdraft.s3SecretName" . }} must be set, with only A-Z a-z 0-9 + / = . _ - (the store's only S3 identity)" >&2
      exit 1;;
  esac
done
printf '{"identities":[{"name":"flashdraft","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","List","Tagging","Write"]}]}\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" > "$S3_CONFIG"
{{- end -}}

{{/* S3 endpoint URL: explicit, else the in-cluster store when enabled, else empty (AWS). */}}
{{- define "flashdraft.s3Endpoint" -}}
{{- if .Values.s3.endpoint -}}
{{- .Values.s3.endpoint -}}
{{- else if .Values.objectStore.enabled -}}
{{- printf "http://%s.%s.svc.cluster.local:8333" (include "flashdraft.objectStoreName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "flashdraft.image" -}}
{{- printf "%s/flashdraft-%s:%s" (trimSuffix "/" .root.Values.images.registry) .name (default .root.Chart.AppVersion .root.Values.images.tag) -}}
{{- end -}}

{{- define "flashdraft.pipelineVersion" -}}
{{- default (default .Chart.AppVersion .Values.images.tag) .Values.pipeline.version -}}
{{- end -}}

{{- define "flashdraft.trainJobNamespace" -}}
{{- default .Release.Namespace .Values.multiNode.trainJobNamespace -}}
{{- end -}}

{{/* Pod-level security context shared by every pod of the chart: non-root, default seccomp. */}}
{{- define "flashdraft.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "flashdraft.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* One pool in run-config form (snake_case keys of flashdraft's PoolConfig). */}}
{{- define "flashdraft.poolConfig" -}}
node_selector: {{ .nodeSelector | toJson }}
tolerations: {{ .tolerations | toJson }}
gpu_type: {{ if .gpuType }}{{ .gpuType | quote }}{{ else }}null{{ end }}
accelerator_type: {{ if .acceleratorType }}{{ .acceleratorType | quote }}{{ else }}null{{ end }}
accelerator_count: {{ .acceleratorCount }}
cpu_request: {{ .cpuRequest | quote }}
memory_request: {{ .memoryRequest | quote }}
{{- with .ephemeralStorageRequest }}
ephemeral_storage_request: {{ . | quote }}
{{- end }}
shm_size: {{ if .shmSize }}{{ .shmSize | quote }}{{ else }}null{{ end }}
{{- end -}}

{{/* Chart name, overridable. */}}
{{- define "gpu-node-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-qualified unless the release already names the chart. */}}
{{- define "gpu-node-agent.fullname" -}}
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

{{- define "gpu-node-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-node-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-node-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gpu-node-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpu-node-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-node-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpu-node-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Refuses dra values the agent would refuse, at render time: dra.devices
lists kinds among gpu, mig, nic, each once (none is the step before
dra.enabled=false, see values.yaml); on real GPUs a
stateDir is needed (the prepared-claims checkpoint); dra.cdiDir must be an
absolute path. */}}
{{- define "gpu-node-agent.draValidate" -}}
{{- $devices := .Values.dra.devices | default list }}
{{- if not (kindIs "slice" $devices) }}
{{- fail (printf "dra.devices must be a list of device kinds (gpu, mig, nic), got %v" .Values.dra.devices) }}
{{- end }}
{{- range $devices }}
{{- if not (has . (list "gpu" "mig" "nic")) }}
{{- fail (printf "dra.devices: unknown device kind %q (want gpu, mig or nic)" (toString .)) }}
{{- end }}
{{- end }}
{{- if ne (len $devices) (len (uniq $devices)) }}
{{- fail (printf "dra.devices names a kind twice: %v" $devices) }}
{{- end }}
{{- if and (eq .Values.simulate "") (not .Values.stateDir) }}
{{- fail "dra.enabled needs stateDir: prepared claims are checkpointed there, so a restart neither loses nor repeats them" }}
{{- end }}
{{- if not (isAbs (toString .Values.dra.cdiDir)) }}
{{- fail (printf "dra.cdiDir must be an absolute path, got %q" (toString .Values.dra.cdiDir)) }}
{{- end }}
{{- end -}}

{{/* The preflight taint's key (value preflight.taintKey), which the kubelet
registers the node with and the DaemonSet tolerates, and the preflight
condition's type (config preflight.conditionType): the admission policy
lets the agent write both. */}}
{{- define "gpu-node-agent.preflightTaintKey" -}}
{{- dig "taintKey" "gpu-node-agent.io/preflight" (default dict .Values.preflight) -}}
{{- end -}}
{{- define "gpu-node-agent.preflightConditionType" -}}
{{- dig "preflight" "conditionType" "GPUPreflight" (default dict .Values.config) -}}
{{- end -}}

{{/* Names and labels shared by every object. */}}
{{- define "warmfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "warmfleet.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "warmfleet.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "warmfleet.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "warmfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "warmfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: give the service account to use when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The headless Service whose DNS name resolves to every daemon's node address. */}}
{{- define "warmfleet.gossipService" -}}
{{- printf "%s-gossip" (include "warmfleet.fullname" .) -}}
{{- end -}}

{{- define "warmfleet.join" -}}
{{- printf "%s.%s.svc:%v" (include "warmfleet.gossipService" .) .Release.Namespace .Values.daemon.ports.gossip -}}
{{- end -}}

{{- define "warmfleet.keySecret" -}}
{{- required "clusterKey.secretName: name the Secret holding the cluster key (warmfleet keygen; kubectl create secret generic ...)" .Values.clusterKey.secretName -}}
{{- end -}}

{{- define "warmfleet.keyPath" -}}
/etc/warmfleet/cluster/{{ required "clusterKey.key: the key's file name in the Secret" .Values.clusterKey.key }}
{{- end -}}

{{/* A volume holding one key of a Secret as a file only its owner reads:
dict "name" VOLUME "secret" SECRET "key" KEY. The router's user reads it
through the pod's fsGroup. */}}
{{- define "warmfleet.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 0400
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end -}}

{{/* GOMEMLIMIT from the container's memory limit, so the Go runtime collects
before the kernel kills it: dict "container" NAME. */}}
{{- define "warmfleet.goMemLimit" -}}
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      containerName: {{ .container }}
      resource: limits.memory
{{- end -}}

{{/* Checks across values, which the schema cannot express (the router needs
the daemons), and the data directory again with a fuller message for an
install that skips the schema (--skip-schema-validation). */}}
{{- define "warmfleet.validate" -}}
{{- if and .Values.daemon.enabled (not .Values.daemon.dataDir) -}}
{{- fail "daemon.dataDir: give the node's cache directory (an absolute host path on the NVMe, e.g. /opt/dlami/nvme/warmfleet)" -}}
{{- end -}}
{{- if and .Values.daemon.enabled (not (hasPrefix "/" .Values.daemon.dataDir)) -}}
{{- fail (printf "daemon.dataDir %q: want an absolute host path" .Values.daemon.dataDir) -}}
{{- end -}}
{{- if and .Values.router.enabled (not .Values.daemon.enabled) -}}
{{- fail "router.enabled needs daemon.enabled: the router learns its endpoints by joining the daemons' gossip" -}}
{{- end -}}
{{- end -}}

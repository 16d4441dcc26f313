{{/*
The authproxy container, shared by the standalone proxy Deployment, the bootstrap Job and the
sidecar helper an application chart includes. Public entry points (see the chart README):

  containers:  {{ include "raftgate.proxySidecar" (dict "values" .Values.raftgate "context" $) }}
  volumes:     {{ include "raftgate.proxySidecarVolumes" (dict "values" .Values.raftgate "context" $) }}
  pod labels:  {{ include "raftgate.proxySidecarPodLabels" (dict "values" .Values.raftgate "context" $) }}

"values" is this chart's values (an application chart that depends on raftgate passes
.Values.raftgate, which Helm fills with this chart's defaults), "context" the including chart's root.
With sidecar.native (the default) the container belongs under initContainers (restartPolicy Always).

A sidecar runs `raftgate proxy --sidecar` with a sidecar-class credential (its own CA's
certificate, or in development the sidecar secret): it forwards clients' tokens and passwords and
the store checks them. It mounts no JWT key and no central proxy certificate (THREAT_MODEL.md).
*/}}

{{/* Mount points: every flag that names a file points under one of these. */}}
{{- define "raftgate.path.proxyTls" -}}/etc/raftgate/tls/proxy{{- end -}}
{{- define "raftgate.path.clientTls" -}}/etc/raftgate/tls/client{{- end -}}
{{- define "raftgate.path.clientCrl" -}}/etc/raftgate/tls/client-crl{{- end -}}
{{- define "raftgate.path.sidecarTls" -}}/etc/raftgate/tls/sidecar{{- end -}}
{{- define "raftgate.path.storeCa" -}}/etc/raftgate/tls/store-ca{{- end -}}
{{- define "raftgate.path.jwt" -}}/etc/raftgate/jwt{{- end -}}
{{- define "raftgate.path.shared" -}}/etc/raftgate/secret{{- end -}}
{{- define "raftgate.path.identity" -}}/etc/raftgate/identity{{- end -}}
{{- define "raftgate.path.saToken" -}}/var/run/secrets/raftgate{{- end -}}
{{- define "raftgate.path.workload" -}}/etc/raftgate/workload{{- end -}}
{{- define "raftgate.path.workloadKeys" -}}/etc/raftgate/workload-keys{{- end -}}

{{/* The audit log's parameters from an `audit` values block (proxy.audit, sidecar.audit), as YAML lines. */}}
{{- define "raftgate.audit.params" -}}
auditEnabled: {{ .enabled }}
auditPath: {{ .path | quote }}
auditLevel: {{ .level }}
auditFailClosed: {{ .failClosed }}
auditSizeLimit: {{ .sizeLimit | quote }}
{{- end -}}

{{/* Sidecar parameters from (dict "values" V "context" C), as YAML. */}}
{{- define "raftgate.sidecar.params" -}}
{{- $v := .values -}}
{{- $ctx := .context -}}
{{- $root := dict "Values" $v "Release" $ctx.Release "Chart" $ctx.Chart -}}
{{- $fullname := default (include "raftgate.fullname" $root) $v.sidecar.store.fullname -}}
{{- $ns := default $ctx.Release.Namespace $v.sidecar.store.namespace -}}
{{- $proxyTls := printf "%s-proxy-tls" $fullname -}}
{{- $sidecarTls := printf "%s-sidecar-tls" $fullname -}}
{{- $storeCa := printf "%s-internal-tls" $fullname -}}
{{- if eq $v.tls.provider "existingSecret" -}}
{{- $proxyTls = $v.tls.existingSecret.proxy -}}
{{- $sidecarTls = $v.tls.existingSecret.sidecar -}}
{{- $storeCa = $v.tls.existingSecret.internal -}}
{{- end -}}
{{- $jwt := default (printf "%s-jwt" $fullname) $v.auth.token.privateKey.existingSecret -}}
name: raftgate-proxy
image: {{ include "raftgate.image" $root }}
pullPolicy: {{ $v.image.pullPolicy }}
native: {{ $v.sidecar.native }}
fullname: {{ $fullname }}
listen: {{ $v.sidecar.listenClientUrls }}
storeEndpoints: {{ include "raftgate.storeEndpointsOf" (dict "fullname" $fullname "namespace" $ns "clusterDomain" $v.clusterDomain "port" $v.ports.internal) }}
tls: {{ $v.tls.enabled }}
sidecarClass: true
proxyTlsSecret: {{ $proxyTls }}
sidecarTlsSecret: {{ default $sidecarTls $v.sidecar.secrets.sidecarTls }}
storeCaSecret: {{ default $storeCa $v.sidecar.secrets.storeCa }}
sharedSecret: {{ default (printf "%s-shared-secret" $fullname) $v.sidecar.secrets.sharedSecret }}
jwt: false
jwtSecret: {{ $jwt }}
authToken: {{ include "raftgate.authToken" $root }}
authTokenTtl: {{ $v.auth.token.simpleTtl }}
bcryptCost: {{ $v.auth.bcryptCost }}
metricsPort: {{ $v.sidecar.metricsPort }}
healthPort: {{ $v.sidecar.healthPort }}
clientPort: 0
portPrefix: rg-
identitySecret: {{ $v.sidecar.identity.existingSecret | quote }}
saToken: {{ $v.sidecar.identity.serviceAccountToken.enabled }}
saTokenAudience: {{ $v.sidecar.identity.serviceAccountToken.audience }}
saTokenExpirationSeconds: {{ $v.sidecar.identity.serviceAccountToken.expirationSeconds }}
{{- $wi := $v.auth.workloadIdentity }}
oidc: {{ $wi.enabled }}
oidcIssuer: {{ $wi.issuer | quote }}
oidcAudience: {{ $wi.audience | quote }}
oidcUserMap: {{ printf "%s-workload-identity" (include "raftgate.fullname" $root) }}
oidcJwksConfigMap: {{ $wi.jwksConfigMap | quote }}
{{- if and $v.sidecar.identity.serviceAccountToken.enabled (not $wi.enabled) }}
{{- fail "sidecar.identity.serviceAccountToken needs auth.workloadIdentity.enabled (the sidecar verifies the token it lends)" }}
{{- end }}
{{- if and $v.sidecar.identity.serviceAccountToken.enabled $v.sidecar.identity.existingSecret }}
{{- fail "sidecar.identity: existingSecret and serviceAccountToken.enabled are mutually exclusive" }}
{{- end }}
{{- if and $v.sidecar.identity.serviceAccountToken.enabled (ne $v.sidecar.identity.serviceAccountToken.audience $wi.audience) }}
{{- fail "sidecar.identity.serviceAccountToken.audience must equal auth.workloadIdentity.audience" }}
{{- end }}
{{ include "raftgate.audit.params" $v.sidecar.audit }}
clientTls: false
clientCertAuth: false
clientTlsSecret: ""
clientCrlSecret: ""
clientCrlKey: ""
resources:
  {{- toYaml $v.sidecar.resources | nindent 2 }}
securityContext:
  {{- toYaml $v.containerSecurityContext | nindent 2 }}
{{- end -}}

{{/* Public: the proxy as a sidecar container (one list item). */}}
{{- define "raftgate.proxySidecar" -}}
{{ include "raftgate.proxyContainer" (include "raftgate.sidecar.params" . | fromYaml) }}
{{- end -}}

{{/* Public: the sidecar's volumes (list items). */}}
{{- define "raftgate.proxySidecarVolumes" -}}
{{ include "raftgate.proxyVolumes" (include "raftgate.sidecar.params" . | fromYaml) }}
{{- end -}}

{{/* Public: labels the application pod needs so the store's NetworkPolicy admits its sidecar. */}}
{{- define "raftgate.proxySidecarPodLabels" -}}
{{- $p := include "raftgate.sidecar.params" . | fromYaml -}}
{{ include "raftgate.proxyLabelKey" . }}: {{ $p.fullname }}
{{- end -}}

{{/* The standalone Deployment's parameters (this release), as YAML. */}}
{{- define "raftgate.proxy.params" -}}
{{- $p := include "raftgate.sidecar.params" (dict "values" .Values "context" .) | fromYaml -}}
{{- $_ := set $p "name" "proxy" -}}
{{- $_ := set $p "native" false -}}
{{- $_ := set $p "sidecarClass" false -}}
{{- $_ := set $p "jwt" (eq .Values.auth.token.type "jwt") -}}
{{- $_ := set $p "sharedSecret" (include "raftgate.secret.shared" .) -}}
{{- $_ := set $p "listen" (printf "%s://0.0.0.0:%d" (include "raftgate.clientScheme" .) (int .Values.ports.client)) -}}
{{- $_ := set $p "clientTls" .Values.auth.client.secureTransport -}}
{{- $_ := set $p "clientCertAuth" (and .Values.auth.client.secureTransport .Values.auth.client.enableAuthentication) -}}
{{- $_ := set $p "clientTlsSecret" (include "raftgate.secret.clientTls" .) -}}
{{- $crl := default dict .Values.auth.client.crl -}}
{{- $_ := set $p "clientCrlSecret" (ternary (default "" $crl.existingSecret) "" (eq (get $p "clientCertAuth") true)) -}}
{{- $_ := set $p "clientCrlKey" (default "ca.crl" $crl.key) -}}
{{- $_ := set $p "clientPort" .Values.ports.client -}}
{{- $_ := set $p "portPrefix" "" -}}
{{- $_ := set $p "metricsPort" .Values.ports.metrics -}}
{{- $_ := set $p "healthPort" .Values.ports.health -}}
{{- $_ := set $p "identitySecret" "" -}}
{{- $_ := set $p "saToken" false -}}
{{- $_ := set $p "resources" .Values.proxy.resources -}}
{{- $_ := set $p "extraArgs" .Values.proxy.extraArgs -}}
{{- $_ := set $p "extraEnv" .Values.proxy.extraEnv -}}
{{- $_ := set $p "gateway" .Values.gateway.enabled -}}
{{- $_ := set $p "gatewayPort" .Values.ports.gateway -}}
{{- $svc := include "raftgate.client.service" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list "localhost" $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) -}}
{{- $_ := set $p "gatewayHosts" (join "," (concat $hosts (default (list) .Values.gateway.extraHosts))) -}}
{{- $_ := set $p "gatewayCors" (join "," (default (list) .Values.gateway.cors)) -}}
{{- if .Values.gateway.enabled -}}
{{- /* the pod's own address: a kubelet httpGet probe of /health, or a scrape by pod address, sends it as
Host (an address is no name a DNS-rebinding page controls) */ -}}
{{- $_ := set $p "gatewayHosts" (printf "%s,$(POD_IP)" (get $p "gatewayHosts")) -}}
{{- $podIP := dict "name" "POD_IP" "valueFrom" (dict "fieldRef" (dict "fieldPath" "status.podIP")) -}}
{{- $_ := set $p "extraEnv" (prepend (default (list) .Values.proxy.extraEnv) $podIP) -}}
{{- end -}}
{{- $p = merge (include "raftgate.audit.params" .Values.proxy.audit | fromYaml) $p -}}
{{- toYaml $p -}}
{{- end -}}

{{/*
The member proxy in each store pod: the pod's advertised client URL, so that etcdctl endpoint
status --cluster reaches every member (Status, Hash, HashKV answered by this pod's node, through
localhost, which the internal certificate names; everything else goes to the leader).
*/}}
{{- define "raftgate.memberProxy.params" -}}
{{- $p := include "raftgate.proxy.params" . | fromYaml -}}
{{- $_ := set $p "name" "member-proxy" -}}
{{- $_ := set $p "portPrefix" "rg-" -}}
{{- $_ := set $p "metricsPort" .Values.sidecar.metricsPort -}}
{{- $_ := set $p "healthPort" .Values.sidecar.healthPort -}}
{{- $_ := set $p "extraArgs" (concat (list (printf "--member-store-endpoint=localhost:%d" (int .Values.ports.internal))) (default (list) .Values.proxy.extraArgs)) -}}
{{- if .Values.gateway.enabled -}}
{{- /* the name this pod advertises for its gateway (the store's --advertise-gateway-urls) */ -}}
{{- $_ := set $p "gatewayHosts" (printf "%s,$(POD_NAME).%s" (get $p "gatewayHosts") (include "raftgate.store.domain" .)) -}}
{{- $podName := dict "name" "POD_NAME" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name")) -}}
{{- $_ := set $p "extraEnv" (prepend (default (list) (get $p "extraEnv")) $podName) -}}
{{- end -}}
{{- toYaml $p -}}
{{- end -}}

{{/* The container, from the parameters above (one list item). */}}
{{- define "raftgate.proxyContainer" -}}
- name: {{ .name }}
  image: {{ .image }}
  imagePullPolicy: {{ .pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  args:
    - proxy
    - --listen-client-urls={{ .listen }}
    - --store-endpoints={{ .storeEndpoints }}
    {{- if .sidecarClass }}
    # tokens and passwords are checked by the store; this container holds no key that mints
    - --sidecar=true
    {{- end }}
    {{- if and .tls .sidecarClass }}
    - --internal-cert={{ include "raftgate.path.sidecarTls" . }}/tls.crt
    - --internal-key={{ include "raftgate.path.sidecarTls" . }}/tls.key
    - --internal-ca={{ include "raftgate.path.storeCa" . }}/ca.crt
    {{- else if .tls }}
    - --internal-cert={{ include "raftgate.path.proxyTls" . }}/tls.crt
    - --internal-key={{ include "raftgate.path.proxyTls" . }}/tls.key
    - --internal-ca={{ include "raftgate.path.proxyTls" . }}/ca.crt
    {{- else }}
    - --internal-secret-file={{ include "raftgate.path.shared" . }}/internal-secret
    {{- end }}
    {{- if not .sidecarClass }}
    - --auth-token={{ .authToken }}
    - --auth-token-ttl={{ .authTokenTtl }}
    {{- end }}
    - --bcrypt-cost={{ .bcryptCost }}
    - --metrics-addr=0.0.0.0:{{ .metricsPort }}
    - --health-addr=0.0.0.0:{{ .healthPort }}
    {{- if .clientTls }}
    - --cert-file={{ include "raftgate.path.clientTls" . }}/tls.crt
    - --key-file={{ include "raftgate.path.clientTls" . }}/tls.key
    {{- if .clientCertAuth }}
    - --trusted-ca-file={{ include "raftgate.path.clientTls" . }}/ca.crt
    - --client-cert-auth=true
    {{- if .clientCrlSecret }}
    - --client-crl-file={{ include "raftgate.path.clientCrl" . }}/{{ .clientCrlKey }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- if .identitySecret }}
    - --identity-file={{ include "raftgate.path.identity" . }}
    {{- end }}
    {{- if .oidc }}
    - --oidc-issuer={{ .oidcIssuer }}
    - --oidc-audience={{ .oidcAudience }}
    - --oidc-user-map={{ include "raftgate.path.workload" . }}/user-map.json
    {{- if .oidcJwksConfigMap }}
    - --oidc-jwks-file={{ include "raftgate.path.workloadKeys" . }}/jwks.json
    {{- else }}
    - --oidc-ca-file={{ include "raftgate.path.workloadKeys" . }}/ca.crt
    {{- end }}
    {{- end }}
    {{- if .saToken }}
    - --identity-oidc-token-file={{ include "raftgate.path.saToken" . }}/token
    {{- end }}
    {{- if .auditEnabled }}
    - --audit-log={{ .auditPath }}
    - --audit-level={{ .auditLevel }}
    {{- if .auditFailClosed }}
    - --audit-fail-closed=true
    {{- end }}
    {{- end }}
    {{- if .gateway }}
    - --listen-gateway-urls=http://0.0.0.0:{{ .gatewayPort }}
    - --host-whitelist={{ .gatewayHosts }}
    {{- if .gatewayCors }}
    - --cors={{ .gatewayCors }}
    {{- end }}
    {{- end }}
    {{- range .extraArgs }}
    - {{ . }}
    {{- end }}
  {{- with .extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- if .clientPort }}
    - name: client
      containerPort: {{ .clientPort }}
      protocol: TCP
    {{- end }}
    {{- if .gateway }}
    - name: {{ .portPrefix }}gateway
      containerPort: {{ .gatewayPort }}
      protocol: TCP
    {{- end }}
    - name: {{ .portPrefix }}metrics
      containerPort: {{ .metricsPort }}
      protocol: TCP
    - name: {{ .portPrefix }}health
      containerPort: {{ .healthPort }}
      protocol: TCP
  {{- if .native }}
  startupProbe:
    grpc:
      port: {{ .healthPort }}
    periodSeconds: 1
    failureThreshold: 120
  {{- end }}
  readinessProbe:
    grpc:
      port: {{ .healthPort }}
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 3
  livenessProbe:
    grpc:
      port: {{ .healthPort }}
    initialDelaySeconds: 10
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 6
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    {{- toYaml .securityContext | nindent 4 }}
  volumeMounts:
    - name: raftgate-tmp
      mountPath: /tmp
    {{- if and .tls .sidecarClass }}
    - name: raftgate-sidecar-tls
      mountPath: {{ include "raftgate.path.sidecarTls" . }}
      readOnly: true
    - name: raftgate-store-ca
      mountPath: {{ include "raftgate.path.storeCa" . }}
      readOnly: true
    {{- else if .tls }}
    - name: raftgate-proxy-tls
      mountPath: {{ include "raftgate.path.proxyTls" . }}
      readOnly: true
    {{- else }}
    - name: raftgate-shared-secret
      mountPath: {{ include "raftgate.path.shared" . }}
      readOnly: true
    {{- end }}
    {{- if .jwt }}
    - name: raftgate-jwt
      mountPath: {{ include "raftgate.path.jwt" . }}
      readOnly: true
    {{- end }}
    {{- if .clientTls }}
    - name: raftgate-client-tls
      mountPath: {{ include "raftgate.path.clientTls" . }}
      readOnly: true
    {{- end }}
    {{- if .clientCrlSecret }}
    - name: raftgate-client-crl
      mountPath: {{ include "raftgate.path.clientCrl" . }}
      readOnly: true
    {{- end }}
    {{- if .identitySecret }}
    - name: raftgate-identity
      mountPath: {{ include "raftgate.path.identity" . }}
      readOnly: true
    {{- end }}
    {{- if .saToken }}
    - name: raftgate-sa-token
      mountPath: {{ include "raftgate.path.saToken" . }}
      readOnly: true
    {{- end }}
    {{- if .oidc }}
    - name: raftgate-workload
      mountPath: {{ include "raftgate.path.workload" . }}
      readOnly: true
    - name: raftgate-workload-keys
      mountPath: {{ include "raftgate.path.workloadKeys" . }}
      readOnly: true
    {{- end }}
    {{- if hasPrefix "unix://" .listen }}
    - name: raftgate-run
      mountPath: {{ dir (trimPrefix "unix://" .listen) }}
    {{- end }}
    {{- if and .auditEnabled (ne .auditPath "-") }}
    - name: raftgate-audit
      mountPath: {{ dir .auditPath }}
    {{- end }}
{{- end -}}

{{/*
The volumes the container above mounts (list items). Mode 0444: an application pod may set no
fsGroup, and these volumes are mounted only into the proxy container.
*/}}
{{- define "raftgate.proxyVolumes" -}}
- name: raftgate-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- if and .tls .sidecarClass }}
- name: raftgate-sidecar-tls
  secret:
    secretName: {{ .sidecarTlsSecret }}
    defaultMode: 0444
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
# only the CA certificate that verifies the store's internal certificate
- name: raftgate-store-ca
  secret:
    secretName: {{ .storeCaSecret }}
    defaultMode: 0444
    items:
      - key: ca.crt
        path: ca.crt
{{- else if .tls }}
- name: raftgate-proxy-tls
  secret:
    secretName: {{ .proxyTlsSecret }}
    defaultMode: 0444
{{- else }}
- name: raftgate-shared-secret
  secret:
    secretName: {{ .sharedSecret }}
    defaultMode: 0444
    items:
      # a sidecar gets the sidecars' secret, never the central proxies'
      - key: {{ if .sidecarClass }}sidecar-secret{{ else }}internal-secret{{ end }}
        path: internal-secret
{{- end }}
{{- if .jwt }}
- name: raftgate-jwt
  secret:
    secretName: {{ .jwtSecret }}
    defaultMode: 0444
{{- end }}
{{- if .clientTls }}
- name: raftgate-client-tls
  secret:
    secretName: {{ .clientTlsSecret }}
    defaultMode: 0444
{{- end }}
{{- if .clientCrlSecret }}
# the CRL Secret as a directory: its key is re-read when the kubelet swaps the files
- name: raftgate-client-crl
  secret:
    secretName: {{ .clientCrlSecret }}
    defaultMode: 0444
{{- end }}
{{- if .identitySecret }}
- name: raftgate-identity
  secret:
    secretName: {{ .identitySecret }}
    defaultMode: 0444
{{- end }}
{{- if .saToken }}
- name: raftgate-sa-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          audience: {{ .saTokenAudience }}
          expirationSeconds: {{ .saTokenExpirationSeconds }}
          path: token
{{- end }}
{{- if .oidc }}
- name: raftgate-workload
  configMap:
    name: {{ .oidcUserMap }}
    defaultMode: 0444
- name: raftgate-workload-keys
  configMap:
    {{- if .oidcJwksConfigMap }}
    name: {{ .oidcJwksConfigMap }}
    items:
      - key: jwks.json
        path: jwks.json
    {{- else }}
    ## the cluster CA every namespace holds (kube-root-ca.crt), for https to the issuer
    name: kube-root-ca.crt
    items:
      - key: ca.crt
        path: ca.crt
    {{- end }}
    defaultMode: 0444
{{- end }}
{{- if hasPrefix "unix://" .listen }}
- name: raftgate-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if and .auditEnabled (ne .auditPath "-") }}
- name: raftgate-audit
  emptyDir:
    sizeLimit: {{ .auditSizeLimit }}
{{- end }}
{{- end -}}

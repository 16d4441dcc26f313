{{/*
Names. The chart's name is always "raftgate" (not .Chart.Name), so an application chart that
includes the sidecar helper computes the same names as the raftgate release it talks to.
*/}}
{{- define "raftgate.name" -}}
{{- default "raftgate" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name from (dict "values" V "release" RELEASE-NAME); at most 40 characters. */}}
{{- define "raftgate.fullnameOf" -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "raftgate" .values.nameOverride -}}
{{- if contains $name .release -}}
{{- .release | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .release $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "raftgate.fullname" -}}
{{- include "raftgate.fullnameOf" (dict "values" .Values "release" .Release.Name) -}}
{{- end -}}

{{- define "raftgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "raftgate.store.fullname" -}}{{ include "raftgate.fullname" . }}-store{{- end -}}
{{- define "raftgate.store.headless" -}}{{ include "raftgate.fullname" . }}-store-headless{{- end -}}
{{- define "raftgate.proxy.fullname" -}}{{ include "raftgate.fullname" . }}-proxy{{- end -}}
{{/* The client Service (etcd API, port 2379) has the release's full name, as in the etcd chart. */}}
{{- define "raftgate.client.service" -}}{{ include "raftgate.fullname" . }}{{- end -}}

{{/*
Labels: (dict "context" $ "component" "store|proxy|bootstrap|tls")
*/}}
{{- define "raftgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raftgate.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "raftgate.labels" -}}
helm.sh/chart: {{ include "raftgate.chart" .context }}
{{ include "raftgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
app.kubernetes.io/part-of: raftgate
{{- with .context.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The label that marks a pod running a raftgate proxy: the NetworkPolicy lets only these reach the store. */}}
{{- define "raftgate.proxyLabelKey" -}}raftgate.io/proxy-for{{- end -}}

{{- define "raftgate.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}{{- $repo = printf "%s/%s" .Values.image.registry $repo -}}{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "raftgate.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "raftgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "raftgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Raft needs an odd number of voters: 2 nodes tolerate no more failures than 1, 4 no more than 3. */}}
{{- define "raftgate.replicaCount" -}}
{{- $n := int .Values.replicaCount -}}
{{- if not (has $n (list 1 3 5 7)) -}}
{{- fail (printf "replicaCount must be odd (1, 3, 5 or 7), got %d: a Raft cluster of an even size tolerates no more failures than one node fewer" $n) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* Checks of value combinations the schema cannot express; renders nothing. */}}
{{- define "raftgate.validate" -}}
{{- $_ := include "raftgate.replicaCount" . -}}
{{- if and .Values.tls.enabled (eq .Values.tls.provider "existingSecret") -}}
{{- range $k := list "internal" "proxy" "sidecar" "peer" -}}
{{- if not (index $.Values.tls.existingSecret $k) -}}
{{- fail (printf "tls.provider=existingSecret needs tls.existingSecret.%s (a Secret with tls.crt, tls.key and ca.crt)" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $client := .Values.auth.client -}}
{{- if and .Values.gateway.enabled $client.secureTransport -}}
{{- fail "gateway.enabled serves plain HTTP, and auth.client.secureTransport asks for TLS on the client port: passwords and tokens would cross the network in the clear on the gateway; turn one off" -}}
{{- end -}}
{{- if and $client.enableAuthentication (not $client.secureTransport) -}}
{{- fail "auth.client.enableAuthentication needs auth.client.secureTransport (client certificates travel over TLS)" -}}
{{- end -}}
{{- if and $client.crl $client.crl.existingSecret (not $client.enableAuthentication) -}}
{{- fail "auth.client.crl needs auth.client.enableAuthentication (a CRL revokes client certificates)" -}}
{{- end -}}
{{- if and $client.secureTransport (not $client.existingSecret) (not (and .Values.tls.enabled (eq .Values.tls.provider "certManager"))) -}}
{{- fail "auth.client.secureTransport needs auth.client.existingSecret (tls.crt, tls.key, ca.crt), or tls.provider=certManager to issue it" -}}
{{- end -}}
{{- if and (eq .Values.auth.token.type "jwt") (not .Values.auth.token.privateKey.existingSecret) -}}
{{- if not (regexMatch "^(RS|PS)(256|384|512)$" .Values.auth.token.signMethod) -}}
{{- fail (printf "auth.token.signMethod=%s needs auth.token.privateKey.existingSecret: the generated key is RSA (RS256/384/512, PS256/384/512)" .Values.auth.token.signMethod) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
tls.provider=certManager: the issuer of each trust domain's certificates, as YAML {CA name: issuerRef}.
The domains: internal (the store's internal certificate and the central proxies' client certificate:
the store treats that CA as central, i.e. root-equivalent), peer (the Raft log), sidecar (an
ordinary client's powers) and client (the client port; a client certificate's CN is a user, root
included). Without tls.certManager.issuerRef the chart makes one CA per domain; with it every domain
needs an issuer of its own, since whoever may request a Certificate from an issuer gets the powers
of every domain it signs for. Distinct issuer references are checked here; that two issuers are
not backed by the same CA key is the operator's part (chart README).
*/}}
{{- define "raftgate.certManager.issuers" -}}
{{- $cm := .Values.tls.certManager -}}
{{- $fullname := include "raftgate.fullname" . -}}
{{- $clientCert := and .Values.auth.client.secureTransport (not .Values.auth.client.existingSecret) -}}
{{- $keys := dict "internal" "issuerRef" "peer" "peerIssuerRef" "sidecar" "sidecarIssuerRef" "client" "clientIssuerRef" -}}
{{- $domains := list "internal" "peer" "sidecar" -}}
{{- if $clientCert }}{{ $domains = append $domains "client" }}{{ end -}}
{{- $out := dict -}}
{{- if not (dig "issuerRef" "name" "" $cm) -}}
{{- range $k := list "peerIssuerRef" "sidecarIssuerRef" "clientIssuerRef" -}}
{{- if dig $k "name" "" $cm -}}
{{- fail (printf "tls.certManager.%s.name needs tls.certManager.issuerRef: without issuerRef the chart makes a CA of its own for every trust domain and would ignore %s; give every domain its issuer, or none" $k $k) -}}
{{- end -}}
{{- end -}}
{{- range $d := $domains -}}
{{- $_ := set $out $d (dict "name" (printf "%s-%s-ca" $fullname $d) "kind" "Issuer" "group" "cert-manager.io") -}}
{{- end -}}
{{- else -}}
{{- $missing := list -}}
{{- range $d := $domains -}}
{{- if not (dig (index $keys $d) "name" "" $cm) -}}
{{- $missing = append $missing (printf "tls.certManager.%s.name" (index $keys $d)) -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "with tls.certManager.issuerRef every trust domain needs an issuer of its own CA: set %s. issuerRef signs the internal port (central proxies: raftgate root); one issuer for the peers, the sidecars or the client port too would give whoever may request a Certificate from it root's powers (CN root on the client port, or a central certificate)" (join ", " $missing)) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $d := $domains -}}
{{- $key := index $keys $d -}}
{{- $ref := index $cm $key -}}
{{- $norm := dict "name" $ref.name "kind" (default "Issuer" $ref.kind) "group" (default "cert-manager.io" $ref.group) -}}
{{- $id := printf "%s %s.%s" $norm.name $norm.kind $norm.group -}}
{{- if hasKey $seen $id -}}
{{- fail (printf "tls.certManager.%s and tls.certManager.%s name the same issuer (%s %s): each trust domain needs an issuer of its own CA, else a certificate of one domain carries the other's powers (the internal port's: raftgate root)" (get $seen $id) $key $norm.kind $norm.name) -}}
{{- end -}}
{{- $_ := set $seen $id $key -}}
{{- $_ := set $out $d $norm -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* NOTES: the Secret holding a sidecar's certificate, and the one whose ca.crt verifies the store. */}}
{{- define "raftgate.sidecar.secretNames" -}}
{{- $fullname := include "raftgate.fullname" . -}}
{{- if eq .Values.tls.provider "existingSecret" -}}
{{ .Values.tls.existingSecret.sidecar }} and ca.crt of {{ .Values.tls.existingSecret.internal }}
{{- else -}}
{{ $fullname }}-sidecar-tls and ca.crt of {{ $fullname }}-internal-tls
{{- end -}}
{{- end -}}

{{/* ---- Store addressing ---- */}}

{{- define "raftgate.scheme" -}}{{ ternary "https" "http" .Values.tls.enabled }}{{- end -}}
{{/* The client port's scheme (auth.client.secureTransport). */}}
{{- define "raftgate.clientScheme" -}}{{ ternary "https" "http" .Values.auth.client.secureTransport }}{{- end -}}
{{- define "raftgate.secret.clientTls" -}}
{{- default (printf "%s-client-tls" (include "raftgate.fullname" .)) .Values.auth.client.existingSecret -}}
{{- end -}}

{{/* The DNS suffix of the store pods: <headless>.<namespace>.svc.<clusterDomain> */}}
{{- define "raftgate.store.domain" -}}
{{- printf "%s.%s.svc.%s" (include "raftgate.store.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* --initial-cluster: <pod>=<scheme>://<pod>.<headless>.<ns>.svc.<domain>:<peer>, one per replica. */}}
{{- define "raftgate.initialCluster" -}}
{{- $store := include "raftgate.store.fullname" . -}}
{{- $domain := include "raftgate.store.domain" . -}}
{{- $scheme := include "raftgate.scheme" . -}}
{{- $members := list -}}
{{- range $i := until (int (include "raftgate.replicaCount" .)) -}}
{{- $members = append $members (printf "%s-%d=%s://%s-%d.%s:%d" $store $i $scheme $store $i $domain (int $.Values.ports.peer)) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}

{{/*
--store-endpoints: the proxies' seed, the headless Service's name (it resolves to every store pod,
ready or not) at the internal port, from (dict "fullname" F "namespace" NS "clusterDomain" D "port" P).
A proxy learns the members (each pod's own name, --advertise-internal-urls) from the cluster and
follows them, so the seed does not depend on replicaCount: scaling the store never restarts a proxy.
*/}}
{{- define "raftgate.storeEndpointsOf" -}}
{{- printf "%s-store-headless.%s.svc.%s:%d" .fullname .namespace .clusterDomain (int .port) -}}
{{- end -}}

{{- define "raftgate.storeEndpoints" -}}
{{- include "raftgate.storeEndpointsOf" (dict "fullname" (include "raftgate.fullname" .) "namespace" .Release.Namespace "clusterDomain" .Values.clusterDomain "port" .Values.ports.internal) -}}
{{- end -}}

{{/* ---- Secrets: names ---- */}}

{{- define "raftgate.secret.root" -}}
{{- default (printf "%s-auth" (include "raftgate.fullname" .)) .Values.auth.rbac.existingSecret -}}
{{- end -}}

{{- define "raftgate.secret.jwt" -}}
{{- default (printf "%s-jwt" (include "raftgate.fullname" .)) .Values.auth.token.privateKey.existingSecret -}}
{{- end -}}

{{- define "raftgate.secret.shared" -}}{{ include "raftgate.fullname" . }}-shared-secret{{- end -}}
{{- define "raftgate.secret.tlsCA" -}}{{ include "raftgate.fullname" . }}-tls-ca{{- end -}}

{{/* TLS Secret of one role: (dict "context" $ "role" "internal|proxy|peer") */}}
{{- define "raftgate.secret.tls" -}}
{{- $v := .context.Values -}}
{{- if eq $v.tls.provider "existingSecret" -}}
{{- index $v.tls.existingSecret .role -}}
{{- else -}}
{{- printf "%s-%s-tls" (include "raftgate.fullname" .context) .role -}}
{{- end -}}
{{- end -}}

{{/* etcd's --auth-token value for the proxies; the key files are mounted at /etc/raftgate/jwt. */}}
{{- define "raftgate.authToken" -}}
{{- $t := .Values.auth.token -}}
{{- if eq $t.type "jwt" -}}
{{- $opts := list "jwt" -}}
{{- if $t.publicKey.filename -}}
{{- $opts = append $opts (printf "pub-key=/etc/raftgate/jwt/%s" $t.publicKey.filename) -}}
{{- end -}}
{{- $opts = append $opts (printf "priv-key=/etc/raftgate/jwt/%s" $t.privateKey.filename) -}}
{{- $opts = append $opts (printf "sign-method=%s" $t.signMethod) -}}
{{- $opts = append $opts (printf "ttl=%s" $t.ttl) -}}
{{- join "," $opts -}}
{{- else -}}
simple
{{- end -}}
{{- end -}}

{{/*
Pod anti-affinity from a preset: (dict "context" $ "component" C "preset" "soft|hard|")
*/}}
{{- define "raftgate.podAntiAffinity" -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "raftgate.selectorLabels" . | fromYaml)) -}}
{{- if eq .preset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - {{- toYaml $term | nindent 6 }}
{{- else if eq .preset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        {{- toYaml $term | nindent 8 }}
{{- end }}
{{- end -}}

{{/* A gRPC health probe on the plaintext health port (kubelet probes cannot do mTLS). */}}
{{- define "raftgate.grpcProbe" -}}
grpc:
  port: {{ int .port }}
initialDelaySeconds: {{ .probe.initialDelaySeconds }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{- define "raftgate.secret.rootKey" -}}
{{- if .Values.auth.rbac.existingSecret -}}{{ .Values.auth.rbac.existingSecretPasswordKey }}{{- else -}}root-password{{- end -}}
{{- end -}}

{{/*
A value kept across upgrades: (dict "context" $ "secret" NAME "key" KEY "new" GENERATED-B64)
→ the base64 value already in the cluster's Secret, or the new one. (Offline rendering, such as
`helm template`, sees no cluster and always generates.)
*/}}
{{- define "raftgate.keep" -}}
{{- $existing := lookup "v1" "Secret" .context.Release.Namespace .secret -}}
{{- $old := dig "data" .key "" $existing -}}
{{- if $old -}}{{ $old }}{{- else -}}{{ .new }}{{- end -}}
{{- end -}}

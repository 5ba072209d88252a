#!/usr/bin/env bash
# The webhook's serving certificate for the plain manifests (deploy/manifests/webhook/): a CA and a certificate for
# the Service gpusched-webhook.gpusched-system.svc, made with openssl, stored as the Secret gpusched-webhook-tls,
# and the CA put into the MutatingWebhookConfiguration gpusched-webhook. Run it after
#   kubectl apply -f deploy/manifests/webhook/
# and again to rotate (the webhook reads a changed certificate without a restart). The Helm chart does all this by
# itself (or with cert-manager: certManager.enabled=true).
#
# Environment: KUBECTL (default: kubectl; e.g. "kubectl --context prod"), NAMESPACE (gpusched-system),
# SERVICE (gpusched-webhook), WEBHOOK_CONFIG (gpusched-webhook), DAYS (3650).
set -euo pipefail
KUBECTL=${KUBECTL:-kubectl}
NAMESPACE=${NAMESPACE:-gpusched-system}
SERVICE=${SERVICE:-gpusched-webhook}
WEBHOOK_CONFIG=${WEBHOOK_CONFIG:-gpusched-webhook}
DAYS=${DAYS:-3650}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
host="$SERVICE.$NAMESPACE.svc"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$DAYS" \
  -subj "/CN=gpusched-webhook-ca" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$host" \
  -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.cluster.local\n' \
  "$host" "$SERVICE" "$NAMESPACE" "$host" >"$dir/ext.cnf"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days "$DAYS" \
  -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null

$KUBECTL -n "$NAMESPACE" create secret tls "$SERVICE-tls" --cert "$dir/tls.crt" --key "$dir/tls.key" \
  --dry-run=client -o yaml | $KUBECTL apply -f -
ca=$(base64 <"$dir/ca.crt" | tr -d '\n')
# every webhook of the configuration (the share slot, the assignment guard, the routing): one process, one CA
n=$($KUBECTL get mutatingwebhookconfiguration "$WEBHOOK_CONFIG" -o jsonpath='{range .webhooks[*]}x{end}')
ops=""
for ((i = 0; i < ${#n}; i++)); do
  ops="$ops${ops:+,}{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$ca\"}"
done
$KUBECTL patch mutatingwebhookconfiguration "$WEBHOOK_CONFIG" --type=json -p "[$ops]"
echo "Secret $NAMESPACE/$SERVICE-tls and the caBundle of $WEBHOOK_CONFIG are set."

#!/bin/sh
# Run once by docker-compose.yml (in the k3s image, which has kubectl) when k3s is up: registers the
# webhook with the generated CA and creates the namespace the services' system users live in.
set -eu
export KUBECONFIG=/output/kubeconfig.yaml
until kubectl get --raw /readyz >/dev/null 2>&1; do sleep 1; done
ca=$(base64 -w0 < /etc/hami/certs/secrets/tls/ca.crt)
sed "s|CA_BUNDLE|$ca|" /etc/hami/compose/webhook.yaml | kubectl apply -f -
kubectl create namespace hami-system --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace hami-system hami.io/webhook=ignore --overwrite
echo "hami: webhook registered; try: kubectl --kubeconfig <volume kubeconfig> apply -f deploy/compose/sample-pod.yaml"

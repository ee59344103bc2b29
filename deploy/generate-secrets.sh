#!/bin/sh
# Writes the files an overlay's secretGenerator reads; nothing secret is ever committed (each overlay's
# .gitignore ignores its secrets/ directory).
#
#   deploy/generate-secrets.sh [--tls] [--force] [--namespace NS] [--webhook-san SAN] OVERLAY_DIR
#
# Always: OVERLAY_DIR/secrets/nats/<service>, one random password per NATS user (extender, webhook,
#   allocator, nodeagent, metrics).
# --tls (clusters without cert-manager): a self-signed CA and serving certificates signed by it, in
#   OVERLAY_DIR/secrets/tls/: ca.crt (ca.key stays here, never in the cluster), webhook.crt/.key for
#   hami-webhook.<NS>.svc, extender.crt/.key for 127.0.0.1 and localhost (kube-scheduler calls the
#   extender over the pod's loopback). --webhook-san adds a subjectAltName to the webhook's certificate,
#   e.g. IP:127.0.0.1 when the apiserver calls it by URL (docker-compose.yml does).
# Existing files are kept, so running it again changes nothing; --force makes new ones.
set -eu

tls=0
force=0
namespace=hami-system
days=825
webhook_sans=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) tls=1 ;;
    --force) force=1 ;;
    --namespace) shift; namespace="$1" ;;
    --days) shift; days="$1" ;;
    --webhook-san) shift; webhook_sans="$webhook_sans, $1" ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 1 ] || { echo "usage: $0 [--tls] [--force] [--namespace NS] [--webhook-san SAN] OVERLAY_DIR" >&2; exit 2; }
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }

out="$1/secrets"
umask 077
mkdir -p "$out/nats"

fresh() { [ "$force" = 1 ] || [ ! -s "$1" ]; }

for user in extender webhook allocator nodeagent metrics; do
  if fresh "$out/nats/$user"; then
    printf '%s' "$(openssl rand -hex 24)" > "$out/nats/$user"
  fi
done

[ "$tls" = 1 ] || exit 0

tls_dir="$out/tls"
mkdir -p "$tls_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if fresh "$tls_dir/ca.crt" || fresh "$tls_dir/ca.key"; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$tls_dir/ca.key"
  cat > "$work/ca.ext" <<EXT
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EXT
  openssl req -new -key "$tls_dir/ca.key" -subj "/CN=hami self-signed CA" -out "$work/ca.csr"
  openssl x509 -req -in "$work/ca.csr" -signkey "$tls_dir/ca.key" -days "$days" \
    -extfile "$work/ca.ext" -out "$tls_dir/ca.crt" 2>/dev/null
  force=1  # a new CA invalidates every certificate it signed before
fi

# serve NAME CN SANS: a serving certificate signed by the CA.
serve() {
  if fresh "$tls_dir/$1.crt" || fresh "$tls_dir/$1.key"; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$tls_dir/$1.key"
    cat > "$work/$1.ext" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = $3
EXT
    openssl req -new -key "$tls_dir/$1.key" -subj "/CN=$2" -out "$work/$1.csr"
    openssl x509 -req -in "$work/$1.csr" -CA "$tls_dir/ca.crt" -CAkey "$tls_dir/ca.key" -CAcreateserial \
      -CAserial "$work/ca.srl" -days "$days" -extfile "$work/$1.ext" -out "$tls_dir/$1.crt" 2>/dev/null
  fi
}

svc="hami-webhook.$namespace.svc"
serve webhook "$svc" "DNS:hami-webhook, DNS:hami-webhook.$namespace, DNS:$svc, DNS:$svc.cluster.local$webhook_sans"
serve extender localhost "DNS:localhost, IP:127.0.0.1"

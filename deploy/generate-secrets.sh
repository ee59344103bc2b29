#!/bin/sh
# Writes the files an overlay's secretGenerator reads; nothing secret is ever committed (each overlay's
# .gitignore ignores its secrets/ directory).
#
#   deploy/generate-secrets.sh [--tls] [--force] [--namespace NS] [--webhook-san SAN] [--san SAN] OVERLAY_DIR
#
# Always: OVERLAY_DIR/secrets/nats/<service>, one random password per static NATS user (extender, webhook,
#   metrics, natsauth), and OVERLAY_DIR/secrets/nats-issuer/{seed,issuer}: the account nkey with which the
#   NATS auth callout signs the node services' per-node identities (seed: secret; issuer: its public key,
#   nats.conf's auth_callout.issuer), OVERLAY_DIR/secrets/metrics/token: the bearer token of /metrics, and
#   OVERLAY_DIR/secrets/grant-key: the key the extender signs grants with and the allocators verify them by.
# --tls (clusters without cert-manager): a self-signed CA and serving certificates signed by it, in
#   OVERLAY_DIR/secrets/tls/: ca.crt (ca.key stays here, never in the cluster), webhook.crt/.key for
#   hami-webhook.<NS>.svc, extender.crt/.key for 127.0.0.1 and localhost (kube-scheduler calls the
#   extender over the pod's loopback), scheduler-client.crt/.key: kube-scheduler's client certificate, which
#   the extender requires (mutual TLS), nats.crt/.key for the hami-nats service and the pod's loopback (the
#   callout beside it). --webhook-san adds a subjectAltName to the webhook's certificate,
#   e.g. IP:127.0.0.1 when the apiserver calls it by URL (docker-compose.yml does). --san adds one to every
#   serving certificate (webhook, extender, NATS): the local launcher gives each pod a loopback address of
#   its own and dials the pods there (hami_sim.deployed).
# Existing files are kept, so running it again changes nothing; --force makes new ones.
# It says which files it wrote and where, and refuses an overlay whose kustomization generates no Secrets
# (otel: it takes those of dev, the overlay it builds on) rather than leave keys where nothing reads them.
set -eu

tls=0
force=0
namespace=hami-system
days=825
webhook_sans=""
sans=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) tls=1 ;;
    --force) force=1 ;;
    --namespace) shift; namespace="$1" ;;
    --days) shift; days="$1" ;;
    --webhook-san) shift; webhook_sans="$webhook_sans, $1" ;;
    --san) shift; sans="$sans, $1" ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -eq 1 ] || { echo "usage: $0 [--tls] [--force] [--namespace NS] [--webhook-san SAN] [--san SAN] OVERLAY_DIR" >&2; exit 2; }
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }

# An overlay is a directory with a kustomization; one without a secretGenerator reads no file written here
# (a key written there would be unused and, with no .gitignore, one `git add` from being committed). A
# directory without a kustomization is a plain target (docker-compose.yml writes its certificates so).
kustomization=""
for name in kustomization.yaml kustomization.yml Kustomization; do
  [ -f "$1/$name" ] && { kustomization="$1/$name"; break; }
done
takes_secrets() { grep -q '^secretGenerator:' "$1"; }
if [ -n "$kustomization" ] && ! takes_secrets "$kustomization"; then
  echo "$0: $1 takes no secrets: $kustomization has no secretGenerator, so nothing would read the files." >&2
  for parent in $(sed -n 's|^ *- *\(\.\./[^ #]*\).*|\1|p' "$kustomization"); do
    for name in kustomization.yaml kustomization.yml Kustomization; do
      if [ -f "$1/$parent/$name" ] && takes_secrets "$1/$parent/$name"; then
        dir=$(cd "$1/$parent" && pwd)
        echo "It builds on $parent, whose Secrets it uses: run $0 ${dir#"$PWD"/} instead." >&2
        break
      fi
    done
  done
  exit 1
fi

out="$1/secrets"
umask 077
mkdir -p "$out/nats"

fresh() { [ "$force" = 1 ] || [ ! -s "$1" ]; }

# summary: what was written and kept, said once at the end (an operator otherwise cannot tell whether a
# second run rotated anything). wrote records each file as it is made.
written=""
wrote() { for path in "$@"; do written="$written ${path#"$out"/}"; done; }
summary() {
  kept=""
  for path in $(cd "$out" && find . -type f | sed 's|^\./||' | sort); do
    case " $written " in *" $path "*) ;; *) kept="$kept $path" ;; esac
  done
  if [ -n "$written" ]; then
    echo "wrote to $out/:"
    for path in $written; do echo "  $path"; done
  fi
  if [ -n "$kept" ]; then
    echo "kept (already there; --force makes new ones):"
    for path in $kept; do echo "  $path"; done
  fi
  if command -v git >/dev/null && git -C "$1" rev-parse --git-dir >/dev/null 2>&1 \
    && ! git -C "$1" check-ignore -q "secrets/grant-key"; then
    echo "warning: git does not ignore $out: add /secrets/ to $1/.gitignore" >&2
  fi
  if [ -n "$kustomization" ] && grep -q 'secrets/tls/' "$kustomization" && [ ! -s "$out/tls/ca.crt" ]; then
    echo "$1 also reads TLS files from $out/tls/: run again with --tls" >&2
    exit 1
  fi
  [ -z "$kustomization" ] || echo "next: kubectl apply -k $1"
}

for user in extender webhook metrics natsauth; do
  if fresh "$out/nats/$user"; then
    printf '%s' "$(openssl rand -hex 24)" > "$out/nats/$user"
    wrote "$out/nats/$user"
  fi
done

# nkey_b32 "BYTES": NATS's nkey text for decimal BYTES (type prefix and key): base32, no padding, of the
# bytes and their CRC-16/XMODEM (little-endian). POSIX shell arithmetic only, so no nats tooling is needed.
nkey_b32() {
  crc=0
  for b in $1; do
    crc=$(( crc ^ (b << 8) ))
    i=0
    while [ $i -lt 8 ]; do
      if [ $(( crc & 32768 )) -ne 0 ]; then crc=$(( ((crc << 1) ^ 4129) & 65535 )); else crc=$(( (crc << 1) & 65535 )); fi
      i=$((i + 1))
    done
  done
  text="" acc=0 bits=0
  for b in $1 $(( crc & 255 )) $(( crc >> 8 )); do
    acc=$(( ((acc << 8) | b) & 65535 )) bits=$((bits + 8))
    while [ $bits -ge 5 ]; do
      bits=$((bits - 5))
      text="$text$(printf ABCDEFGHIJKLMNOPQRSTUVWXYZ234567 | cut -c$(( ((acc >> bits) & 31) + 1 )))"
    done
  done
  [ $bits -eq 0 ] || text="$text$(printf ABCDEFGHIJKLMNOPQRSTUVWXYZ234567 | cut -c$(( ((acc << (5 - bits)) & 31) + 1 )))"
  printf '%s' "$text"
}

# The bearer token /metrics requires (hami-metrics reads it from a file); Prometheus scrapes with the same
# Secret (docs/deploy.md).
mkdir -p "$out/metrics"
if fresh "$out/metrics/token"; then
  printf '%s' "$(openssl rand -hex 32)" > "$out/metrics/token"
  wrote "$out/metrics/token"
fi

# The key the extender signs its grants with and the allocators verify them by (hami.io/vgpu-grant): the
# device plugin serves an annotation-only allocation only when the signature holds.
if fresh "$out/grant-key"; then
  printf '%s' "$(openssl rand -hex 32)" > "$out/grant-key"
  wrote "$out/grant-key"
fi

issuer_dir="$out/nats-issuer"
mkdir -p "$issuer_dir"
if fresh "$issuer_dir/seed" || fresh "$issuer_dir/issuer"; then
  keydir=$(mktemp -d)
  openssl genpkey -algorithm ed25519 -outform DER -out "$keydir/key.der"
  seed=$(tail -c 32 "$keydir/key.der" | od -An -v -tu1)
  public=$(openssl pkey -inform DER -in "$keydir/key.der" -pubout -outform DER | tail -c 32 | od -An -v -tu1)
  rm -rf "$keydir"
  # prefixes: a seed of an account key is 144 (seed) | 0 >> 5, then 0 << 3; an account's public key is 0
  nkey_b32 "144 0 $seed" > "$issuer_dir/seed"
  nkey_b32 "0 $public" > "$issuer_dir/issuer"
  wrote "$issuer_dir/seed" "$issuer_dir/issuer"
fi

[ "$tls" = 1 ] || { summary "$1"; exit 0; }

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
  wrote "$tls_dir/ca.crt" "$tls_dir/ca.key"
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
    wrote "$tls_dir/$1.crt" "$tls_dir/$1.key"
  fi
}

svc="hami-webhook.$namespace.svc"
serve webhook "$svc" "DNS:hami-webhook, DNS:hami-webhook.$namespace, DNS:$svc, DNS:$svc.cluster.local$webhook_sans$sans"
serve extender localhost "DNS:localhost, IP:127.0.0.1$sans"

# client NAME CN: a client certificate signed by the CA (extendedKeyUsage clientAuth, no subjectAltName).
client() {
  if fresh "$tls_dir/$1.crt" || fresh "$tls_dir/$1.key"; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$tls_dir/$1.key"
    cat > "$work/$1.ext" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EXT
    openssl req -new -key "$tls_dir/$1.key" -subj "/CN=$2" -out "$work/$1.csr"
    openssl x509 -req -in "$work/$1.csr" -CA "$tls_dir/ca.crt" -CAkey "$tls_dir/ca.key" -CAcreateserial \
      -CAserial "$work/ca.srl" -days "$days" -extfile "$work/$1.ext" -out "$tls_dir/$1.crt" 2>/dev/null
    wrote "$tls_dir/$1.crt" "$tls_dir/$1.key"
  fi
}

# kube-scheduler presents it to the extender, which serves only callers with a certificate of this CA
client scheduler-client hami-scheduler
nats="hami-nats.$namespace.svc"
serve nats "$nats" "DNS:hami-nats, DNS:hami-nats.$namespace, DNS:$nats, DNS:$nats.cluster.local, DNS:localhost, IP:127.0.0.1$sans"
summary "$1"

#!/usr/bin/env bash
# Builds the real Kubernetes peers the tests and `hami up --kube real` run against, from the Go modules
# pinned in this folder's go.mod/go.sum: kube-apiserver, kube-scheduler, kube-controller-manager, kubelet
# and kubectl (k8s.io/kubernetes; the controller manager runs only where a test needs its controllers, e.g.
# DRA's resourceclaim controller), etcd (go.etcd.io/etcd/server/v3), and fakecri (ours: the in-memory CRI runtime of
# k8s.io/cri-client/pkg/fake on a socket, so a real kubelet runs pods without containers). Output: $HAMI_K8S_BIN (default .cache/k8s/bin at the repository root).
# Go's own module and build caches are reused, so a second build only links.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${HAMI_K8S_BIN:-$root/.cache/k8s/bin}"

if ! command -v go >/dev/null 2>&1; then
    echo "k8s: Go is not installed (need Go >= 1.26 on PATH); the real Kubernetes peers cannot be built," >&2
    echo "k8s: so the tests of tests/realk8s will skip (and fail under CI=true)." >&2
    exit 3
fi

cd "$here"
kube="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"    # e.g. v1.37.2
minor="$(echo "$kube" | cut -d. -f2)"
stamp() {  # what /version and kubectl version report, as upstream's hack/lib/version.sh injects
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
            "$pkg" "$kube" "$pkg" "$pkg" "$minor" "$pkg"
    done
}
ldflags="-s -w $(stamp)"
mkdir -p "$out"
echo "k8s: building kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl $kube, fakecri and etcd $(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) into $out"
echo "k8s: $(go version); a cold build takes about 13 minutes on 2 cores, a warm one under a minute"
start=$(date +%s)
# -v prints each package as it compiles: the progress of a long cold build.
CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet ./fakecri \
    2>&1 | awk '/ |^#/ { print; fflush(); next }  # an error or a warning: show it whole
                { n++; if (n % 200 == 0) { printf "k8s: %d packages compiled (%s)\n", n, $0; fflush() } }'
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
echo "$kube" > "$out/VERSION"
echo "k8s: done in $(( $(date +%s) - start )) s: $(ls "$out" | grep -v VERSION | tr '\n' ' ')"

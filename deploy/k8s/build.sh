#!/usr/bin/env bash
# Build the Kubernetes test cluster's binaries from Go modules into a cache directory
# (design note 016), once: a binary already there (built from the same pinned version)
# is reused.
#
#   deploy/k8s/build.sh [PIECE...]        # default: all
#
# PIECE: kube-apiserver kube-controller-manager kube-scheduler etcd kwok kueue kueue-crds
#        (Kueue's CRD manifests, copied from its module: no build), or `test` (what the test
#        suite needs: etcd kwok kube-apiserver kube-controller-manager kueue-crds) or `all`.
# Env:  GPUSHEPHERD_K8S_CACHE  the cache directory (default ~/.cache/gpushepherd/k8s):
#                              bin/ the binaries, src/ the build modules, build-times.txt
#       K8S_BUILD_P            go build -p (default 1: the machine is shared)
# Every build runs under `nice -n 10`. The time each piece took is appended to
# $CACHE/build-times.txt. A piece that fails leaves its log in $CACHE/logs/PIECE.log and
# the script goes on with the others; the exit code is 1 if any failed.
set -uo pipefail

K8S_VERSION=v1.37.2          # k8s.io/kubernetes
STAGING_VERSION=v0.37.2      # its staging modules (k8s.io/api, k8s.io/client-go, ...)
ETCD_VERSION=v3.6.16         # go.etcd.io/etcd/server/v3
KWOK_VERSION=v0.8.0          # sigs.k8s.io/kwok
KUEUE_VERSION=v0.17.0        # sigs.k8s.io/kueue

CACHE=${GPUSHEPHERD_K8S_CACHE:-$HOME/.cache/gpushepherd/k8s}
BIN=$CACHE/bin
mkdir -p "$BIN" "$CACHE/src" "$CACHE/logs"
export GOFLAGS="${GOFLAGS:-} -p=${K8S_BUILD_P:-1} -trimpath -buildvcs=false"
export CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}
LDFLAGS="-s -w"
command -v go >/dev/null 2>&1 || { echo "build.sh: no \`go\` on PATH: cannot build the Kubernetes binaries" >&2; exit 3; }

version_of() {
    case $1 in
        kube-apiserver|kube-controller-manager|kube-scheduler) echo "k8s.io/kubernetes@$K8S_VERSION version-stamped" ;;
        etcd) echo "go.etcd.io/etcd/server/v3@$ETCD_VERSION" ;;
        kwok) echo "sigs.k8s.io/kwok@$KWOK_VERSION" ;;
        kueue|kueue-crds) echo "sigs.k8s.io/kueue@$KUEUE_VERSION" ;;
    esac
}

# k8s_module: a module requiring k8s.io/kubernetes with every staging module replaced
# by its published version (the list is the release's own go.mod replace block).
k8s_module() {
    local d=$CACHE/src/kubernetes
    [ -f "$d/.ready-$K8S_VERSION" ] && return 0
    rm -rf "$d"; mkdir -p "$d"
    local mod
    mod=$(cd "$d" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    [ -f "$mod" ] || { echo "cannot download k8s.io/kubernetes@$K8S_VERSION's go.mod" >&2; return 1; }
    {
        echo "module gpushepherd.local/k8s-build"
        echo
        echo "go 1.26.0"
        echo
        echo "godebug default=go1.26"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$mod"
        echo ")"
    } > "$d/go.mod"
    (cd "$d" && go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION") || return 1
    touch "$d/.ready-$K8S_VERSION"
}

# plain_module NAME MODULE VERSION PKG...: a module requiring MODULE@VERSION (its own
# replace directives, if any, do not apply to a dependent: the published versions do)
plain_module() {
    local name=$1 module=$2 version=$3; shift 3
    local d=$CACHE/src/$name
    [ -f "$d/.ready-$version" ] && return 0
    rm -rf "$d"; mkdir -p "$d"
    printf 'module gpushepherd.local/%s-build\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" > "$d/go.mod"
    local p
    (cd "$d" && for p in "$@"; do go get "$p@$version" || exit 1; done) || return 1
    touch "$d/.ready-$version"
}

build_one() {
    local piece=$1 d pkg
    case $piece in
        kube-apiserver|kube-controller-manager|kube-scheduler)
            k8s_module || return 1; d=$CACHE/src/kubernetes; pkg=k8s.io/kubernetes/cmd/$piece ;;
        etcd)
            plain_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 || return 1
            d=$CACHE/src/etcd; pkg=go.etcd.io/etcd/server/v3 ;;
        kwok)
            plain_module kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok || return 1
            d=$CACHE/src/kwok; pkg=sigs.k8s.io/kwok/cmd/kwok ;;
        kueue)
            plain_module kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue || return 1
            d=$CACHE/src/kueue; pkg=sigs.k8s.io/kueue/cmd/kueue ;;
        kueue-crds)  # the CRDs (and nothing to build) from the module's source
            local dir
            dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
            [ -d "$dir/config/components/crd/bases" ] || { echo "no CRDs in $dir" >&2; return 1; }
            rm -rf "$CACHE/kueue-crds"; mkdir -p "$CACHE/kueue-crds"
            cp "$dir"/config/components/crd/bases/*.yaml "$CACHE/kueue-crds/"
            chmod u+w "$CACHE"/kueue-crds/*.yaml
            printf '#!/bin/sh\n# marker: Kueue %s CRDs are in ../kueue-crds\n' "$KUEUE_VERSION" > "$BIN/kueue-crds.tmp"
            chmod +x "$BIN/kueue-crds.tmp"; mv "$BIN/kueue-crds.tmp" "$BIN/kueue-crds"
            return 0 ;;
        *) echo "build.sh: unknown piece $piece" >&2; return 2 ;;
    esac
    local ldflags=$LDFLAGS
    case $piece in kube-*)  # the version a release build stamps (hack/lib/version.sh): clients such as Kueue read it
        local v=k8s.io/component-base/version minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
        ldflags="$ldflags -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" ;;
    esac
    (cd "$d" && nice -n 10 go build -ldflags="$ldflags" -o "$BIN/$piece.tmp" "$pkg") || return 1
    mv "$BIN/$piece.tmp" "$BIN/$piece"
}

pieces=()
for a in "${@:-all}"; do
    case $a in
        all) pieces+=(etcd kwok kueue-crds kube-apiserver kube-controller-manager kube-scheduler kueue) ;;
        test) pieces+=(etcd kwok kueue-crds kube-apiserver kube-controller-manager) ;;
        *) pieces+=("$a") ;;
    esac
done

failed=0
for piece in "${pieces[@]}"; do
    want=$(version_of "$piece")
    [ -n "$want" ] || { echo "build.sh: unknown piece $piece (allowed: kube-apiserver kube-controller-manager kube-scheduler etcd kwok kueue kueue-crds test all)" >&2; exit 2; }
    if [ -x "$BIN/$piece" ] && [ "$(cat "$BIN/$piece.version" 2>/dev/null)" = "$want" ]; then
        echo "build.sh: $piece ($want) is in the cache: $BIN/$piece"
        continue
    fi
    echo "build.sh: building $piece ($want) ..."
    t0=$(date +%s)
    if build_one "$piece" > "$CACHE/logs/$piece.log" 2>&1; then
        t=$(( $(date +%s) - t0 ))
        echo "$want" > "$BIN/$piece.version"
        echo "$(date -u +%FT%TZ) $piece $want ${t}s p=${K8S_BUILD_P:-1} nproc=$(nproc)" >> "$CACHE/build-times.txt"
        echo "build.sh: $piece built in ${t}s"
    else
        failed=1
        echo "build.sh: $piece FAILED after $(( $(date +%s) - t0 ))s; the last lines of $CACHE/logs/$piece.log:" >&2
        tail -20 "$CACHE/logs/$piece.log" >&2
    fi
done
exit $failed

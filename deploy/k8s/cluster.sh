#!/usr/bin/env bash
# Start or stop a loopback Kubernetes test cluster (design note 016): etcd, kube-apiserver,
# kube-controller-manager and KWOK from deploy/k8s/build.sh's cache, throwaway certificates,
# and N fake 8-GPU KWOK nodes fake1..fakeN.
#
#   deploy/k8s/cluster.sh start DIR [--nodes N] [--scheduler]   # prints `export KUBECONFIG=...`
#   deploy/k8s/cluster.sh stop DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} exec "$PY" -m gpushepherd.backends.kubecluster "$@"

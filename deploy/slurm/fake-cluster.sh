#!/bin/bash
# A fake Slurm cluster for tests and demos; the script itself ships inside the package
# (src/gpushepherd/data/fake-slurm-cluster.sh, design note 013). Same arguments.
exec bash "$(dirname "$(readlink -f "$0")")/../../src/gpushepherd/data/fake-slurm-cluster.sh" "$@"

#!/usr/bin/env bash
# Records the nested-KVM harness's measurements as JSON: L2 boot of the minimal image to its
# agent answering /health (nested-probe, VMM spawn to first 2xx), plus the L1 wall time.
# Under QEMU TCG these are ~100x hardware numbers: they track behaviour and regressions of
# the boot path, they are not speed claims.
#
#   bench/nested/run.sh [OUT.json]        (default: target/bench/nested.json)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/target/bench/nested.json}
mkdir -p "$(dirname "$out")"
"$root/tests/nested/run.sh" --only l1_kvm,vmm_smoke --bench-json "$out"
cat "$out"

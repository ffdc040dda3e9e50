#!/usr/bin/env bash
# Records the nested-KVM harness's measurement as JSON: L2 boot of the minimal image (our
# kernel, sandcell-vmm in an L1 under QEMU TCG) to its agent answering GET /health over
# vsock (nested-probe: VMM spawn to the first 2xx), N boots in one L1, plus the L1 wall time.
# Under TCG these are ~100x hardware numbers: they track the boot path's behaviour and
# regressions, they are not speed claims. Writes bench/nested/results.json and prints it.
#
#   bench/nested/run.sh [--boots N]        (default 5)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
boots=5
while [ $# -gt 0 ]; do
  case "$1" in
    --boots) boots=$2; shift 2 ;;
    *) echo "usage: $0 [--boots N]" >&2; exit 2 ;;
  esac
done
out=$root/bench/nested/results.json
"$root/tests/nested/run.sh" --only l1_kvm,vmm_smoke --boots "$boots" --bench-json "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"

#!/usr/bin/env bash
# Volumes in a key's own bucket (tests/e2b/test_volume_storage.py): a `sandcell serve
# --volume-storage-allow-private` (the key's bucket is on loopback here) whose bucket and
# the key's are on one SeaweedFS on its fixed ports (S3 :8333), so this runs when no other
# suite's SeaweedFS does (tests/e2b/run.sh calls it at its end). That a loopback endpoint is
# refused without the flag is tested by test_volumes.py against run.sh's daemon.
#
# Needs what tests/e2b/run.sh needs (root, runsc, the installed images, /dev/fuse).
# PY_SDK: the e2b version [default: run.sh's]; PYTEST_ARGS: extra pytest arguments.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/e2b"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=${PY_SDK:-$(sed -n 's/^PY_SDK=\([0-9.]*\)$/\1/p' "$HERE/run.sh")}

say() { echo "==> $*" >&2; }
die() { echo "tests/e2b/volumes_own_bucket: $*" >&2; exit 1; }

# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
# shellcheck source=tests/lib/volumes.sh
. "$ROOT/tests/lib/volumes.sh"
sc_require_gvisor
sc_volume_tools
sc_e2b_venv "$CACHE/venv" "$PY_SDK"
sc_bin
sc_tmp sc-e2b-ownbucket
sc_e2b_templates
sc_s3_start
# shellcheck disable=SC2046
sc_serve $(sc_s3_serve_args) --volume-storage-allow-private

export E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_VOLUME_API_URL="$URL"
E2B_API_KEY=$(cat "$DATA/admin.key")
SERVE_ERR="$TMP/serve.err"
export E2B_API_KEY SANDCELL_TEMPLATE S3_ENDPOINT S3_ACCESS_KEY S3_SECRET_KEY SERVE_ERR
status=0
# shellcheck disable=SC2086
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE/test_volume_storage.py" \
    ${PYTEST_ARGS:-} || status=1
# The daemon stopped (--kill-on-exit): its log has the shutdown's lines too; no credential.
kill -TERM "$DAEMON_PID" 2>/dev/null || true
for _ in $(seq 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
if grep -qF -e "$S3_SECRET_KEY" "$SERVE_ERR" "$TMP/serve.out"; then
    echo "tests/e2b/volumes_own_bucket: the S3 secret key is in the daemon's output" >&2
    status=1
fi
if [ "$status" != 0 ]; then sc_daemon_log; fi
exit "$status"

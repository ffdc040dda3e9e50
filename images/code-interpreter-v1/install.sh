#!/usr/bin/env bash
# Adds the code interpreter to a copy of the base tree: the pinned Python packages
# (requirements.txt, wheels for CPython 3.11 on manylinux x86_64, installed by the host's pip
# into /usr/local/lib/python3.11/dist-packages, which Debian's python3 reads) and the server
# (server.py) at /opt/sandcell/code-interpreter/. Wheels are cached in
# ${SANDCELL_CACHE:-~/.cache/sandcell}/downloads/code-interpreter-wheels.
#
#   images/code-interpreter-v1/install.sh TREE
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tree=${1:?usage: install.sh TREE}
wheels=${SANDCELL_CACHE:-$HOME/.cache/sandcell}/downloads/code-interpreter-wheels
py=${PYTHON:-python3}
platform=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --platform any)
[ -x "$tree/usr/bin/python3.11" ] || { echo "install.sh: $tree has no python3.11 (not a base tree?)" >&2; exit 1; }

mkdir -p "$wheels"
echo "code-interpreter: fetching the pinned wheels (cached in $wheels)" >&2
"$py" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" "${platform[@]}" -r "$here/requirements.txt"
site=$tree/usr/local/lib/python3.11/dist-packages
mkdir -p "$site"
# --no-deps: requirements.txt is the whole, pinned set; --no-index: from the cache only.
"$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --no-index --find-links "$wheels" \
  --no-compile --target "$site" "${platform[@]}" -r "$here/requirements.txt"
# The console scripts pip wrote name the host's python; the server needs none of them.
rm -rf "$site/bin"
# The kernels' extension for chart data (server.py starts every kernel with --ext=sandcell_charts).
install -D -m 0644 "$here/sandcell_charts.py" "$site/sandcell_charts.py"
# Bytecode, so that a sandbox's first `import pandas` does not compile it: hash-based and
# unchecked, because build-image.sh resets every mtime afterwards (a timestamp pyc would be
# stale then). Only a host Python of the image's version (3.11) writes pycs the image's reads.
if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  "$py" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$site" >/dev/null \
    || echo "code-interpreter: some files did not compile (kept as source)" >&2
else
  echo "code-interpreter: $py is not Python 3.11: no bytecode compiled (first imports are slower)" >&2
fi
install -D -m 0644 "$here/server.py" "$tree/opt/sandcell/code-interpreter/server.py"

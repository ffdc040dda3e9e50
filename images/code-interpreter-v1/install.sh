#!/usr/bin/env bash
# Adds the code interpreter to a copy of the base tree: the pinned Python packages
# (requirements.txt, wheels for CPython 3.11 on manylinux x86_64, installed by the host's pip
# into /usr/local/lib/python3.11/dist-packages, which Debian's python3 reads), the server
# (server.py) and the JavaScript kernel (js_kernel.py, js_driver.js) at
# /opt/sandcell/code-interpreter/. Wheels are cached in
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
# The bash kernel's spec, where jupyter_client looks (what `python3 -m bash_kernel.install
# --sys-prefix` would write, without running the image's Python on the host).
install -d "$tree/usr/local/share/jupyter/kernels/bash"
cat >"$tree/usr/local/share/jupyter/kernels/bash/kernel.json" <<'JSON'
{"argv": ["/usr/bin/python3", "-m", "bash_kernel", "-f", "{connection_file}"], "display_name": "Bash", "language": "bash", "env": {"PS1": "$"}}
JSON
# The JavaScript kernel (js_kernel.py, a Python kernel driving the base image's node through
# js_driver.js) and its spec.
install -d "$tree/usr/local/share/jupyter/kernels/javascript"
cat >"$tree/usr/local/share/jupyter/kernels/javascript/kernel.json" <<'JSON'
{"argv": ["/usr/bin/python3", "/opt/sandcell/code-interpreter/js_kernel.py", "-f", "{connection_file}"], "display_name": "JavaScript (Node.js)", "language": "javascript"}
JSON
[ -x "$tree/usr/local/bin/node" ] || { echo "install.sh: $tree has no /usr/local/bin/node (base's node.sh)" >&2; exit 1; }
for f in server.py js_kernel.py js_driver.js; do
  install -D -m 0644 "$here/$f" "$tree/opt/sandcell/code-interpreter/$f"
done

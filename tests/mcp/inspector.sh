#!/usr/bin/env bash
# The MCP Inspector's CLI mode (npm @modelcontextprotocol/inspector) against Sandcell's MCP
# server: tools/list over stdio with --strict (schema portability problems fail it), then
# tools/call over streamable HTTP: create a sandbox, exec in it, a malformed call, kill it.
# Run by tests/mcp/run.sh, which sets SANDCELL_BIN, SANDCELL_URL, SANDCELL_KEY_A,
# SANDCELL_TEMPLATE, INSPECTOR (the CLI) and PY (a python3 for reading JSON).
set -euo pipefail

fails=0
passes=0
check() { # NAME CONDITION-EXIT-STATUS
    if [ "$2" = 0 ]; then passes=$((passes + 1)); echo "  ok   $1"; else fails=$((fails + 1)); echo "  FAIL $1" >&2; fi
}
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
cli() { (cd /tmp && timeout 120 "$INSPECTOR" --cli "$@"); }

out=$(cli "$SANDCELL_BIN" mcp -e "SANDCELL_URL=$SANDCELL_URL" -e "SANDCELL_API_KEY=$SANDCELL_KEY_A" \
    --method tools/list --strict 2>/dev/null) && rc=0 || rc=$?
check "stdio tools/list --strict exits 0 (rc $rc)" "$rc"
n=$(echo "$out" | json "len(d['tools'])" 2>/dev/null || echo 0)
[ "$n" -ge 18 ]; check "stdio tools/list has the 18 tools ($n)" $?

http=(--transport http "$SANDCELL_URL/mcp" --header "Authorization: Bearer $SANDCELL_KEY_A")
out=$(cli "${http[@]}" --method tools/call --tool-name sandbox_create \
    --tool-arg "template=$SANDCELL_TEMPLATE" timeout_seconds=120 2>/dev/null) && rc=0 || rc=$?
sid=$(echo "$out" | json "d['structuredContent']['sandbox_id']" 2>/dev/null || true)
[ "$rc" = 0 ] && [ -n "$sid" ]; check "http sandbox_create ($sid)" $?

if [ -n "$sid" ]; then
    out=$(cli "${http[@]}" --method tools/call --tool-name exec --tool-arg "sandbox_id=$sid" \
        'command=echo inspector; exit 4' 2>/dev/null) || true
    code=$(echo "$out" | json "d['structuredContent']['exit_code']" 2>/dev/null || true)
    said=$(echo "$out" | json "d['structuredContent']['stdout']" 2>/dev/null || true)
    [ "$code" = 4 ] && [ "$said" = inspector ]; check "http exec (exit $code, stdout $said)" $?

    out=$(cli "${http[@]}" --method tools/call --tool-name exec --tool-arg "sandbox_id=$sid" \
        2>/dev/null) || true
    err=$(echo "$out" | json "d.get('isError')" 2>/dev/null || true)
    [ "$err" = True ]; check "http exec without a command is isError ($err)" $?

    out=$(cli "${http[@]}" --method tools/call --tool-name sandbox_kill --tool-arg "sandbox_id=$sid" \
        2>/dev/null) || true
    killed=$(echo "$out" | json "d['structuredContent']['killed']" 2>/dev/null || true)
    [ "$killed" = True ]; check "http sandbox_kill ($killed)" $?
fi

echo "inspector: $passes passed, $fails failed"
[ "$fails" = 0 ]

#!/bin/sh
# The desktop template's start command (e2b.json): Xvfb on :0 at 1024x768 and the xfce4
# session, as the e2b-desktop SDK starts them, so that the daemon's memory snapshot of the
# template (crates/server templates/installed_snapshot.rs) holds a started desktop and
# creates restore it. The SDK's own start commands then find it running (the Xvfb and
# startxfce4 wrappers beside this file).
export DISPLAY=:0 NO_AT_BRIDGE=1
/usr/bin/Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix &
i=0
until /usr/bin/xdpyinfo >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 200 ] || { echo "session.sh: Xvfb did not answer" >&2; exit 1; }
  sleep 0.05
done
exec /usr/bin/startxfce4

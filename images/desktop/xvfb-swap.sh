# /usr/local/lib/sandcell/xvfb-swap.sh, sourced by the xdpyinfo and startxfce4 wrappers: waits
# while an Xvfb wrapper (/usr/local/bin/Xvfb) is swapping the display for one of another size,
# that is while a wrapper runs that has not yet written its /tmp/.sandcell-xvfb-ready.PID.
# A wrapper is found by its command line, and so is the SDK's `bash -l -c "Xvfb ..."` that is
# still reading its login profile before it execs the wrapper (same pid).
# The SDK starts Xvfb in the background, then checks `xdpyinfo` and starts `startxfce4`:
# without this, the restored display (and session) answer those checks while they are being
# replaced. At most 30 s.
sandcell_wait_for_display_swap() {
  _i=0
  while :; do
    _busy=
    for _pid in $(pgrep -f '^(/bin/sh /usr/local/bin/Xvfb|/bin/bash -l -c (/usr/local/bin/)?Xvfb)( |$)'); do
      [ -e "/tmp/.sandcell-xvfb-ready.$_pid" ] || _busy=$_pid
    done
    [ -n "$_busy" ] || return 0
    _i=$((_i + 1))
    [ "$_i" -lt 600 ] || return 1
    sleep 0.05
  done
}

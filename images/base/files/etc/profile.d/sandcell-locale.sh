# C.UTF-8 is built into Debian's glibc: no locales package needed.
export LANG=C.UTF-8

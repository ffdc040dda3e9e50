#!/bin/bash
# Runs inside the freshly debootstrapped tree (chroot, as root): the `user` account and
# the clean-up that keeps the image small. Part of the debootstrap stage's cache key.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# E2B's default user: uid/gid 1000, bash, in the sudo group (the NOPASSWD rule itself is
# files/etc/sudoers.d/user). The password stays locked: sudo does not ask for one.
useradd --create-home --uid 1000 --user-group --groups sudo --shell /bin/bash --comment user user
chmod 0755 /home/user

# The hostname is the sandbox's id, unknown here: myhostname answers for it, before DNS
# (which a sandbox without a network cannot reach).
sed -i 's/^hosts:.*/hosts:          files myhostname dns/' /etc/nsswitch.conf
grep -q '^hosts: *files myhostname dns$' /etc/nsswitch.conf

# The image's apt sources come from files/etc/apt/sources.list.d/debian.sources.
rm -f /etc/apt/sources.list

# Slim: what apt downloaded, its package lists, and docs/manuals/translations (their
# copyright files stay); files/etc/dpkg/dpkg.cfg.d/sandcell-slim keeps later installs slim.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
find /var/log -type f -exec truncate -s 0 {} +
# Each sandbox is its own machine: no machine-id baked in.
: > /etc/machine-id

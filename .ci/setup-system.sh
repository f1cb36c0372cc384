#!/usr/bin/env bash
# System packages the tests need: bubblewrap (sandbox network isolation), docker.io (a real Docker
# engine, started by the tests), busybox-static (rootfs for a locally built sandbox image),
# chromium (the review UI's browser tests). Installs only what is missing.
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v dockerd >/dev/null || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v chromium >/dev/null || need+=(chromium)
command -v unshare >/dev/null || need+=(util-linux)
command -v git >/dev/null || need+=(git)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing system packages: ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

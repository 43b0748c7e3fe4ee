#!/usr/bin/env bash
# Installs what HiveFS needs on a Debian machine: FUSE 3 (fusermount3), and
# the tools the tests and benchmarks use. A no-op when everything is there.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v fio >/dev/null || need+=(fio)
command -v ip >/dev/null || need+=(iproute2)
command -v setpriv >/dev/null || need+=(util-linux)
command -v setfacl >/dev/null || need+=(acl)
command -v getfattr >/dev/null || need+=(attr)
command -v rsvg-convert >/dev/null || need+=(librsvg2-bin)
command -v python3 >/dev/null || need+=(python3)
command -v rsync >/dev/null || need+=(rsync)
command -v tc >/dev/null || need+=(iproute2)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo (Rust) is required: https://rustup.rs" >&2
  exit 1
fi

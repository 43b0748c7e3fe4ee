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
# NFS re-export test: the user-space NFS server and client tools.
command -v ganesha.nfsd >/dev/null || need+=(nfs-ganesha nfs-ganesha-vfs)
command -v nfs-cp >/dev/null || need+=(libnfs-utils)
command -v tc >/dev/null || need+=(iproute2)
# On-demand instances across hosts (`hivefs ond`) and their tests: ssh and sshd.
command -v ssh >/dev/null || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
# Slurm test: a real slurmctld and slurmd, munge, and the SPANK plugin's build.
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
[ -f /usr/include/slurm/spank.h ] || need+=(libslurm-dev)
command -v munged >/dev/null || need+=(munge)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
# Metrics test: a real Prometheus server, queried with curl.
lean=()
command -v prometheus >/dev/null || lean+=(prometheus)
command -v curl >/dev/null || need+=(curl)
if ((${#lean[@]})); then
  # Without the recommended exporters and their services.
  echo "installing: ${lean[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
fi
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  # Daemons the packages may have started are not wanted (the tests start their own).
  $SUDO pkill -x munged || true
  $SUDO pkill -x slurmctld || true
  $SUDO pkill -x slurmd || true
  # The NFS packages' own services are not wanted (the test starts its server).
  if [[ " ${need[*]} " == *" nfs-ganesha "* ]]; then
    $SUDO pkill -x ganesha.nfsd || true
    $SUDO pkill -x rpcbind || true
  fi
fi
if ! command -v cargo >/dev/null; then
  echo "cargo (Rust) is required: https://rustup.rs" >&2
  exit 1
fi

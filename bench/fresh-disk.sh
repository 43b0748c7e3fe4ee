# Sourced by the A/B scripts: `fresh` gives the next run a new ext4 in a 16 GiB file on
# the same disk, mounted on $W/disk (FRESH=1), and points $D at it; without FRESH=1 runs
# stay in $W. Each run then starts with no inodes freed by an earlier run: ext4 skips
# inodes freed in the last seconds when it allocates (`recently_deleted`), and after a
# few runs on one file system that scan is most of the storage services' CPU.
mkdir -p "$W/disk" "$W/bmnt" "$W/mnt"
D=$W
fresh() {
  [ "${FRESH:-0}" = 1 ] || return 0
  mountpoint -q "$W/disk" && umount "$W/disk"
  rm -f "$W/disk.img"
  truncate -s 16G "$W/disk.img"
  mkfs.ext4 -q -F "$W/disk.img"
  mount -o loop "$W/disk.img" "$W/disk"
  D=$W/disk
}

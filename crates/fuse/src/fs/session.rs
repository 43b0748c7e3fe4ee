//! Mounting: checks of the mount point, the FUSE session and its options,
//! the kernel knobs set around it, and the end of the session.

use super::*;
use std::os::fd::AsFd;

/// Refuses a mount point that is missing, not a directory, not empty, or already a mount.
pub fn check_mountpoint(mnt: &Path) -> Result<(), String> {
    let md = std::fs::metadata(mnt).map_err(|e| format!("mount point {}: {e}", mnt.display()))?;
    if !md.is_dir() {
        return Err(format!("mount point {} is not a directory", mnt.display()));
    }
    let canon = std::fs::canonicalize(mnt).map_err(|e| format!("mount point {}: {e}", mnt.display()))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        if let Some(mp) = line.split(' ').nth(4) {
            if Path::new(&mp.replace("\\040", " ")) == canon {
                return Err(format!("mount point {} is busy: something is already mounted there", mnt.display()));
            }
        }
    }
    let mut rd = std::fs::read_dir(mnt).map_err(|e| format!("mount point {}: {e}", mnt.display()))?;
    if rd.next().is_some() {
        return Err(format!("mount point {} is not empty", mnt.display()));
    }
    Ok(())
}

/// The `major:minor` device of the mount on `mnt`, from /proc/self/mountinfo
/// (a `stat` of the mount point would ask this file system, which is not
/// serving yet).
fn mount_device(mountinfo: &str, mnt: &Path) -> Option<String> {
    let want = mnt.to_str()?;
    mountinfo.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let point = f.nth(1)?.replace("\\040", " ");
        (point == want).then(|| dev.to_string())
    })
}

/// Sets the kernel's read-ahead for the mount on `mnt` to `kib` KiB. The
/// kernel caps a FUSE mount's read-ahead at its block-device default (128
/// KiB) whatever `max_readahead` the session asks for; 1 MiB read-ahead makes
/// `paged` sequential reads about twice as fast (docs/decisions.md). Needs
/// root; without it the default stays and a note is logged.
fn set_read_ahead(mnt: &Path, kib: u32) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(dev) = mount_device(&info, mnt) else {
        info!("read-ahead of {} left at the kernel's default: mount not found", mnt.display());
        return;
    };
    let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&knob, format!("{kib}\n")) {
        Ok(()) => debug!("read-ahead of {} set to {kib} KiB ({knob})", mnt.display()),
        Err(e) => info!("read-ahead of {} left at the kernel's default: {knob}: {e}", mnt.display()),
    }
}

/// Mounts HiveFS at `mnt` and serves it until it is unmounted or `stop`
/// fires; `mounted` runs once the mount is in place, just before serving.
pub fn mount(
    client: Arc<Client>,
    rt: tokio::runtime::Handle,
    mnt: &Path,
    opts: &MountOptions,
    stop: std::sync::mpsc::Receiver<()>,
    mounted: impl FnOnce(),
) -> std::io::Result<()> {
    check_mountpoint(mnt).map_err(std::io::Error::other)?;
    let root = client.root();
    let inner = Arc::new(Inner {
        client,
        inodes: Mutex::new(Inodes::new(root)),
        files: Mutex::default(),
        dirs: Mutex::default(),
        local_sizes: Mutex::default(),
        next_fh: AtomicU64::new(1),
        global_locks: opts.global_file_locks,
        dir_attr_ttl: opts.dir_attr_ttl,
        cache_mode: opts.cache_mode,
        writeback: opts.writeback,
        writeback_budget: hivefs_client::writeback::WriteBackBudget::new(opts.writeback.total),
        atime: opts.atime,
        acl_wanted: opts.acl,
        acl: std::sync::atomic::AtomicBool::new(false),
        opened_versions: Mutex::default(),
        releasing: Default::default(),
        locked: Mutex::default(),
        waits: Mutex::default(),
        notifier: std::sync::OnceLock::new(),
        epoch_fd: std::sync::OnceLock::new(),
        unmounter: std::sync::OnceLock::new(),
        rt,
    });
    let rt_handle = inner.rt.clone();
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("hivefs".into()),
        MountOption::Subtype("hivefs".into()),
        MountOption::DefaultPermissions,
    ];
    // The kernel's own flag, for what it shows of its cached inodes; the
    // access times themselves are kept by the metadata nodes.
    match opts.atime {
        Atime::NoAtime => cfg.mount_options.push(MountOption::NoAtime),
        Atime::StrictAtime => cfg.mount_options.push(MountOption::Atime),
        Atime::Relatime => {}
    }
    cfg.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    let rings = Arc::new(Mutex::new(None));
    let epoch_fd = {
        let handshake = Handshake { inner: inner.clone(), transport: opts.fuse_transport, rings: rings.clone() };
        let session = fuser::Session::new(handshake, mnt, &cfg)?;
        // The session's /dev/fuse descriptor; a duplicate stays valid as
        // long as the connection.
        let f = session.as_fd().try_clone_to_owned().map(std::fs::File::from).ok();
        let f = f.filter(|f| match inc_epoch(f) {
            Ok(()) => true,
            Err(e) => {
                info!("the kernel does not take FUSE_NOTIFY_INC_EPOCH ({e}): names are cached for 1 s, not leased");
                false
            }
        });
        (session, f)
    };
    let (mut session, epoch_fd) = epoch_fd;
    if let Some(f) = epoch_fd {
        let _ = inner.epoch_fd.set(f);
    }
    let _ = inner.notifier.set(session.notifier());
    {
        // Leases start a poll task on the runtime.
        let _rt = rt_handle.enter();
        let weak = Arc::downgrade(&inner);
        inner.client.enable_leases(Box::new(move |r| {
            if let Some(inner) = weak.upgrade() {
                match r {
                    Revocation::Attrs(id) => inner.drop_kernel_attrs(id),
                    Revocation::Names => inner.drop_names(),
                }
            }
        }));
        // The kernel drops a directory's attributes after each change in it
        // and asks again before the next: answered from the changes' answers
        // for as long as it caches them anyway.
        if !inner.dir_attr_ttl.is_zero() {
            inner.client.cache_dir_attrs(inner.dir_attr_ttl);
        }
        if opts.create_ahead {
            inner.client.enable_ahead();
        }
    }
    if opts.cache_mode == CacheMode::Paged {
        set_read_ahead(mnt, MAX_IO / 1024);
    }
    let _ = inner.unmounter.set(Mutex::new(session.unmount_callable()));
    let mut unmounter = session.unmount_callable();
    let mnt_s = mnt.display().to_string();
    std::thread::spawn(move || {
        if stop.recv().is_ok() {
            info!("unmounting {mnt_s}");
            if let Err(e) = unmounter.unmount() {
                warn!("unmount of {mnt_s} failed: {e}");
            }
        }
    });
    // The connection's descriptor for the transports; fuser's session stays
    // for notifications and the unmount.
    let dev = std::fs::File::from(session.as_fd().try_clone_to_owned()?);
    let fs = Arc::new(HiveFs { inner: inner.clone() });
    let prepared = rings.lock().expect("rings").take();
    let ring = match prepared {
        Some(prepared) => match serve_uring(fs.clone(), &dev, prepared) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!("FUSE over io_uring could not start ({e}): requests go through /dev/fuse");
                None
            }
        },
        None => None,
    };
    mounted();
    let r = serve_dev(fs, &dev, opts.fuse_threads.max(1), MAX_IO as usize + (64 << 10));
    drop(ring);
    // The session ended: the kernel unmounted the file system (an unmount
    // from outside, `hivefs down`) or the stop signal did. The mount is
    // released here, where an unmount that already happened is expected,
    // instead of when the session is dropped (which would try it again and
    // warn about a mount point that is no longer there).
    if let Some(u) = inner.unmounter.get() {
        if let Err(e) = u.lock().expect("unmounter").unmount() {
            debug!("unmount at the end of the session: {e} (already unmounted)");
        }
    }
    // Handles released at the end are told before the process exits.
    // The timer is made inside the runtime.
    let flush = async { tokio::time::timeout(std::time::Duration::from_secs(10), inner.client.flush_releases()).await };
    if rt_handle.block_on(flush).is_err() {
        warn!("releases of open handles were not all answered within 10 s of unmounting {}", mnt.display());
    }
    r
}

/// Answers the kernel's INIT (in `fuser::Session::new`): what this mount
/// asks of the kernel, and whether requests may come over io_uring.
struct Handshake {
    inner: Arc<Inner>,
    transport: FuseTransport,
    /// FUSE over io_uring: its rings, made when it was asked for and the
    /// kernel offers it, before the kernel is told this side uses them.
    rings: Arc<Mutex<Option<UringQueues>>>,
}

impl fuser::Filesystem for Handshake {
    fn init(&mut self, _req: &fuser::Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_IO) {
            warn!("kernel limits max_write to {max}");
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_readahead(MAX_IO);
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            // Inode numbers are stable ids: file handles (name_to_handle_at,
            // NFS re-export) stay valid after the kernel forgets an inode.
            | InitFlags::FUSE_EXPORT_SUPPORT;
        for flag in wanted.iter() {
            let _ = config.add_capabilities(flag);
        }
        if self.inner.global_locks {
            // Without these the kernel keeps flock/fcntl locks local to this machine.
            for flag in [InitFlags::FUSE_POSIX_LOCKS, InitFlags::FUSE_FLOCK_LOCKS] {
                if let Err(f) = config.add_capabilities(flag) {
                    warn!("the kernel does not offer {f:?}: those locks stay local to this machine");
                }
            }
        }
        if self.inner.acl_wanted {
            // Both or neither: with FUSE_POSIX_ACL the kernel enforces ACLs
            // (default_permissions fetches them with getxattr and caches
            // them) and stops applying the umask itself, but without
            // FUSE_DONT_MASK its FUSE layer would still mask the mode before
            // sending it, which breaks default ACL inheritance.
            let both = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
            if config.add_capabilities(both).is_ok() {
                self.inner.acl.store(true, std::sync::atomic::Ordering::Relaxed);
            } else {
                warn!("the kernel does not offer FUSE_POSIX_ACL and FUSE_DONT_MASK: ACLs are not enforced");
            }
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let offered = config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING);
        if self.transport != FuseTransport::Dev && offered {
            match UringQueues::prepare(UringConfig::new(MAX_IO as usize)) {
                Ok(q) if config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok() => {
                    *self.rings.lock().expect("rings") = Some(q)
                }
                Ok(_) => {}
                Err(e) => warn!("FUSE over io_uring: making the rings failed ({e}): requests go through /dev/fuse"),
            }
        } else if self.transport == FuseTransport::Uring {
            warn!(
                "the kernel does not offer FUSE over io_uring (see /sys/module/fuse/parameters/enable_uring): \
                 requests go through /dev/fuse"
            );
        } else if self.transport == FuseTransport::Auto {
            debug!("the kernel does not offer FUSE over io_uring: requests go through /dev/fuse");
        }
        info!("FUSE session initialised (kernel ABI {:?})", config.kernel_abi());
        Ok(())
    }
}

/// Kernel FUSE protocol: `FUSE_NOTIFY_INC_EPOCH` (7.44).
const FUSE_NOTIFY_INC_EPOCH: i32 = 8;

/// Sends `FUSE_NOTIFY_INC_EPOCH` on `dev`: a bare `fuse_out_header` (length,
/// notification code in the error field, unique 0).
pub(super) fn inc_epoch(dev: &std::fs::File) -> std::io::Result<()> {
    use std::io::Write;
    let mut msg = [0u8; 16];
    msg[0..4].copy_from_slice(&16u32.to_ne_bytes());
    msg[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_ne_bytes());
    (&*dev).write_all(&msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_of_a_mount_comes_from_mountinfo() {
        let info = "22 1 0:21 / /proc rw - proc proc rw\n\
                    90 22 0:39 / /tmp/a\\040b rw,nosuid - fuse.hivefs hivefs rw\n\
                    91 22 0:40 / /tmp/x rw - fuse.hivefs hivefs rw\n\
                    92 22 0:41 / /tmp/x rw - fuse.hivefs hivefs rw\n";
        assert_eq!(mount_device(info, Path::new("/tmp/a b")).as_deref(), Some("0:39"));
        // Mounted twice on one point: the last (topmost) mount.
        assert_eq!(mount_device(info, Path::new("/tmp/x")).as_deref(), Some("0:41"));
        assert_eq!(mount_device(info, Path::new("/tmp")), None);
    }
}

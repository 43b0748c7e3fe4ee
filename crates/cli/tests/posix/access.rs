//! Permission bits, sticky and setgid directories, suid/sgid clearing, chown rules.

use crate::*;
use libc::{EACCES, EPERM, O_CREAT, O_DIRECTORY, O_RDONLY, O_RDWR, O_WRONLY, R_OK, W_OK, X_OK};

pub fn permission_bits(fs: &TestFs) {
    let d = base(fs, "perm", 0o777);
    let f = d.join("f");
    write_file(&f, b"data");
    let cf = cs(&f);

    // Files: read / write / exec bits of the "other" class.
    chmod(&f, 0o600);
    assert_eq!(as_user(U1, || open_e(&cf, O_RDONLY, 0)), EACCES, "read of 0600 by other");
    assert_eq!(as_user(U1, || open_e(&cf, O_WRONLY, 0)), EACCES, "write of 0600 by other");
    chmod(&f, 0o604);
    assert_eq!(as_user(U1, || open_e(&cf, O_RDONLY, 0)), 0);
    assert_eq!(as_user(U1, || open_e(&cf, O_RDWR, 0)), EACCES);
    chmod(&f, 0o602);
    assert_eq!(as_user(U1, || write_e(&cf, 0, b"xy")), 0, "write of 0602 by other");
    assert_eq!(as_user(U1, || open_e(&cf, O_RDONLY, 0)), EACCES);
    chmod(&f, 0o755);
    // SAFETY (all `access` calls): valid C strings.
    assert_eq!(as_user(U1, || e(unsafe { libc::access(cf.as_ptr(), X_OK) })), 0);
    chmod(&f, 0o754);
    assert_eq!(as_user(U1, || e(unsafe { libc::access(cf.as_ptr(), X_OK) })), EACCES);
    // Group class: the owner class does not apply to group members, the group class does.
    chown(&f, 0, G3);
    chmod(&f, 0o640);
    assert_eq!(as_user(U1_IN_G3, || open_e(&cf, O_RDONLY, 0)), 0, "group read");
    assert_eq!(as_user(U1_IN_G3, || open_e(&cf, O_WRONLY, 0)), EACCES, "group write of 0640");
    // Owner class: an owner without the bit is refused even if "other" has it.
    chown(&f, U1.uid, 0);
    chmod(&f, 0o066);
    assert_eq!(as_user(U1, || open_e(&cf, O_RDONLY, 0)), EACCES, "owner without r bit");
    // Root reads and writes anything (but needs some x bit to execute).
    chmod(&f, 0o000);
    assert_eq!(open_e(&cf, O_RDWR, 0), 0, "root opens a 0000 file");
    // SAFETY: valid C string.
    assert_eq!(e(unsafe { libc::access(cf.as_ptr(), X_OK) }), EACCES, "root exec of 0000");
    chown(&f, 0, 0);

    // Directories: search (x) and read (r) and write (w).
    let sd = d.join("sd");
    mkdir(&sd, 0o755);
    write_file(&sd.join("in"), b"");
    let (csd, cin, cnew) = (cs(&sd), cs(&sd.join("in")), cs(&sd.join("new")));
    let dir_flags = O_RDONLY | O_DIRECTORY;
    chmod(&sd, 0o700);
    assert_eq!(as_user(U1, || open_e(&cin, O_RDONLY, 0)), EACCES, "lookup in 0700 dir");
    assert_eq!(as_user(U1, || open_e(&csd, dir_flags, 0)), EACCES, "opendir of 0700 dir");
    chmod(&sd, 0o744);
    assert_eq!(as_user(U1, || open_e(&csd, dir_flags, 0)), 0, "opendir of 0744 dir");
    // SAFETY: zeroed stat buffer, valid C string.
    let stat_e = |p: &CString| {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        e(unsafe { libc::stat(p.as_ptr(), &mut st) })
    };
    assert_eq!(as_user(U1, || stat_e(&cin)), EACCES, "stat below a dir without x");
    chmod(&sd, 0o711);
    assert_eq!(as_user(U1, || stat_e(&cin)), 0, "stat below a 0711 dir");
    assert_eq!(as_user(U1, || open_e(&csd, dir_flags, 0)), EACCES, "opendir of a 0711 dir");
    // SAFETY (unlink/access below): valid C strings.
    assert_eq!(as_user(U1, || open_e(&cnew, O_CREAT | O_WRONLY, 0o644)), EACCES, "create in 0711 dir");
    assert_eq!(as_user(U1, || e(unsafe { libc::unlink(cin.as_ptr()) })), EACCES, "unlink in 0711 dir");
    chmod(&sd, 0o773);
    assert_eq!(as_user(U1, || e(unsafe { libc::access(csd.as_ptr(), W_OK | X_OK) })), 0);
    assert_eq!(as_user(U1, || open_e(&cnew, O_CREAT | O_WRONLY, 0o644)), 0, "create in 0773 dir");
    let st = lstat(&sd.join("new"));
    assert_eq!((st.st_uid, st.st_gid), (U1.uid, U1.gid), "new file owned by its creator");
    assert_eq!(as_user(U1, || e(unsafe { libc::unlink(cin.as_ptr()) })), 0, "unlink in 0773 dir");
    // A directory that is writable but not searchable still refuses creation.
    chmod(&sd, 0o776);
    assert_eq!(as_user(U1, || open_e(&cin, O_CREAT | O_WRONLY, 0o644)), EACCES, "create in 0776 dir");
    assert_eq!(as_user(U1, || e(unsafe { libc::access(csd.as_ptr(), R_OK) })), 0);

    // chmod and explicit utimes are the owner's; "now" needs write access only.
    chmod(&f, 0o646);
    // SAFETY (below): valid C strings and a two-element timespec array.
    assert_eq!(as_user(U1, || e(unsafe { libc::chmod(cf.as_ptr(), 0o777) })), EPERM, "chmod by non-owner");
    let times = [libc::timespec { tv_sec: 5, tv_nsec: 0 }, libc::timespec { tv_sec: 6, tv_nsec: 0 }];
    let utimes = |t: *const libc::timespec| e(unsafe { libc::utimensat(libc::AT_FDCWD, cf.as_ptr(), t, 0) });
    assert_eq!(as_user(U1, || utimes(times.as_ptr())), EPERM, "explicit utimes by non-owner");
    assert_eq!(as_user(U1, || utimes(std::ptr::null())), 0, "utimes(now) by a writer");
    chmod(&f, 0o644);
    assert_eq!(as_user(U1, || utimes(std::ptr::null())), EACCES, "utimes(now) by a non-writer");
    chown(&f, U1.uid, U1.gid);
    assert_eq!(as_user(U1, || utimes(times.as_ptr())), 0, "explicit utimes by the owner");
    assert_eq!(lstat(&f).st_mtime, 6);
    assert_eq!(as_user(U1, || e(unsafe { libc::chmod(cf.as_ptr(), 0o600) })), 0, "chmod by owner");
    assert_eq!(mode(&f), 0o600);
}

pub fn sticky_directories(fs: &TestFs) {
    let s = base(fs, "sticky", 0o1777);
    assert_eq!(mode(&s), 0o1777);
    let (a, b, c) = (s.join("a"), s.join("b"), s.join("c"));
    let (ca, cb, cc) = (cs(&a), cs(&b), cs(&c));
    assert_eq!(as_user(U1, || write_e(&ca, O_CREAT, b"a")), 0);
    assert_eq!(as_user(U2, || write_e(&cb, O_CREAT, b"b")), 0);
    assert_eq!(as_user(U1, || write_e(&cc, O_CREAT, b"c")), 0);
    // SAFETY (all below): valid C strings.
    let unlink = |p: &CString| e(unsafe { libc::unlink(p.as_ptr()) });
    let rename = |x: &CString, y: &CString| e(unsafe { libc::rename(x.as_ptr(), y.as_ptr()) });
    assert_eq!(as_user(U1, || unlink(&cb)), EPERM, "unlink of another user's file in a sticky dir");
    assert_eq!(as_user(U1, || rename(&cb, &cs(&s.join("z")))), EPERM, "rename of another user's file");
    assert_eq!(as_user(U1, || rename(&ca, &cb)), EPERM, "rename over another user's file");
    assert_eq!(as_user(U1, || rename(&ca, &cc)), 0, "rename over an own file");
    assert_eq!(as_user(U2, || unlink(&cc)), EPERM);
    assert_eq!(as_user(U1, || unlink(&cc)), 0, "unlink of an own file");
    // Directories in a sticky directory follow the same rule.
    let sub = s.join("sub");
    let csub = cs(&sub);
    // SAFETY: valid C string.
    assert_eq!(as_user(U2, || e(unsafe { libc::mkdir(csub.as_ptr(), 0o777) })), 0);
    // SAFETY: valid C string.
    assert_eq!(as_user(U1, || e(unsafe { libc::rmdir(csub.as_ptr()) })), EPERM);
    // The owner of the directory may remove anyone's entries.
    let own = base(fs, "sticky/own", 0o1777);
    chown(&own, U1.uid, U1.gid);
    let x = cs(&own.join("x"));
    assert_eq!(as_user(U2, || write_e(&x, O_CREAT, b"x")), 0);
    assert_eq!(as_user(U1, || unlink(&x)), 0, "dir owner unlinks in its sticky dir");
    // Root may too.
    assert_eq!(unlink(&cb), 0);
    // Without the sticky bit anyone with write access may.
    chmod(&s, 0o777);
    assert_eq!(as_user(U2, || write_e(&cb, O_CREAT, b"b")), 0);
    assert_eq!(as_user(U1, || unlink(&cb)), 0, "unlink in a non-sticky dir");
}

pub fn setgid_and_suid(fs: &TestFs) {
    let g = base(fs, "sgid", 0o777);
    chown(&g, 0, G3);
    chmod(&g, 0o2777);
    assert_eq!(mode(&g), 0o2777);
    let (f, sub, sl) = (cs(&g.join("f")), cs(&g.join("sub")), cs(&g.join("sl")));
    assert_eq!(as_user(U1, || write_e(&f, O_CREAT, b"")), 0);
    // SAFETY (below): valid C strings.
    assert_eq!(as_user(U1, || e(unsafe { libc::mkdir(sub.as_ptr(), 0o755) })), 0);
    assert_eq!(as_user(U1, || e(unsafe { libc::symlink(c"f".as_ptr(), sl.as_ptr()) })), 0);
    let st = lstat(&g.join("f"));
    assert_eq!((st.st_uid, st.st_gid), (U1.uid, G3), "file in a setgid dir takes the dir's group");
    assert_eq!(st.st_mode & 0o7777, 0o644);
    let st = lstat(&g.join("sub"));
    assert_eq!(st.st_gid, G3, "subdirectory takes the group");
    assert_eq!(st.st_mode & 0o7777, 0o2755, "subdirectory inherits the setgid bit");
    assert_eq!(lstat(&g.join("sl")).st_gid, G3);
    let deeper = cs(&g.join("sub/deeper"));
    // SAFETY: valid C string.
    assert_eq!(as_user(U1, || e(unsafe { libc::mkdir(deeper.as_ptr(), 0o700) })), 0);
    assert_eq!(mode(&g.join("sub/deeper")), 0o2700, "the bit propagates");

    // chmod by an owner outside the file's group silently clears setgid.
    let fp = g.join("f");
    // SAFETY (below): valid C strings.
    assert_eq!(as_user(U1, || e(unsafe { libc::chmod(f.as_ptr(), 0o2755) })), 0);
    assert_eq!(mode(&fp), 0o755, "chmod g+s by a non-member clears setgid");
    assert_eq!(as_user(U1_IN_G3, || e(unsafe { libc::chmod(f.as_ptr(), 0o2755) })), 0);
    assert_eq!(mode(&fp), 0o2755, "chmod g+s by a member keeps it");
    // Root may set it on anything.
    chmod(&fp, 0o4755);
    assert_eq!(mode(&fp), 0o4755);

    // A write by a user without CAP_FSETID clears suid and (group-executable) sgid.
    let w = g.join("w");
    write_file(&w, b"0123");
    chmod(&w, 0o6777);
    let cw = cs(&w);
    assert_eq!(as_user(U2, || write_e(&cw, 0, b"x")), 0);
    assert_eq!(mode(&w), 0o777, "write by non-owner clears suid and sgid");
    chmod(&w, 0o6777);
    assert_eq!(write_e(&cw, 0, b"y"), 0);
    assert_eq!(mode(&w), 0o6777, "write by root keeps them");
    chmod(&w, 0o4777);
    // SAFETY: valid C string.
    assert_eq!(as_user(U2, || e(unsafe { libc::truncate(cw.as_ptr(), 1) })), 0);
    assert_eq!(mode(&w), 0o777, "truncate by non-owner clears suid");
    assert_eq!(lstat(&w).st_size, 1);
    chmod(&w, 0o6770);
    assert_eq!(as_user(U1_IN_G3, || open_e(&cw, libc::O_WRONLY | libc::O_TRUNC, 0)), 0);
    assert_eq!(mode(&w), 0o770, "open(O_TRUNC) by non-owner clears suid and sgid");
    assert_eq!(lstat(&w).st_size, 0);
}

pub fn chown_rules(fs: &TestFs) {
    let d = base(fs, "chown", 0o777);
    let f = d.join("f");
    write_file(&f, b"x");
    chown(&f, U1.uid, U1.gid);
    let cf = cs(&f);
    // SAFETY (all below): valid C strings.
    let chown_e = |uid: u32, gid: u32| e(unsafe { libc::chown(cf.as_ptr(), uid, gid) });
    assert_eq!(as_user(U1, || chown_e(U2.uid, u32::MAX)), EPERM, "chown to another uid");
    assert_eq!(as_user(U2, || chown_e(U2.uid, u32::MAX)), EPERM, "chown of another's file");
    assert_eq!(as_user(U1, || chown_e(u32::MAX, G3)), EPERM, "chgrp to a group the owner is not in");
    assert_eq!(as_user(U1, || chown_e(U1.uid, u32::MAX)), 0, "chown to oneself");
    assert_eq!(as_user(U1_IN_G3, || chown_e(u32::MAX, G3)), 0, "chgrp to a member group");
    assert_eq!(lstat(&f).st_gid, G3);
    assert_eq!(as_user(U1, || chown_e(u32::MAX, U1.gid)), 0, "chgrp back to the primary group");
    assert_eq!(as_user(U2, || chown_e(u32::MAX, U2.gid)), EPERM);
    // Root may do anything; -1 leaves a field alone.
    assert_eq!(chown_e(U2.uid, u32::MAX), 0);
    let st = lstat(&f);
    assert_eq!((st.st_uid, st.st_gid), (U2.uid, U1.gid));
    // fchown and lchown.
    // SAFETY: valid C string; the descriptor is closed below.
    let fd = ok(unsafe { libc::open(cf.as_ptr(), O_RDONLY) }, "open for fchown");
    // SAFETY: fd is open.
    ok(unsafe { libc::fchown(fd, 7, 8) }, "fchown");
    // SAFETY: fd is open.
    ok(unsafe { libc::fchmod(fd, 0o640) }, "fchmod");
    // SAFETY: fd is open.
    unsafe { libc::close(fd) };
    let st = lstat(&f);
    assert_eq!((st.st_uid, st.st_gid, st.st_mode & 0o7777), (7, 8, 0o640));
    let l = d.join("l");
    std::os::unix::fs::symlink("f", &l).unwrap();
    chown(&l, 9, 10);
    let (sl, sf) = (lstat(&l), lstat(&f));
    assert_eq!((sl.st_uid, sl.st_gid), (9, 10), "lchown changes the link");
    assert_eq!((sf.st_uid, sf.st_gid), (7, 8), "lchown leaves the target");

    // chown clears suid/sgid of a regular file, also by root.
    chmod(&f, 0o6755);
    chown(&f, 11, 12);
    assert_eq!(mode(&f), 0o755, "chown clears suid and sgid");
    chown(&f, U1.uid, U1.gid);
    chmod(&f, 0o6755);
    assert_eq!(as_user(U1_IN_G3, || chown_e(u32::MAX, G3)), 0);
    assert_eq!(mode(&f), 0o755, "chgrp by the owner clears them too");
    // but not the setgid bit of a directory.
    let sd = d.join("sd");
    mkdir(&sd, 0o2755);
    chmod(&sd, 0o2755);
    chown(&sd, 13, 14);
    assert_eq!(mode(&sd), 0o2755, "chown keeps a directory's setgid");
}

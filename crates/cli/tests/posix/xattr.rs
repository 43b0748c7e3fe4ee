//! Extended attributes: user.*, trusted.*, POSIX ACLs, buffer sizes and errors.

use crate::*;
use libc::{EACCES, EEXIST, ENODATA, EPERM, ERANGE, XATTR_CREATE, XATTR_REPLACE};

fn set(p: &CStr, name: &CStr, v: &[u8], flags: i32) -> i32 {
    // SAFETY: valid C strings and buffer.
    e(unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), flags) })
}

/// getxattr into a buffer of `cap` bytes: the bytes, or errno.
fn get(p: &CStr, name: &CStr, cap: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; cap];
    // SAFETY: valid C strings and buffer of `cap` bytes (null when empty).
    let n = unsafe {
        let ptr = if cap == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
        libc::getxattr(p.as_ptr(), name.as_ptr(), ptr, cap)
    };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(if cap == 0 { 0 } else { n as usize });
    if cap == 0 {
        return Ok(vec![0; n as usize]); // only the size is known
    }
    Ok(buf)
}

fn list(p: &CStr, cap: usize) -> Result<Vec<Vec<u8>>, i32> {
    let mut buf = vec![0u8; cap];
    // SAFETY: valid C string and buffer of `cap` bytes.
    let n = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), cap) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    let mut names: Vec<Vec<u8>> = buf.split(|&b| b == 0).filter(|s| !s.is_empty()).map(<[u8]>::to_vec).collect();
    names.sort();
    Ok(names)
}

pub fn xattrs(fs: &TestFs) {
    let d = base(fs, "xattr", 0o777);
    let f = d.join("f");
    write_file(&f, b"");
    chmod(&f, 0o644);
    let cf = cs(&f);
    let (user, other) = (c"user.color", c"user.size");

    assert_eq!(get(&cf, user, 64), Err(ENODATA), "missing attribute");
    assert_eq!(set(&cf, user, b"blue", XATTR_REPLACE), ENODATA, "XATTR_REPLACE of a missing name");
    assert_eq!(set(&cf, user, b"blue", XATTR_CREATE), 0);
    assert_eq!(set(&cf, user, b"red", XATTR_CREATE), EEXIST, "XATTR_CREATE of an existing name");
    assert_eq!(set(&cf, user, b"green", XATTR_REPLACE), 0);
    assert_eq!(get(&cf, user, 64), Ok(b"green".to_vec()));
    assert_eq!(get(&cf, user, 0).map(|v| v.len()), Ok(5), "size query");
    assert_eq!(get(&cf, user, 4), Err(ERANGE), "short buffer");
    assert_eq!(get(&cf, user, 5), Ok(b"green".to_vec()), "exact buffer");
    // Binary values and the empty value.
    let bin: Vec<u8> = (0..=255u8).collect();
    assert_eq!(set(&cf, other, &bin, 0), 0);
    assert_eq!(get(&cf, other, 1024), Ok(bin));
    let empty = c"user.empty";
    assert_eq!(set(&cf, empty, b"", 0), 0);
    assert_eq!(get(&cf, empty, 8), Ok(Vec::new()));
    // Large values (up to the 64 KiB limit).
    let big = common::random_bytes(7, 65536);
    assert_eq!(set(&cf, c"user.big", &big, 0), 0);
    assert_eq!(get(&cf, c"user.big", 65536), Ok(big));
    // listxattr: the size, ERANGE, the names.
    let want: Vec<Vec<u8>> =
        ["user.big", "user.color", "user.empty", "user.size"].iter().map(|s| s.as_bytes().to_vec()).collect();
    // SAFETY: a null buffer of size 0 asks for the size.
    let need = unsafe { libc::listxattr(cf.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(need as usize, want.iter().map(|n| n.len() + 1).sum::<usize>());
    assert_eq!(list(&cf, need as usize - 1), Err(ERANGE), "listxattr with a short buffer");
    assert_eq!(list(&cf, 4096), Ok(want));
    // removexattr.
    // SAFETY: valid C strings.
    let remove = |n: &CStr| e(unsafe { libc::removexattr(cf.as_ptr(), n.as_ptr()) });
    assert_eq!(remove(user), 0);
    assert_eq!(remove(user), ENODATA, "remove of a missing name");
    assert_eq!(get(&cf, user, 64), Err(ENODATA));
    // Directories carry user attributes; symlinks may not (EPERM, as Linux).
    let cd = cs(&d);
    assert_eq!(set(&cd, user, b"dir", 0), 0);
    assert_eq!(get(&cd, user, 8), Ok(b"dir".to_vec()));
    let sl = d.join("sl");
    std::os::unix::fs::symlink("f", &sl).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = e(unsafe { libc::lsetxattr(cs(&sl).as_ptr(), user.as_ptr(), b"x".as_ptr().cast(), 1, 0) });
    assert_eq!(r, EPERM, "user.* on a symlink");

    // Permissions: user.* follows the file's bits.
    assert_eq!(as_user(U1, || set(&cf, c"user.n", b"x", 0)), EACCES, "user.* set without write permission");
    let mut buf = [0u8; 16];
    let get_nobody = || {
        // SAFETY: valid C strings and buffer.
        e(unsafe { libc::getxattr(cf.as_ptr(), other.as_ptr(), buf.as_mut_ptr().cast(), 0) })
    };
    assert_eq!(as_user(U1, get_nobody), 0, "user.* get with read permission");
    chmod(&f, 0o646);
    assert_eq!(as_user(U1, || set(&cf, c"user.n", b"x", 0)), 0, "user.* set with write permission");

    // trusted.*: root only, and hidden from others' lists.
    let trusted = c"trusted.hivefs";
    assert_eq!(set(&cf, trusted, b"t", 0), 0);
    assert_eq!(get(&cf, trusted, 8), Ok(b"t".to_vec()));
    assert_eq!(as_user(U1, || set(&cf, c"trusted.x", b"x", 0)), EPERM, "trusted.* by a non-root user");
    let mut lbuf = [0u8; 4096];
    // SAFETY: valid C string and buffer.
    let listed = |b: &mut [u8; 4096]| unsafe { libc::listxattr(cf.as_ptr(), b.as_mut_ptr().cast(), 4096) };
    let has_trusted =
        |b: &[u8], n: isize| b[..n.max(0) as usize].split(|&c| c == 0).any(|s| s.starts_with(b"trusted."));
    let n = listed(&mut lbuf);
    assert!(has_trusted(&lbuf, n), "root lists trusted.*");
    let nobody_sees_trusted = as_user(U1, || {
        let n = listed(&mut lbuf);
        if n < 0 {
            errno()
        } else if has_trusted(&lbuf, n) {
            1
        } else {
            0
        }
    });
    assert_eq!(nobody_sees_trusted, 0, "a non-root user does not list trusted.*");
    // Attributes go with the inode: a hard link sees them, unlink of the last link drops them.
    let h = d.join("h");
    std::fs::hard_link(&f, &h).unwrap();
    assert_eq!(get(&cs(&h), trusted, 8), Ok(b"t".to_vec()));
    std::fs::remove_file(&f).unwrap();
    std::fs::remove_file(&h).unwrap();
    write_file(&f, b"");
    assert_eq!(list(&cf, 4096), Ok(Vec::new()), "a new file with an old name has no attributes");
}

/// The ACL xattr blob: version 2, then (tag, perm, id) entries in order.
fn acl_blob(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const UNDEFINED: u32 = u32::MAX;

pub fn posix_acls(fs: &TestFs) {
    let d = base(fs, "acl", 0o755);
    let f = d.join("f");
    write_file(&f, b"");
    chmod(&f, 0o640);
    let acl = c"system.posix_acl_access";
    let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(cmd).args(args).output().unwrap_or_else(|e| {
            panic!("{cmd} is needed (Debian package `acl`/`attr`, see scripts/install-deps.sh): {e}")
        });
        assert!(o.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    run("setfacl", &["-m".as_ref(), "u:65534:rw".as_ref(), f.as_os_str()]);
    let want = acl_blob(&[
        (ACL_USER_OBJ, 6, UNDEFINED),
        (ACL_USER, 6, 65534),
        (ACL_GROUP_OBJ, 4, UNDEFINED),
        (ACL_MASK, 6, UNDEFINED),
        (ACL_OTHER, 0, UNDEFINED),
    ]);
    let cf = cs(&f);
    assert_eq!(get(&cf, acl, 1024), Ok(want.clone()), "the ACL setfacl wrote, byte for byte");
    // getfattr --only-values prints the raw value.
    let raw =
        run("getfattr", &["--only-values".as_ref(), "-n".as_ref(), "system.posix_acl_access".as_ref(), f.as_os_str()]);
    assert_eq!(raw, want, "getfattr reads the same bytes");
    let text = String::from_utf8(run("getfacl", &["-c".as_ref(), f.as_os_str()])).unwrap();
    assert!(text.contains("user:nobody:rw-"), "getfacl shows the entry:\n{text}");
    assert!(text.contains("mask::rw-"), "getfacl shows the mask:\n{text}");
    // A blob set directly reads back identical; short buffers get ERANGE.
    let blob2 = acl_blob(&[
        (ACL_USER_OBJ, 7, UNDEFINED),
        (ACL_USER, 5, 1001),
        (ACL_USER, 4, 65534),
        (ACL_GROUP_OBJ, 0, UNDEFINED),
        (ACL_MASK, 5, UNDEFINED),
        (ACL_OTHER, 0, UNDEFINED),
    ]);
    assert_eq!(set(&cf, acl, &blob2, 0), 0);
    assert_eq!(get(&cf, acl, 1024), Ok(blob2.clone()));
    assert_eq!(get(&cf, acl, blob2.len() - 1), Err(ERANGE));
    // Default ACLs on a directory.
    run("setfacl", &["-d".as_ref(), "-m".as_ref(), "u:1001:rx".as_ref(), d.as_os_str()]);
    let dflt = get(&cs(&d), c"system.posix_acl_default", 1024).expect("default ACL");
    assert_eq!(dflt.len(), 4 + 5 * 8, "default ACL of 5 entries");
    // Removing the ACL attribute.
    run("setfattr", &["-x".as_ref(), "system.posix_acl_access".as_ref(), f.as_os_str()]);
    assert_eq!(get(&cf, acl, 1024), Err(ENODATA), "the ACL is gone");
}

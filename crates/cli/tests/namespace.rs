//! Namespace operations and their errors, with plain system calls on the mount.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;
use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn namespace_operations_and_errors() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let p = |s: &str| fs.path(s);

    // mkdir / create / EEXIST / ENOENT / ENOTDIR / EISDIR.
    std::fs::create_dir(p("d")).unwrap();
    assert_eq!(errno_of(std::fs::create_dir(p("d"))), libc::EEXIST);
    std::fs::write(p("d/f"), b"x").unwrap();
    assert_eq!(errno_of(std::fs::create_dir(p("nope/x"))), libc::ENOENT);
    assert_eq!(errno_of(std::fs::write(p("d/f/x"), b"")), libc::ENOTDIR);
    assert_eq!(errno_of(std::fs::remove_file(p("d"))), libc::EISDIR);
    assert_eq!(errno_of(std::fs::remove_dir(p("d/f"))), libc::ENOTDIR);
    assert_eq!(errno_of(std::fs::remove_dir(p("d"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(std::fs::metadata(p("missing"))), libc::ENOENT);
    // O_EXCL.
    let r = std::fs::OpenOptions::new().write(true).create_new(true).open(p("d/f"));
    assert_eq!(errno_of(r), libc::EEXIST);
    // Names.
    let long = "n".repeat(256);
    assert_eq!(errno_of(std::fs::write(p(&long), b"")), libc::ENAMETOOLONG);
    let ok255 = "m".repeat(255);
    std::fs::write(p(&ok255), b"").unwrap();

    // Directory link counts.
    assert_eq!(std::fs::metadata(p("d")).unwrap().nlink(), 2);
    std::fs::create_dir(p("d/sub")).unwrap();
    assert_eq!(std::fs::metadata(p("d")).unwrap().nlink(), 3);

    // setattr: chmod, chown, truncate, utimes.
    std::fs::set_permissions(p("d/f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(std::fs::metadata(p("d/f")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(p("d/f"), Some(1234), Some(5678)).unwrap();
    let md = std::fs::metadata(p("d/f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let f = std::fs::OpenOptions::new().write(true).open(p("d/f")).unwrap();
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(p("d/f")).unwrap().len(), 10);
    let times = [libc::timespec { tv_sec: 1_000_000, tv_nsec: 5 }, libc::timespec { tv_sec: 2_000_000, tv_nsec: 7 }];
    // SAFETY: valid path and a two-element timespec array.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c(&p("d/f")).as_ptr(), times.as_ptr(), 0) }, 0);
    let md = std::fs::metadata(p("d/f")).unwrap();
    assert_eq!(md.mtime(), 2_000_000);
    assert_eq!(md.atime(), 1_000_000);

    // rename: plain, over an existing file, over an empty dir, errors.
    std::fs::write(p("a"), b"A").unwrap();
    std::fs::write(p("b"), b"B").unwrap();
    std::fs::rename(p("a"), p("b")).unwrap();
    assert_eq!(std::fs::read(p("b")).unwrap(), b"A");
    assert_eq!(errno_of(std::fs::metadata(p("a"))), libc::ENOENT);
    std::fs::create_dir(p("e1")).unwrap();
    std::fs::create_dir(p("e2")).unwrap();
    std::fs::rename(p("e1"), p("e2")).unwrap();
    assert_eq!(errno_of(std::fs::rename(p("b"), p("e2"))), libc::EISDIR);
    assert_eq!(errno_of(std::fs::rename(p("e2"), p("b"))), libc::ENOTDIR);
    assert_eq!(errno_of(std::fs::rename(p("d"), p("e2"))), 0, "rename over an empty dir");
    assert_eq!(errno_of(std::fs::rename(p("e2"), p("e2/sub/x"))), libc::EINVAL);
    std::fs::create_dir(p("full")).unwrap();
    std::fs::write(p("full/x"), b"").unwrap();
    std::fs::create_dir(p("empty")).unwrap();
    assert_eq!(errno_of(std::fs::rename(p("empty"), p("full"))), libc::ENOTEMPTY);
    std::fs::rename(p("e2/f"), p("full/moved")).unwrap();
    assert_eq!(std::fs::read(p("full/moved")).unwrap().len(), 10);

    // symlink / readlink / hard link.
    std::os::unix::fs::symlink("full/moved", p("sl")).unwrap();
    assert_eq!(std::fs::read_link(p("sl")).unwrap(), Path::new("full/moved"));
    assert_eq!(std::fs::read(p("sl")).unwrap().len(), 10);
    assert_eq!(errno_of(std::os::unix::fs::symlink("x", p("sl"))), libc::EEXIST);
    std::fs::hard_link(p("full/moved"), p("hl")).unwrap();
    assert_eq!(std::fs::metadata(p("hl")).unwrap().nlink(), 2);
    std::fs::remove_file(p("full/moved")).unwrap();
    assert_eq!(std::fs::metadata(p("hl")).unwrap().nlink(), 1);
    assert_eq!(std::fs::read(p("hl")).unwrap().len(), 10);
    assert_eq!(errno_of(std::fs::hard_link(p("full"), p("dirlink"))), libc::EPERM);

    // xattrs.
    let path = c(&p("hl"));
    let name = CString::new("user.test").unwrap();
    // SAFETY: valid C strings and buffers of the given lengths.
    unsafe {
        assert_eq!(libc::setxattr(path.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0), 0);
        assert_eq!(libc::setxattr(path.as_ptr(), name.as_ptr(), b"v2".as_ptr().cast(), 2, libc::XATTR_CREATE), -1);
        assert_eq!(last_errno(), libc::EEXIST);
        let mut buf = [0u8; 16];
        assert_eq!(libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16), 2);
        assert_eq!(&buf[..2], b"v1");
        let mut list = [0u8; 64];
        let n = libc::listxattr(path.as_ptr(), list.as_mut_ptr().cast(), 64);
        assert_eq!(&list[..n as usize], b"user.test\0");
        assert_eq!(libc::removexattr(path.as_ptr(), name.as_ptr()), 0);
        assert_eq!(libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16), -1);
        assert_eq!(last_errno(), libc::ENODATA);
    }

    // mknod of a FIFO.
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(c(&p("fifo")).as_ptr(), 0o644) }, 0);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&std::fs::symlink_metadata(p("fifo")).unwrap().file_type()));

    // statfs reports the targets' space.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c(&fs.mnt).as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bfree > 0);

    // rmdir.
    std::fs::remove_dir(p("empty")).unwrap();
    assert_eq!(errno_of(std::fs::metadata(p("empty"))), libc::ENOENT);
}

#[test]
fn large_directory_lists_completely() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let d = fs.path("big");
    std::fs::create_dir(&d).unwrap();
    let n = 3000;
    for i in 0..n {
        std::fs::File::create(d.join(format!("file-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> =
        std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let want: Vec<String> = (0..n).map(|i| format!("file-{i:05}")).collect();
    assert_eq!(names, want);
}

#[test]
fn permissions_are_enforced_for_other_users() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let p = fs.path("private");
    std::fs::write(&p, b"secret").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(fs.path("public"), b"hello").unwrap();
    std::fs::set_permissions(fs.path("public"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&fs.mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
    // As user "nobody" (65534): allow_other lets it in, default_permissions checks the bits.
    let run = |cmd: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd])
            .output()
            .unwrap()
    };
    let o = run(&format!("cat {}", fs.path("public").display()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, b"hello");
    let o = run(&format!("cat {}", p.display()));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));
    let o = run(&format!("touch {}", fs.path("newfile").display()));
    assert!(!o.status.success(), "nobody must not create files in a 0755 root-owned dir");
}

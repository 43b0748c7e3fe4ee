//! open flags, rename, link counts, symlinks, name and path limits, special files.

use crate::*;
use libc::{
    EEXIST, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENOENT, ENOTDIR, ENOTEMPTY, EPERM, O_APPEND, O_CREAT, O_DIRECTORY,
    O_EXCL, O_NOFOLLOW, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY,
};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn rename2(a: &Path, b: &Path, flags: u32) -> i32 {
    // SAFETY: valid C strings.
    e(unsafe { libc::renameat2(libc::AT_FDCWD, cs(a).as_ptr(), libc::AT_FDCWD, cs(b).as_ptr(), flags) })
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

pub fn open_flags(fs: &TestFs) {
    let d = base(fs, "open", 0o755);
    let f = d.join("f");
    let cf = cs(&f);
    write_file(&f, b"abc");

    // O_APPEND: every write goes to the end, whatever the offset.
    // SAFETY (below): valid C strings, buffers and descriptors.
    unsafe {
        let fd = ok(libc::open(cf.as_ptr(), O_WRONLY | O_APPEND), "open O_APPEND");
        ok(libc::write(fd, b"def".as_ptr().cast(), 3), "append");
        ok(libc::lseek(fd, 0, libc::SEEK_SET), "lseek");
        ok(libc::write(fd, b"gh".as_ptr().cast(), 2), "append after seek");
        ok(libc::pwrite(fd, b"i".as_ptr().cast(), 1, 0), "pwrite with O_APPEND");
        libc::close(fd);
    }
    assert_eq!(read(&f), b"abcdefghi", "O_APPEND writes at the end (pwrite too, as Linux)");
    // Another descriptor appending after a plain write extended the file.
    // SAFETY: as above.
    unsafe {
        let a = ok(libc::open(cf.as_ptr(), O_WRONLY | O_APPEND), "open O_APPEND");
        let w = ok(libc::open(cf.as_ptr(), O_WRONLY), "open");
        ok(libc::pwrite(w, b"XY".as_ptr().cast(), 2, 9), "pwrite at end");
        ok(libc::write(a, b"Z".as_ptr().cast(), 1), "append");
        libc::close(a);
        libc::close(w);
    }
    assert_eq!(read(&f), b"abcdefghiXYZ");

    // O_CREAT|O_EXCL on an existing entry (file, directory, dangling symlink).
    assert_eq!(open_e(&cf, O_CREAT | O_EXCL | O_WRONLY, 0o644), EEXIST);
    assert_eq!(open_e(&cs(&d), O_CREAT | O_EXCL | O_RDONLY, 0o644), EEXIST);
    let dangling = d.join("dangling");
    std::os::unix::fs::symlink("nowhere", &dangling).unwrap();
    assert_eq!(open_e(&cs(&dangling), O_CREAT | O_EXCL | O_WRONLY, 0o644), EEXIST, "O_EXCL on a dangling link");
    assert!(!exists(&d.join("nowhere")));
    // O_CREAT without O_EXCL follows a dangling symlink and creates its target.
    assert_eq!(open_e(&cs(&dangling), O_CREAT | O_WRONLY, 0o600), 0);
    assert_eq!(mode(&d.join("nowhere")), 0o600);
    // O_CREAT on an existing file opens it unchanged (mode and content).
    chmod(&f, 0o640);
    assert_eq!(open_e(&cf, O_CREAT | O_RDWR, 0o777), 0);
    assert_eq!((mode(&f), read(&f)), (0o640, b"abcdefghiXYZ".to_vec()));
    // O_CREAT on a directory.
    assert_eq!(open_e(&cs(&d), O_CREAT | O_WRONLY, 0o644), EISDIR);
    assert_eq!(open_e(&cs(&d), O_RDWR, 0), EISDIR, "write open of a directory");
    // O_TRUNC empties; O_TRUNC with O_RDONLY is unspecified, not tested.
    assert_eq!(open_e(&cf, O_TRUNC | O_WRONLY, 0), 0);
    assert_eq!(lstat(&f).st_size, 0, "O_TRUNC");
    write_file(&f, b"again");
    assert_eq!(read(&f), b"again");
    // O_DIRECTORY and O_NOFOLLOW.
    assert_eq!(open_e(&cf, O_DIRECTORY | O_RDONLY, 0), ENOTDIR);
    assert_eq!(open_e(&cs(&d), O_DIRECTORY | O_RDONLY, 0), 0);
    let sl = d.join("sl");
    std::os::unix::fs::symlink("f", &sl).unwrap();
    assert_eq!(open_e(&cs(&sl), O_NOFOLLOW | O_RDONLY, 0), ELOOP);
    assert_eq!(open_e(&cs(&sl), O_RDONLY, 0), 0);
    assert_eq!(open_e(&cs(&sl), O_NOFOLLOW | libc::O_PATH, 0), 0, "O_PATH|O_NOFOLLOW opens the link");
    // Opening a missing file, or below a file.
    assert_eq!(open_e(&cs(&d.join("missing")), O_RDONLY, 0), ENOENT);
    assert_eq!(open_e(&cs(&f.join("x")), O_CREAT | O_WRONLY, 0o644), ENOTDIR);

    // truncate, unlink and rmdir on the wrong kind of entry.
    // SAFETY (below): valid C strings and descriptors.
    unsafe {
        assert_eq!(e(libc::truncate(cs(&d).as_ptr(), 0)), EISDIR, "truncate of a directory");
        assert_eq!(e(libc::truncate(cf.as_ptr(), -1)), EINVAL, "negative length");
        let fd = ok(libc::open(cf.as_ptr(), O_RDONLY), "open");
        assert_eq!(e(libc::ftruncate(fd, 0)), EINVAL, "ftruncate of a read-only descriptor");
        libc::close(fd);
        assert_eq!(e(libc::unlink(cs(&d).as_ptr())), EISDIR, "unlink of a directory");
        assert_eq!(e(libc::rmdir(cf.as_ptr())), ENOTDIR, "rmdir of a file");
        assert_eq!(e(libc::rmdir(cs(&fs.mnt.join("open")).as_ptr())), ENOTEMPTY, "rmdir of a non-empty directory");
        assert_eq!(e(libc::rmdir(cs(&d.join(".")).as_ptr())), EINVAL, "rmdir of \".\"");
        assert_eq!(e(libc::mkdir(cf.as_ptr(), 0o755)), EEXIST, "mkdir over a file");
    }
    assert_eq!(read(&f), b"again", "the file survived every refused call");
}

pub fn renames(fs: &TestFs) {
    let d = base(fs, "ren", 0o755);
    let p = |s: &str| d.join(s);
    // Over an existing file: the target's inode loses its name.
    write_file(&p("a"), b"A");
    write_file(&p("b"), b"B");
    let ino_a = lstat(&p("a")).st_ino;
    assert_eq!(rename2(&p("a"), &p("b"), 0), 0);
    assert_eq!((read(&p("b")), lstat(&p("b")).st_ino), (b"A".to_vec(), ino_a));
    assert!(!exists(&p("a")));
    // Over an existing file that has another link: that link stays.
    write_file(&p("c"), b"C");
    std::fs::hard_link(p("c"), p("c2")).unwrap();
    assert_eq!(rename2(&p("b"), &p("c"), 0), 0);
    assert_eq!((read(&p("c2")), lstat(&p("c2")).st_nlink), (b"C".to_vec(), 1));
    // Two links of one inode: nothing happens, both names stay.
    std::fs::hard_link(p("c2"), p("c3")).unwrap();
    assert_eq!(rename2(&p("c2"), &p("c3"), 0), 0);
    assert!(exists(&p("c2")) && exists(&p("c3")));
    assert_eq!(rename2(&p("c2"), &p("c2"), 0), 0, "rename onto itself");
    // Directories.
    for n in ["d1", "d2", "full", "sub"] {
        mkdir(&p(n), 0o755);
    }
    write_file(&p("full/x"), b"");
    assert_eq!(rename2(&p("d1"), &p("d2"), 0), 0, "dir over empty dir");
    assert!(!exists(&p("d1")));
    let r = rename2(&p("d2"), &p("full"), 0);
    assert!(r == ENOTEMPTY || r == libc::EEXIST, "dir over non-empty dir: {r}");
    assert_eq!(rename2(&p("c3"), &p("d2"), 0), EISDIR, "file over dir");
    assert_eq!(rename2(&p("d2"), &p("c3"), 0), ENOTDIR, "dir over file");
    mkdir(&p("d2/inner"), 0o755);
    assert_eq!(rename2(&p("d2"), &p("d2/inner/x"), 0), EINVAL, "dir into its own subtree");
    assert_eq!(rename2(&p("d2"), &p("d2/x"), 0), EINVAL, "dir into itself");
    assert_eq!(rename2(&p("missing"), &p("x"), 0), ENOENT);
    assert_eq!(rename2(&p("c3"), &p("missing/x"), 0), ENOENT);
    assert_eq!(rename2(&p("c3"), &p("c2/x"), 0), ENOTDIR);
    // A moved directory's ".." follows it.
    assert_eq!(rename2(&p("d2/inner"), &p("sub/inner"), 0), 0);
    assert_eq!(lstat(&p("sub/inner/..")).st_ino, lstat(&p("sub")).st_ino);

    // RENAME_NOREPLACE.
    assert_eq!(rename2(&p("c3"), &p("c2"), libc::RENAME_NOREPLACE), EEXIST);
    assert_eq!(rename2(&p("c3"), &p("new"), libc::RENAME_NOREPLACE), 0);
    assert!(exists(&p("new")) && !exists(&p("c3")));
    assert_eq!(rename2(&p("new"), &p("x"), libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE), EINVAL);

    // RENAME_EXCHANGE: two files in one directory.
    write_file(&p("e1"), b"one");
    write_file(&p("e2"), b"two!");
    let (i1, i2) = (lstat(&p("e1")).st_ino, lstat(&p("e2")).st_ino);
    let (pb, cb) = (lstat(&d), lstat(&p("e1")));
    assert_eq!(rename2(&p("e1"), &p("e2"), libc::RENAME_EXCHANGE), 0);
    assert_eq!((read(&p("e1")), read(&p("e2"))), (b"two!".to_vec(), b"one".to_vec()));
    assert_eq!((lstat(&p("e1")).st_ino, lstat(&p("e2")).st_ino), (i2, i1));
    assert!(ctime(&lstat(&d)) > ctime(&pb), "exchange: parent ctime");
    assert!(ctime(&lstat(&p("e2"))) > ctime(&cb), "exchange: ctime of an exchanged inode");
    assert_eq!(rename2(&p("e1"), &p("none"), libc::RENAME_EXCHANGE), ENOENT, "exchange with a missing name");
    // A directory and a file across directories: link counts and ".." follow.
    mkdir(&p("x1"), 0o755);
    mkdir(&p("x2"), 0o755);
    mkdir(&p("x1/dir"), 0o755);
    write_file(&p("x1/dir/in"), b"in");
    write_file(&p("x2/file"), b"file");
    let (n1, n2) = (lstat(&p("x1")).st_nlink, lstat(&p("x2")).st_nlink);
    assert_eq!((n1, n2), (3, 2));
    assert_eq!(rename2(&p("x1/dir"), &p("x2/file"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(read(&p("x2/file/in")), b"in");
    assert_eq!(read(&p("x1/dir")), b"file");
    assert_eq!((lstat(&p("x1")).st_nlink, lstat(&p("x2")).st_nlink), (2, 3));
    assert_eq!(lstat(&p("x2/file/..")).st_ino, lstat(&p("x2")).st_ino);
    // Two directories (a non-empty one too: exchange replaces nothing).
    mkdir(&p("x1/d"), 0o755);
    assert_eq!(rename2(&p("x1/d"), &p("x2/file"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(read(&p("x1/d/in")), b"in");
    assert_eq!((lstat(&p("x1")).st_nlink, lstat(&p("x2")).st_nlink), (3, 3));
    // An ancestor with a descendant: EINVAL either way.
    mkdir(&p("x1/d/deep"), 0o755);
    assert_eq!(rename2(&p("x1"), &p("x1/d/deep"), libc::RENAME_EXCHANGE), EINVAL);
    assert_eq!(rename2(&p("x1/d/deep"), &p("x1"), libc::RENAME_EXCHANGE), EINVAL);
    assert_eq!(rename2(&p("x1/d"), &p("x1/d"), libc::RENAME_EXCHANGE), 0, "exchange with itself");

    // Across directories a renamed file keeps its content and inode.
    write_file(&p("x1/moving"), b"m");
    let ino = lstat(&p("x1/moving")).st_ino;
    assert_eq!(rename2(&p("x1/moving"), &p("x2/moved"), 0), 0);
    assert_eq!((read(&p("x2/moved")), lstat(&p("x2/moved")).st_ino), (b"m".to_vec(), ino));
}

pub fn link_counts(fs: &TestFs) {
    let d = base(fs, "nlink", 0o755);
    let nl = |p: &Path| lstat(p).st_nlink;
    assert_eq!(nl(&d), 2, "empty directory");
    for i in 0..3 {
        mkdir(&d.join(format!("s{i}")), 0o755);
    }
    write_file(&d.join("f"), b"");
    assert_eq!(nl(&d), 5, "2 + three subdirectories (files do not count)");
    // SAFETY: valid C string.
    ok(unsafe { libc::rmdir(cs(&d.join("s2")).as_ptr()) }, "rmdir");
    assert_eq!(nl(&d), 4);
    std::fs::rename(d.join("s1"), d.join("s0/s1")).unwrap();
    assert_eq!((nl(&d), nl(&d.join("s0"))), (3, 3), "moving a subdirectory moves its link");
    // Files.
    let f = d.join("f");
    assert_eq!(nl(&f), 1);
    std::fs::hard_link(&f, d.join("s0/l1")).unwrap();
    std::fs::hard_link(&f, d.join("l2")).unwrap();
    assert_eq!(nl(&f), 3);
    assert_eq!(lstat(&d.join("s0/l1")).st_ino, lstat(&f).st_ino);
    std::fs::remove_file(d.join("l2")).unwrap();
    assert_eq!(nl(&d.join("s0/l1")), 2);
    // An open file keeps its data after its last name goes; fstat shows nlink 0.
    let file = std::fs::File::open(&f).unwrap();
    std::fs::remove_file(&f).unwrap();
    std::fs::remove_file(d.join("s0/l1")).unwrap();
    assert_eq!(file.metadata().unwrap().nlink(), 0, "fstat of an unlinked open file");
    drop(file);
    // Errors.
    assert_eq!(errno_of(std::fs::hard_link(d.join("s0"), d.join("dl"))), EPERM, "link of a directory");
    assert_eq!(errno_of(std::fs::hard_link(d.join("gone"), d.join("x"))), ENOENT);
    write_file(&d.join("g"), b"");
    assert_eq!(errno_of(std::fs::hard_link(d.join("g"), d.join("s0"))), EEXIST);
    // A link to a symlink names the link itself (linkat without AT_SYMLINK_FOLLOW).
    std::os::unix::fs::symlink("g", d.join("sl")).unwrap();
    // SAFETY: valid C strings.
    ok(
        unsafe {
            libc::linkat(libc::AT_FDCWD, cs(&d.join("sl")).as_ptr(), libc::AT_FDCWD, cs(&d.join("sl2")).as_ptr(), 0)
        },
        "linkat of a symlink",
    );
    assert_eq!(std::fs::read_link(d.join("sl2")).unwrap(), Path::new("g"));
    assert_eq!(nl(&d.join("sl")), 2);
}

pub fn symlinks(fs: &TestFs) {
    let d = base(fs, "sym", 0o755);
    let p = |s: &str| d.join(s);
    // Loops: a -> b -> a, and a link to itself.
    std::os::unix::fs::symlink("b", p("a")).unwrap();
    std::os::unix::fs::symlink("a", p("b")).unwrap();
    std::os::unix::fs::symlink("self", p("self")).unwrap();
    assert_eq!(open_e(&cs(&p("a")), O_RDONLY, 0), ELOOP);
    assert_eq!(open_e(&cs(&p("self")), O_RDONLY, 0), ELOOP);
    assert_eq!(errno_of(std::fs::metadata(p("a"))), ELOOP, "stat follows into the loop");
    assert!(std::fs::symlink_metadata(p("a")).unwrap().file_type().is_symlink());
    assert_eq!(errno_of(std::fs::read_dir(p("a/x"))), ELOOP);
    // A chain of 40 links resolves, 41 do not (the kernel's limit).
    write_file(&p("end"), b"end");
    let mut prev = "end".to_string();
    for i in 0..41 {
        let n = format!("chain{i}");
        std::os::unix::fs::symlink(&prev, p(&n)).unwrap();
        prev = n;
    }
    assert_eq!(read(&p("chain39")), b"end", "40 links in a row");
    assert_eq!(open_e(&cs(&p("chain40")), O_RDONLY, 0), ELOOP, "41 links in a row");

    // The longest target (PATH_MAX - 1 bytes) round-trips; PATH_MAX is refused.
    let long: String = (0..4095).map(|i| if i % 100 == 99 { '/' } else { 'x' }).collect();
    std::os::unix::fs::symlink(&long, p("long")).unwrap();
    let md = std::fs::symlink_metadata(p("long")).unwrap();
    assert_eq!(md.len(), 4095, "a symlink's size is its target's length");
    assert_eq!(std::fs::read_link(p("long")).unwrap().as_os_str().as_bytes(), long.as_bytes());
    let too_long = "y".repeat(4096);
    assert_eq!(errno_of(std::os::unix::fs::symlink(&too_long, p("toolong"))), ENAMETOOLONG);
    assert_eq!(errno_of(std::os::unix::fs::symlink("", p("empty"))), ENOENT, "empty target");
    // readlink: a short buffer truncates without NUL; non-links are EINVAL.
    let mut buf = [0u8; 10];
    // SAFETY: valid C string and buffer.
    let n = unsafe { libc::readlink(cs(&p("long")).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!((n, &buf[..]), (10, b"xxxxxxxxxx".as_slice()));
    // SAFETY: as above.
    let n = unsafe { libc::readlink(cs(&p("end")).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!((n, errno()), (-1, EINVAL), "readlink of a regular file");
    // SAFETY: as above.
    let n = unsafe { libc::readlink(cs(&d).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!((n, errno()), (-1, EINVAL), "readlink of a directory");
    // Symlink mode is 0777; an absolute target through the mount works.
    assert_eq!(mode(&p("a")), 0o777);
    std::os::unix::fs::symlink(p("end"), p("abs")).unwrap();
    assert_eq!(read(&p("abs")), b"end");
    // A trailing slash makes a link to a directory resolve, to a file fail.
    mkdir(&p("dir"), 0o755);
    std::os::unix::fs::symlink("dir", p("dl")).unwrap();
    assert!(std::fs::metadata(p("dl/")).unwrap().is_dir());
    assert_eq!(errno_of(std::fs::metadata(d.join("abs/"))), ENOTDIR);
}

pub fn name_and_path_limits(fs: &TestFs) {
    let d = base(fs, "names", 0o755);
    let n255 = "a".repeat(255);
    let n256 = "b".repeat(256);
    write_file(&d.join(&n255), b"x");
    assert_eq!(read(&d.join(&n255)), b"x");
    assert_eq!(open_e(&cs(&d.join(&n256)), O_CREAT | O_WRONLY, 0o644), ENAMETOOLONG, "create, 256 bytes");
    assert_eq!(errno_of(std::fs::metadata(d.join(&n256))), ENAMETOOLONG, "lookup, 256 bytes");
    let m255 = "m".repeat(255);
    mkdir(&d.join(&m255), 0o755);
    assert_eq!(errno_of(std::fs::create_dir(d.join(&n256))), ENAMETOOLONG, "mkdir, 256 bytes");
    let s255 = "s".repeat(255);
    std::os::unix::fs::symlink(&n255, d.join(&s255)).unwrap();
    assert_eq!(errno_of(std::os::unix::fs::symlink("t", d.join(&n256))), ENAMETOOLONG, "symlink, 256 bytes");
    let l255 = "l".repeat(255);
    std::fs::hard_link(d.join(&n255), d.join(&l255)).unwrap();
    assert_eq!(errno_of(std::fs::hard_link(d.join(&n255), d.join(&n256))), ENAMETOOLONG, "link, 256 bytes");
    let r255 = "r".repeat(255);
    std::fs::rename(d.join(&l255), d.join(&r255)).unwrap();
    assert_eq!(rename2(&d.join(&r255), &d.join(&n256), 0), ENAMETOOLONG, "rename, 256 bytes");
    let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 4);
    assert!(names.iter().all(|n| n.len() == 255));
    // Non-ASCII, arbitrary bytes are names too.
    let odd = std::ffi::OsStr::from_bytes(b"\xff\xfe caf\xc3\xa9 \t\n");
    write_file(&d.join(odd), b"odd");
    assert_eq!(read(&d.join(odd)), b"odd");

    // Paths: nest 200-byte directories until the absolute path nears PATH_MAX.
    let mut deep = d.clone();
    let comp = "p".repeat(200);
    while deep.as_os_str().len() + 201 < 4000 {
        deep.push(&comp);
        mkdir(&deep, 0o755);
    }
    // A file whose absolute path is 4095 bytes works; 4096 bytes is ENAMETOOLONG.
    let fill = 4095 - deep.as_os_str().len() - 1;
    let ok_path = deep.join("f".repeat(fill));
    assert_eq!(ok_path.as_os_str().len(), 4095);
    write_file(&ok_path, b"deep");
    assert_eq!(read(&ok_path), b"deep");
    let long_path = deep.join("g".repeat(fill + 1));
    assert_eq!(long_path.as_os_str().len(), 4096);
    assert_eq!(open_e(&cs(&long_path), O_CREAT | O_WRONLY, 0o644), ENAMETOOLONG, "path of 4096 bytes");
}

pub fn special_files(fs: &TestFs) {
    let d = base(fs, "special", 0o777);
    let fifo = d.join("fifo");
    let cfifo = cs(&fifo);
    // SAFETY: valid C string.
    ok(unsafe { libc::mknod(cfifo.as_ptr(), libc::S_IFIFO | 0o666, 0) }, "mknod S_IFIFO");
    let md = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o7777, 0o666);
    // Two processes: a child (as another user) writes, this process reads.
    // SAFETY: the child only makes system calls and exits with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let fd = libc::open(cfifo.as_ptr(), O_WRONLY);
            let ok = fd >= 0 && libc::write(fd, b"through the fifo".as_ptr().cast(), 16) == 16;
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    let got = std::fs::read(&fifo).unwrap();
    let mut status = 0;
    // SAFETY: pid is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "fifo writer failed");
    assert_eq!(got, b"through the fifo");
    // SAFETY: valid C string.
    assert_eq!(e(unsafe { libc::mkfifo(cfifo.as_ptr(), 0o644) }), EEXIST);

    // Sockets: mknod, and a real listening socket bound on the mount.
    let sock = d.join("sock");
    // SAFETY: valid C string.
    ok(unsafe { libc::mknod(cs(&sock).as_ptr(), libc::S_IFSOCK | 0o600, 0) }, "mknod S_IFSOCK");
    assert!(std::fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
    let bound = d.join("listener");
    let listener = std::os::unix::net::UnixListener::bind(&bound).unwrap();
    assert!(std::fs::symlink_metadata(&bound).unwrap().file_type().is_socket());
    let mut client = std::os::unix::net::UnixStream::connect(&bound).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    std::io::Write::write_all(&mut client, b"ping").unwrap();
    let mut buf = [0u8; 4];
    std::io::Read::read_exact(&mut server, &mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    // Device nodes: root only.
    let chr = d.join("null");
    let dev = libc::makedev(1, 3);
    // SAFETY: valid C string.
    ok(unsafe { libc::mknod(cs(&chr).as_ptr(), libc::S_IFCHR | 0o666, dev) }, "mknod S_IFCHR");
    let md = std::fs::symlink_metadata(&chr).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), dev);
    let blk = d.join("blk");
    let bdev = libc::makedev(7, 200);
    // SAFETY: valid C string.
    ok(unsafe { libc::mknod(cs(&blk).as_ptr(), libc::S_IFBLK | 0o600, bdev) }, "mknod S_IFBLK");
    let md = std::fs::symlink_metadata(&blk).unwrap();
    assert!(md.file_type().is_block_device());
    assert_eq!(md.rdev(), bdev);
    let cnot = cs(&d.join("notallowed"));
    // SAFETY: valid C string.
    let r = as_user(U1, || e(unsafe { libc::mknod(cnot.as_ptr(), libc::S_IFCHR | 0o666, dev) }));
    assert_eq!(r, EPERM, "mknod of a device by a non-root user");
    // mknod of an existing name.
    // SAFETY: valid C string.
    assert_eq!(e(unsafe { libc::mknod(cs(&chr).as_ptr(), libc::S_IFIFO | 0o644, 0) }), EEXIST);
    // Special files are listed with their type.
    let mut kinds: Vec<(String, bool)> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.file_type().unwrap().is_socket())
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [("blk", false), ("fifo", false), ("listener", true), ("null", false), ("sock", true)]
            .map(|(n, s)| (n.to_string(), s))
    );
}

/// What the calls on a directory held open after it lost its name give:
/// (fstat ok, nlink, is a directory, fchmod, mode after it, create inside,
/// list it, a shell whose cwd it is: `stat -c %h .`).
fn held_after_removal(root: &Path, replace: bool) -> (i32, u64, bool, i32, u32, i32, i32, String) {
    let d = root.join("held");
    mkdir(&d, 0o755);
    chmod(&d, 0o755);
    let c = cs(&d);
    // SAFETY: valid C string.
    let fd = ok(unsafe { libc::open(c.as_ptr(), O_RDONLY | O_DIRECTORY | libc::O_CLOEXEC) }, "open held");
    // A shell waits in the directory until it is gone, then reports its links.
    let gone = root.join("gone");
    let script = format!("cd {} && while [ ! -e {} ]; do sleep 0.02; done; stat -c %h .", d.display(), gone.display());
    let sh =
        std::process::Command::new("sh").args(["-c", &script]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    if replace {
        let other = root.join("other");
        mkdir(&other, 0o755);
        assert_eq!(rename2(&other, &d, 0), 0, "rename {} over {}", other.display(), d.display());
    } else {
        // SAFETY: valid C string.
        ok(unsafe { libc::rmdir(c.as_ptr()) }, "rmdir held");
    }
    write_file(&gone, b"");
    let cwd_links = String::from_utf8_lossy(&sh.wait_with_output().unwrap().stdout).trim().to_string();
    // Past the kernel's attribute cache: fstat asks the file system.
    std::thread::sleep(hivefs_fuse::DIR_ATTR_TTL + std::time::Duration::from_millis(200));
    // SAFETY: zeroed stat is a valid out buffer; fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let stat_e = e(unsafe { libc::fstat(fd, &mut st) });
    // SAFETY: fd is open.
    let chmod_e = e(unsafe { libc::fchmod(fd, 0o700) });
    let mut st2: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(fd, &mut st2) };
    let name = CString::new("x").unwrap();
    // SAFETY: fd is a directory descriptor, valid C string.
    let create_e = e(unsafe { libc::openat(fd, name.as_ptr(), O_CREAT | O_WRONLY | libc::O_CLOEXEC, 0o644) });
    let mut buf = [0u8; 4096];
    // SAFETY: fd is open, buf is writable.
    let list_e = e(unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) });
    // SAFETY: fd is open.
    unsafe { libc::close(fd) };
    std::fs::remove_file(&gone).unwrap();
    if replace {
        std::fs::remove_dir(&d).unwrap();
    }
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    (stat_e, st.st_nlink, is_dir, chmod_e, st2.st_mode & 0o7777, create_e, list_e, cwd_links)
}

/// A directory held open (a descriptor, a current directory) and then
/// removed by rmdir or replaced by rename answers as it does on Linux's
/// local file systems: fstat and fchmod work, it has no links, nothing can
/// be created in it and listing it fails.
pub fn removed_open_directories(fs: &TestFs) {
    let local = tempfile::tempdir().unwrap();
    for replace in [false, true] {
        let on_mount = held_after_removal(&base(fs, &format!("held-{replace}"), 0o755), replace);
        let on_disk = held_after_removal(local.path(), replace);
        assert_eq!(on_mount, on_disk, "replaced by rename: {replace}");
        assert_eq!(on_mount.0, 0, "fstat of a removed open directory");
        assert_eq!((on_mount.1, on_mount.4, on_mount.5), (0, 0o700, ENOENT), "{on_mount:?}");
        assert_eq!(on_mount.7, "0", "the shell's current directory has no links");
    }
}

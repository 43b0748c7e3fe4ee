//! NFS re-export of a HiveFS mount, as BeeGFS mounts are re-exported. This
//! kernel has no NFS server or client, so the user-space server NFS-Ganesha
//! (its VFS backend works through name_to_handle_at/open_by_handle_at on
//! the mount) runs on one test-bed host and the user-space client tools of
//! libnfs on another. Files go both ways, also after the exporting machine's
//! kernel forgot the mount's inodes: the server then reopens them by handle.

mod common;

use common::*;
use hivefs_testbed::{Host, Testbed};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// NFSv4 only (no rpcbind); libnfs 4.0 writes at most 3940 bytes per file over NFSv4.
fn ganesha_conf(bind: &str, export: &Path, work: &Path) -> String {
    let w = work.display();
    format!(
        "NFS_CORE_PARAM {{ Protocols = 4; NFS_Port = 2049; Bind_addr = {bind}; Enable_NLM = false;
  Enable_RQUOTA = false; Enable_UDP = false; Plugins_Dir = /usr/lib/x86_64-linux-gnu/ganesha; }}
NFS_KRB5 {{ Active_krb5 = false; CCacheDir = {w}/ccache; }}
NFSv4 {{ Graceless = true; Lease_Lifetime = 10; RecoveryBackend = fs; RecoveryRoot = {w}/recov;
  Only_Numeric_Owners = true; }}
MDCACHE {{ FD_LWMark_Percent = 0; LRU_Run_Interval = 1; }}
EXPORT {{ Export_Id = 1; Path = {}; Pseudo = /hive; Protocols = 4; Transports = TCP;
  Access_Type = RW; Squash = No_Root_Squash; SecType = sys; Attr_Expiration_Time = 0;
  FSAL {{ Name = VFS; }} }}
LOG {{ Default_Log_Level = EVENT; }}
",
        export.display()
    )
}

fn run_on(host: &Host, program: &str, args: &[&str]) -> Output {
    host.command(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn ok_on(host: &Host, program: &str, args: &[&str]) -> Vec<u8> {
    let o = run_on(host, program, args);
    assert!(o.status.success(), "{program} {args:?} on {}: {}", host.name, String::from_utf8_lossy(&o.stderr));
    o.stdout
}

fn drop_caches() {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (needs root)");
}

#[test]
fn nfs_ganesha_reexports_the_mount_through_file_handles() {
    for tool in ["ganesha.nfsd", "nfs-cp", "nfs-cat", "nfs-ls"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
        assert!(found.status.success(), "{tool} is missing: scripts/install-deps.sh installs it");
    }
    let fs = TestFs::up(&["--meta", "2"]);
    std::fs::create_dir(fs.path("d")).unwrap();
    let small = random_bytes(31, 2000);
    let big = random_bytes(32, 5 << 20);
    std::fs::write(fs.path("d/small"), &small).unwrap();
    std::fs::write(fs.path("d/big"), &big).unwrap();

    let tb = Testbed::new("nfs").expect("test bed (needs root)");
    let (server, client) = (tb.add_host("nfsd").unwrap(), tb.add_host("nfscl").unwrap());
    let work = fs.tmp.path().join("ganesha");
    for d in ["recov", "ccache"] {
        std::fs::create_dir_all(work.join(d)).unwrap();
    }
    let conf = work.join("ganesha.conf");
    std::fs::write(&conf, ganesha_conf(&server.ip.to_string(), &fs.mnt, &work)).unwrap();
    let mut cmd = server.command("ganesha.nfsd");
    cmd.arg("-F").arg("-f").arg(&conf).arg("-L").arg(work.join("ganesha.log"));
    cmd.arg("-p").arg(work.join("ganesha.pid")).args(["-N", "NIV_EVENT"]);
    let out = std::fs::File::create(work.join("ganesha.out")).unwrap();
    cmd.stdin(std::process::Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
    let pid = tb.spawn("ganesha", cmd).expect("start ganesha");
    let url = |p: &str| format!("nfs://{}/hive/{p}?version=4&nfsport=2049", server.ip);
    let log = || std::fs::read_to_string(work.join("ganesha.log")).unwrap_or_default();
    let start = Instant::now();
    while !run_on(&client, "nfs-ls", &[&url("")]).status.success() {
        assert!(tb.running(pid), "ganesha exited:\n{}", log());
        assert!(start.elapsed() < Duration::from_secs(30), "ganesha does not answer:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }

    // Reads and a write through NFS, checked on the mount.
    let listing = String::from_utf8(ok_on(&client, "nfs-ls", &[&url("d")])).unwrap();
    assert!(listing.contains("small") && listing.contains("big"), "{listing}");
    assert!(ok_on(&client, "nfs-cat", &[&url("d/small")]) == small);
    let local = fs.tmp.path().join("from-nfs");
    ok_on(&client, "nfs-cp", &[&url("d/big"), local.to_str().unwrap()]);
    assert!(std::fs::read(&local).unwrap() == big);
    let upload = fs.tmp.path().join("upload");
    let sent = random_bytes(33, 3000);
    std::fs::write(&upload, &sent).unwrap();
    ok_on(&client, "nfs-cp", &[upload.to_str().unwrap(), &url("d/written")]);
    assert!(std::fs::read(fs.path("d/written")).unwrap() == sent);

    // The exporting machine's kernel forgets the inodes (ganesha closes its
    // descriptors within a second or two): ganesha reopens files by handle.
    std::thread::sleep(Duration::from_secs(3));
    drop_caches();
    std::fs::remove_file(&local).unwrap();
    ok_on(&client, "nfs-cp", &[&url("d/big"), local.to_str().unwrap()]);
    assert!(std::fs::read(&local).unwrap() == big, "read after drop_caches");
    drop_caches();
    assert!(ok_on(&client, "nfs-cat", &[&url("d/written")]) == sent, "cat after drop_caches");
    drop_caches();
    ok_on(&client, "nfs-cp", &[upload.to_str().unwrap(), &url("d/after-drop")]);
    assert!(std::fs::read(fs.path("d/after-drop")).unwrap() == sent, "write after drop_caches");
    // A change made on the mount is what NFS reads next.
    std::fs::write(fs.path("d/small"), b"changed on the mount").unwrap();
    assert_eq!(ok_on(&client, "nfs-cat", &[&url("d/small")]), b"changed on the mount");

    tb.stop(pid, Duration::from_secs(5)).expect("stop ganesha");
    tb.destroy().expect("remove the test bed");
}

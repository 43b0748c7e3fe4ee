//! Service state told to systemd, for `Type=notify` units: `READY=1` once a
//! service serves (or a mount is in place), `STOPPING=1` when it begins to
//! stop, each as one datagram to the socket `NOTIFY_SOCKET` names, as
//! sd_notify(3) sends it. Without `NOTIFY_SOCKET` (no systemd: `hivefs up`,
//! a shell) nothing is sent. This module does not decide when a service is
//! ready: the services' run functions call it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (lines of `KEY=VALUE`) to systemd's notification socket,
/// when there is one; a failure is logged, not returned (the service runs on).
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    match send(&path, state) {
        Ok(()) => tracing::debug!("told systemd {state:?}"),
        Err(e) => tracing::warn!("cannot tell systemd {state:?} through {}: {e}", path.to_string_lossy()),
    }
}

fn send(path: &OsString, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match path.as_bytes().strip_prefix(b"@") {
        // An abstract socket (its name after the '@').
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reaches_the_socket_named_by_a_path_or_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(&path.clone().into_os_string(), "READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("hivefs-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        send(&OsString::from(format!("@{name}")), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        // No listener: an error, which `notify` logs.
        assert!(send(&dir.path().join("none").into_os_string(), "READY=1").is_err());
    }
}

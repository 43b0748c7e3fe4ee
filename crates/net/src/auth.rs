//! Shared-secret authentication (challenge/response with HMAC-SHA256).
//!
//! Each side sends a random nonce; the client proves knowledge of the secret
//! with HMAC(secret, "client" | server nonce | client nonce), the server
//! answers with HMAC(secret, "server" | client nonce | server nonce). The
//! secret itself never crosses the wire, and a recorded exchange cannot be
//! replayed against a new nonce.

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn from_bytes(b: &[u8]) -> Secret {
        Secret(b.to_vec())
    }

    pub fn mac(&self, role: &[u8], a: &[u8; 32], b: &[u8; 32]) -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(role);
        m.update(a);
        m.update(b);
        m.finalize().into_bytes().to_vec()
    }

    pub fn verify(&self, role: &[u8], a: &[u8; 32], b: &[u8; 32], mac: &[u8]) -> bool {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(role);
        m.update(a);
        m.update(b);
        m.verify_slice(mac).is_ok()
    }
}

pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut n);
    n
}

/// Loads a secret file. Refuses a file that its group or other users may
/// access in any way (mode bits 077), an empty file, or one larger than 4 KiB.
pub fn load_secret(path: &Path) -> Result<Secret, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read shared secret file {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "shared secret file {} is accessible by other users (group or world, mode {:o}); run `chmod 600 {}`",
            path.display(),
            meta.permissions().mode() & 0o777,
            path.display()
        ));
    }
    if meta.len() == 0 || meta.len() > 4096 {
        return Err(format!("shared secret file {} must hold 1 to 4096 bytes", path.display()));
    }
    let b = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let trimmed = b.trim_ascii();
    if trimmed.is_empty() {
        return Err(format!("shared secret file {} is blank", path.display()));
    }
    Ok(Secret(trimmed.to_vec()))
}

/// Writes a new random secret (64 hex characters) with mode 0600, unless the file exists.
pub fn generate_secret_file(path: &Path) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(hex.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_verifies_only_with_same_secret_and_nonces() {
        let s = Secret::from_bytes(b"abc");
        let (a, b) = (nonce(), nonce());
        let m = s.mac(b"client", &a, &b);
        assert!(s.verify(b"client", &a, &b, &m));
        assert!(!s.verify(b"server", &a, &b, &m));
        assert!(!s.verify(b"client", &b, &a, &m));
        assert!(!Secret::from_bytes(b"abd").verify(b"client", &a, &b, &m));
    }

    #[test]
    fn world_readable_secret_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("secret");
        generate_secret_file(&p).unwrap();
        assert!(load_secret(&p).is_ok());
        for mode in [0o644, 0o640, 0o604, 0o620, 0o660] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = load_secret(&p).unwrap_err();
            assert!(e.contains("accessible by other users") && e.contains(&p.display().to_string()), "{mode:o}: {e}");
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(load_secret(&p).is_ok(), "an owner-only file is accepted");
    }
}

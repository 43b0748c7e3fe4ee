//! Golden encodings of every message: for each variant of `Request`,
//! `Reply`, `PeerOp`, `FsckFix`, `Hello` and `ErrorCode`, one value with
//! varied field values, its bytes and its `Debug` rendering, kept in
//! `golden/messages.txt`. Decoding the pinned bytes must give the pinned value
//! and encode back to the same bytes: a changed field (type, order, a new
//! one) or a moved variant fails here and asks for a decision (and, for a
//! message on the wire, a protocol version).
//!
//! The values are found once by decoding seeded pseudo-random bytes behind
//! each variant id; `HIVEFS_BLESS=1 cargo test -p hivefs-proto --test golden`
//! writes the file again after an intended change (review its diff).

use hivefs_proto::{decode_body, encode_body, FsckFix, Hello, PeerOp, Reply, Request};
use hivefs_types::ErrorCode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/golden/messages.txt");

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        out.push(if v == 0 { b } else { b | 0x80 });
        if v == 0 {
            break;
        }
    }
}

/// A value of variant `id` of `T`, from seeded bytes: mostly small numbers
/// (short lengths, valid flags and enum indexes), sometimes letters and
/// large ones. A variant none of those decode as (a `DirPattern`'s chunk
/// size must be a power of two from 4 KiB) is tried again with 4096 (the
/// varint `80 20`) among the bytes; variants found the first way keep
/// their values.
fn sample<T: Serialize + DeserializeOwned>(id: u64) -> Option<Vec<u8>> {
    for with_4k in [false, true] {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ id.wrapping_mul(0x100_0000_01b3);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200_000 {
            let mut b = Vec::new();
            varint(id, &mut b);
            for _ in 0..96 {
                let r = next();
                match r % 8 {
                    0 => b.push((r >> 8) as u8),
                    1 => b.push(b'a' + (r >> 8) as u8 % 26),
                    7 if with_4k => b.extend([0x80, 0x20]),
                    _ => b.push((r >> 8) as u8 % 3),
                }
            }
            if let Ok((v, _)) = postcard::take_from_bytes::<T>(&b) {
                return Some(encode_body(&v));
            }
        }
    }
    None
}

/// Lines `<type> <id> <hex> <debug>` for every variant of `T` (ids from 0
/// until one has no value).
fn lines<T: Serialize + DeserializeOwned + Debug>(name: &str, out: &mut Vec<String>) {
    for id in 0.. {
        let Some(bytes) = sample::<T>(id) else {
            assert!(id > 0, "{name}: no value of variant 0");
            return;
        };
        let v: T = decode_body(&bytes).unwrap();
        out.push(format!("{name} {id} {} {v:?}", hex(&bytes)));
    }
}

fn check<T: Serialize + DeserializeOwned + Debug>(bytes: &[u8], debug: &str) -> Result<(), String> {
    let v: T = decode_body(bytes).map_err(|e| format!("does not decode any more: {e}"))?;
    let shown = format!("{v:?}");
    if shown != debug {
        return Err(format!("decodes as {shown}\n  was {debug}"));
    }
    if encode_body(&v) != bytes {
        return Err(format!("encodes as {}", hex(&encode_body(&v))));
    }
    Ok(())
}

fn generate() -> Vec<String> {
    let mut out = Vec::new();
    lines::<Request>("Request", &mut out);
    lines::<Reply>("Reply", &mut out);
    lines::<PeerOp>("PeerOp", &mut out);
    lines::<FsckFix>("FsckFix", &mut out);
    lines::<Hello>("Hello", &mut out);
    lines::<ErrorCode>("ErrorCode", &mut out);
    out
}

#[test]
fn message_encodings_are_pinned() {
    if std::env::var_os("HIVEFS_BLESS").is_some() {
        std::fs::write(GOLDEN, generate().join("\n") + "\n").unwrap();
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap();
    let mut seen = std::collections::BTreeMap::<&str, u64>::new();
    let mut bad = Vec::new();
    for line in golden.lines() {
        let mut f = line.splitn(4, ' ');
        let (ty, id, h, debug) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let bytes = unhex(h);
        let r = match ty {
            "Request" => check::<Request>(&bytes, debug),
            "Reply" => check::<Reply>(&bytes, debug),
            "PeerOp" => check::<PeerOp>(&bytes, debug),
            "FsckFix" => check::<FsckFix>(&bytes, debug),
            "Hello" => check::<Hello>(&bytes, debug),
            "ErrorCode" => check::<ErrorCode>(&bytes, debug),
            t => Err(format!("unknown type {t}")),
        };
        if let Err(e) = r {
            bad.push(format!("{ty} {id}: {e}"));
        }
        *seen.entry(ty).or_default() += 1;
    }
    assert!(
        bad.is_empty(),
        "changed encodings (HIVEFS_BLESS=1 rewrites {GOLDEN} after an intended change):\n{}",
        bad.join("\n")
    );
    // Every variant has its line (a new one is appended by blessing).
    for (ty, n) in [("Request", 90), ("Reply", 49)] {
        assert_eq!(seen.get(ty).copied(), Some(n), "{ty} variants in {GOLDEN}");
    }
}

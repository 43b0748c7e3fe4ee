//! A bandwidth limit per storage target, meant for experiments
//! (`target_rate_limit` in the storage config): it makes each target as slow
//! as a disk of the given speed, so a cluster on one machine can reproduce a
//! "storage slower than the network" setting.
//!
//! Every target has its own token bucket (GCRA form): the bucket keeps the
//! time `tat` at which everything admitted so far has been paid for at the
//! rate. A request of `n` bytes reserves its slot at once — `tat` moves to
//! `max(tat, now) + n / rate` — and then sleeps until it is within one burst
//! of that time. Reservations are taken in arrival order under a short
//! mutex held for a few arithmetic operations (never across an await), so
//! concurrent requests are served first come, first served, no one polls,
//! and one target's waiters never delay another target.

use crate::error::StorageError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The key in the storage config.
pub const CONFIG_KEY: &str = "target_rate_limit";

/// Idle time a bucket may save up: a target that was idle serves this much
/// of its rate at once.
pub const BURST: Duration = Duration::from_millis(50);

/// The bucket's arithmetic, on a clock given by the caller (time since an
/// origin), so it can be checked with a fake clock.
#[derive(Debug, Clone)]
pub struct Bucket {
    bytes_per_s: u64,
    burst: Duration,
    /// Time (since the origin) up to which admitted bytes are paid for.
    tat: Duration,
}

impl Bucket {
    /// A bucket of `bytes_per_s` (at least 1) that lets `burst` of saved-up idle time pass at once.
    pub fn new(bytes_per_s: u64, burst: Duration) -> Bucket {
        Bucket { bytes_per_s: bytes_per_s.max(1), burst, tat: Duration::ZERO }
    }

    /// Time `bytes` take at the rate.
    pub fn cost(&self, bytes: u64) -> Duration {
        let ns = u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_s);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Admits `bytes` at time `now` and returns how long the caller must wait
    /// before moving them (zero when within the burst).
    pub fn reserve(&mut self, now: Duration, bytes: u64) -> Duration {
        self.tat = self.tat.max(now) + self.cost(bytes);
        self.tat.saturating_sub(now).saturating_sub(self.burst)
    }
}

/// A target's limit, for concurrent async callers.
#[derive(Debug)]
pub struct RateLimit {
    origin: Instant,
    bucket: Mutex<Bucket>,
}

impl RateLimit {
    pub fn new(bytes_per_s: u64) -> RateLimit {
        RateLimit { origin: Instant::now(), bucket: Mutex::new(Bucket::new(bytes_per_s, BURST)) }
    }

    /// Waits until `bytes` may be read from or written to the target.
    pub async fn acquire(&self, bytes: u64) {
        let wait = {
            let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
            b.reserve(self.origin.elapsed(), bytes)
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The value of `target_rate_limit`: bytes per second as a number, or a
/// string with a binary unit (`"40MiB"`, `"40m"`, `"512k"`, `"1g"`,
/// optionally followed by `/s`). 0 means no limit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum RateSetting {
    Bytes(u64),
    Text(String),
}

impl<'de> serde::Deserialize<'de> for RateSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RateSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "{CONFIG_KEY}: bytes per second, a number or a string such as \"40MiB\" (0: no limit)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RateSetting, E> {
                Ok(RateSetting::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RateSetting, E> {
                u64::try_from(v)
                    .map(RateSetting::Bytes)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RateSetting, E> {
                Ok(RateSetting::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl RateSetting {
    /// Bytes per second; `None` for no limit. Errors name the config key.
    pub fn bytes_per_s(&self) -> Result<Option<u64>, StorageError> {
        let v = match self {
            RateSetting::Bytes(n) => *n,
            RateSetting::Text(s) => parse_rate(s).ok_or_else(|| {
                StorageError::Config(format!(
                    "{CONFIG_KEY} = {s:?} is not a rate: give bytes per second with an optional binary unit, \
                     e.g. \"40MiB\", \"512k\", \"1g\", or 0 for no limit"
                ))
            })?,
        };
        Ok((v > 0).then_some(v))
    }
}

/// Parses "40MiB", "40MiB/s", "40m", "512k", "1g", "4096" (binary units).
fn parse_rate(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("/s").unwrap_or(&t).trim_end();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(t);
    let (num, mul) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1u64 << 10),
        'm' => (&t[..t.len() - 1], 1 << 20),
        'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waits_follow_the_rate_on_a_fake_clock() {
        // 10 MiB/s: 1 MiB costs 100 ms; 50 ms of burst.
        let mut b = Bucket::new(10 * MIB, ms(50));
        assert_eq!(b.cost(MIB), ms(100));
        // A first request at t=0 waits its cost minus the burst.
        assert_eq!(b.reserve(ms(0), MIB), ms(50));
        // Concurrent requests at the same instant queue behind it, first come first served.
        assert_eq!(b.reserve(ms(0), MIB), ms(150));
        assert_eq!(b.reserve(ms(0), MIB), ms(250));
        // Later arrivals wait for what is still owed.
        assert_eq!(b.reserve(ms(100), MIB), ms(250));
        // After a long idle time only the burst is saved up, not the whole pause.
        assert_eq!(b.reserve(ms(10_000), MIB / 4), Duration::ZERO);
        assert_eq!(b.reserve(ms(10_000), MIB / 4), ms(0));
        assert_eq!(b.reserve(ms(10_000), MIB), ms(100));
    }

    #[test]
    fn admitted_volume_matches_the_rate_over_time() {
        // Many small requests arriving together: the last one finishes at volume / rate (minus the burst).
        let mut b = Bucket::new(4 * MIB, ms(50));
        let mut last = Duration::ZERO;
        for _ in 0..64 {
            last = b.reserve(ms(1000), 64 * 1024);
        }
        // 64 x 64 KiB = 4 MiB at 4 MiB/s: one second after t=1 s, less the 50 ms burst.
        assert_eq!(last, ms(950));
        // Small requests within the burst pass without waiting.
        let mut b = Bucket::new(MIB, ms(50));
        assert_eq!(b.reserve(ms(0), 4096), Duration::ZERO);
    }

    #[test]
    fn settings_parse_and_errors_name_the_key() {
        let ok = |s: &str| RateSetting::Text(s.into()).bytes_per_s().unwrap();
        assert_eq!(ok("40MiB"), Some(40 * MIB));
        assert_eq!(ok("40MiB/s"), Some(40 * MIB));
        assert_eq!(ok("40m"), Some(40 * MIB));
        assert_eq!(ok("512k"), Some(512 * 1024));
        assert_eq!(ok("1g"), Some(1 << 30));
        assert_eq!(ok("4096"), Some(4096));
        assert_eq!(ok("0"), None);
        assert_eq!(RateSetting::Bytes(0).bytes_per_s().unwrap(), None);
        assert_eq!(RateSetting::Bytes(1000).bytes_per_s().unwrap(), Some(1000));
        for bad in ["target_rate_limit = true", "target_rate_limit = -5"] {
            let e = toml::from_str::<crate::Config>(bad).unwrap_err().to_string();
            assert!(e.contains(CONFIG_KEY) && e.contains("40MiB"), "{e}");
        }
        for bad in ["fast", "", "40 furlongs", "-1m", "99999999999999g"] {
            let e = RateSetting::Text(bad.into()).bytes_per_s().unwrap_err().to_string();
            assert!(e.contains(CONFIG_KEY) && e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[tokio::test]
    async fn acquire_sleeps_only_for_its_own_target() {
        // `timeout(ZERO, f)` polls `f` once: it is ready only if `acquire` did not have to sleep.
        let a = RateLimit::new(MIB);
        let b = RateLimit::new(MIB);
        assert!(tokio::time::timeout(Duration::ZERO, a.acquire(4 * MIB)).await.is_err(), "4 MiB at 1 MiB/s must wait");
        // Target a owes about 4 s now; target b is not held up by it.
        assert!(tokio::time::timeout(Duration::ZERO, b.acquire(1024)).await.is_ok(), "target b waited for target a");
        // The abandoned reservation of target a still counts: the next request there waits too.
        assert!(tokio::time::timeout(Duration::ZERO, a.acquire(1024)).await.is_err());
    }
}

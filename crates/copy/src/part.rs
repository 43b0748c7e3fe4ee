//! `--part I/N`: which share of a copy one run does. Each file (or each range
//! of a large file) belongs to exactly one part, chosen by a hash of its path
//! relative to the destination that does not depend on the machine, the
//! process or the order of a directory listing, so N runs on N machines
//! together copy everything once.

use crate::plan::UsageError;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Part `index` (1-based) of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub index: u32,
    pub count: u32,
}

impl Part {
    /// All of the work.
    pub const WHOLE: Part = Part { index: 1, count: 1 };

    /// Parses `I/N` with 1 <= I <= N.
    pub fn parse(s: &str) -> Result<Part, UsageError> {
        let bad = || UsageError::Option(format!("--part wants I/N with 1 <= I <= N, not {s:?}"));
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Part { index, count })
    }

    /// Whether this is one of several parts.
    pub fn is_split(self) -> bool {
        self.count > 1
    }

    /// Whether the entry at `rel` (relative to the destination) is this part's.
    pub fn owns(self, rel: &Path) -> bool {
        self.owns_hash(stable_hash(rel.as_os_str().as_bytes(), None))
    }

    /// Whether range `index` of the file at `rel` is this part's.
    pub fn owns_range(self, rel: &Path, index: u64) -> bool {
        self.owns_hash(stable_hash(rel.as_os_str().as_bytes(), Some(index)))
    }

    fn owns_hash(self, h: u64) -> bool {
        self.count <= 1 || h % u64::from(self.count) == u64::from(self.index - 1)
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// FNV-1a over the path's bytes (and the range index), then a 64-bit
/// finaliser so that the low bits, which the modulo keeps, mix all input.
/// Must never change: parts of one copy may run different builds.
pub fn stable_hash(path: &[u8], range: Option<u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    path.iter().copied().for_each(&mut eat);
    if let Some(i) = range {
        // A byte no path holds, then the index: "a" range 1 is not path "a\x01".
        eat(0);
        i.to_le_bytes().into_iter().for_each(&mut eat);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_i_of_n_and_refuses_the_rest() {
        assert_eq!(Part::parse("2/3").unwrap(), Part { index: 2, count: 3 });
        for bad in ["0/3", "4/3", "1", "a/b", "1/0", "", "/2"] {
            assert!(Part::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_path_and_range_belongs_to_exactly_one_part_and_parts_are_balanced() {
        let n = 4;
        let mut per_part = [0u32; 4];
        for k in 0..4000 {
            let p = format!("dir{}/file{k}", k % 37);
            let owners: Vec<u32> = (1..=n).filter(|&i| Part { index: i, count: n }.owns(Path::new(&p))).collect();
            assert_eq!(owners.len(), 1, "{p}: {owners:?}");
            per_part[owners[0] as usize - 1] += 1;
            let r = (1..=n).filter(|&i| Part { index: i, count: n }.owns_range(Path::new(&p), k)).count();
            assert_eq!(r, 1);
        }
        assert!(per_part.iter().all(|&c| (800..1200).contains(&c)), "{per_part:?}");
    }

    #[test]
    fn the_hash_is_stable() {
        // Pinned: parts of one copy may run different builds of hivefs.
        assert_eq!(stable_hash(b"a/b", None), stable_hash(b"a/b", None));
        assert_ne!(stable_hash(b"a", Some(1)), stable_hash(b"a\x01", None));
        assert_eq!(stable_hash(b"", None), PINNED_EMPTY);
        assert_eq!(stable_hash(b"dir/file", Some(3)) % 7, PINNED_RANGE_MOD_7);
    }

    const PINNED_RANGE_MOD_7: u64 = 1;
    const PINNED_EMPTY: u64 = 0xefd0_1f60_ba99_2926;
}

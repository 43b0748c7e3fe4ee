//! Stripe patterns and the RAID0 offset mapping.
//!
//! A file offset `o` with chunk size `cs` over `n` targets lives in chunk
//! `c = o / cs`, on stripe target `t = c % n`, at local offset
//! `(c / n) * cs + o % cs` inside that target's single chunk file.

use crate::ids::{BuddyGroupId, PoolId, TargetId};
use serde::{Deserialize, Serialize};
use std::fmt;

pub const CHUNK_SIZE_MIN: u32 = 4 << 10;
pub const CHUNK_SIZE_MAX: u32 = 1 << 30;
pub const CHUNK_SIZE_DEFAULT: u32 = 512 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PatternKind {
    Raid0,
    BuddyMirror,
}

/// Most stripe targets of one file.
pub const STRIPE_MAX: usize = 65_536;

/// The fixed layout of one file's data, chosen at creation.
///
/// Only valid patterns exist ([`Pattern::new`]): a chunk size that is a
/// power of two from 4 KiB to 1 GiB, 1 to [`STRIPE_MAX`] targets, none
/// twice (each target holds one chunk file per file). Decoding checks the
/// same, so a pattern from the wire or the disk is valid too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PatternFields")]
pub struct Pattern {
    kind: PatternKind,
    chunk_size: u32,
    /// Stripe targets in stripe order; `targets.len()` is the stripe count.
    /// For [`PatternKind::BuddyMirror`] these are buddy group ids (the
    /// encoding is the same integer), read through [`Pattern::groups`].
    targets: Vec<TargetId>,
}

/// [`Pattern`] as encoded (the same fields in the same order), before its checks.
#[derive(Deserialize)]
struct PatternFields {
    kind: PatternKind,
    chunk_size: u32,
    targets: Vec<TargetId>,
}

impl TryFrom<PatternFields> for Pattern {
    type Error = String;
    fn try_from(f: PatternFields) -> Result<Pattern, String> {
        Pattern::new(f.kind, f.chunk_size, f.targets)
    }
}

/// One contiguous piece of a byte range, inside a single chunk of one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index into `Pattern::targets`.
    pub stripe_index: usize,
    /// Offset inside that target's chunk file.
    pub local_offset: u64,
    /// Offset of this piece inside the caller's buffer.
    pub buf_offset: usize,
    pub len: usize,
}

/// A set of a file's stripe positions (indices into [`Pattern::targets`]),
/// as the bits of one word: position `i` is bit `i`, and positions 63 and
/// beyond share bit 63 (a file striped wider than that is known less
/// exactly, never wrongly). What a client reports it wrote through a
/// handle, so that a file's removal deletes chunk files only where some
/// can exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StripeSet(pub u64);

impl StripeSet {
    pub const EMPTY: StripeSet = StripeSet(0);
    /// Every position of any pattern.
    pub const ALL: StripeSet = StripeSet(u64::MAX);

    fn bit(idx: usize) -> u64 {
        1 << idx.min(63)
    }

    pub fn insert(&mut self, idx: usize) {
        self.0 |= Self::bit(idx);
    }

    pub fn contains(self, idx: usize) -> bool {
        self.0 & Self::bit(idx) != 0
    }

    pub fn union(self, other: StripeSet) -> StripeSet {
        StripeSet(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set of the first `n` positions (a whole stripe of `n`).
    pub fn first(n: usize) -> StripeSet {
        if n >= 64 {
            StripeSet::ALL
        } else {
            StripeSet((1u64 << n) - 1)
        }
    }

    /// The targets of `targets` (a stripe, in stripe order) at positions in the set.
    pub fn pick<T: Copy>(self, targets: &[T]) -> Vec<T> {
        targets.iter().enumerate().filter(|(i, _)| self.contains(*i)).map(|(_, t)| *t).collect()
    }
}

/// Where one stripe of a file lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StripeUnit {
    Target(TargetId),
    Group(BuddyGroupId),
}

impl From<TargetId> for StripeUnit {
    fn from(t: TargetId) -> StripeUnit {
        StripeUnit::Target(t)
    }
}

impl StripeUnit {
    /// The id as a pattern stores it (a target id or a group id).
    pub fn raw(&self) -> u32 {
        match self {
            StripeUnit::Target(t) => t.0,
            StripeUnit::Group(g) => g.0,
        }
    }
}

impl fmt::Display for StripeUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StripeUnit::Target(t) => write!(f, "target {t}"),
            StripeUnit::Group(g) => write!(f, "buddy group {g}"),
        }
    }
}

/// Target chooser used when a file is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Chooser {
    Random,
    RoundRobin,
    RandomizedRoundRobin,
    #[default]
    Balanced,
}

impl Chooser {
    pub const ALL: [Chooser; 4] =
        [Chooser::Random, Chooser::RoundRobin, Chooser::RandomizedRoundRobin, Chooser::Balanced];

    pub fn name(&self) -> &'static str {
        match self {
            Chooser::Random => "random",
            Chooser::RoundRobin => "roundrobin",
            Chooser::RandomizedRoundRobin => "randomized-roundrobin",
            Chooser::Balanced => "balanced",
        }
    }

    pub fn parse(s: &str) -> Option<Chooser> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl fmt::Display for Chooser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Stripe settings of a directory, applied to files created in it and
/// inherited by its new subdirectories.
///
/// Valid settings ([`DirPattern::validate`]): a chunk size that is a power
/// of two from 4 KiB to 1 GiB, a stripe count of at most [`STRIPE_MAX`] (0:
/// all targets of the pool). Decoding checks the same, so settings from the
/// wire or the disk are valid; the fields stay public as plain settings,
/// and code that builds one from user input calls [`DirPattern::new`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DirPatternFields")]
pub struct DirPattern {
    pub chunk_size: u32,
    /// 0 means "all targets of the pool".
    pub stripe_count: u32,
    pub pool: PoolId,
    pub chooser: Chooser,
    /// New files stripe over the pool's storage buddy groups instead of its
    /// targets ([`PatternKind::BuddyMirror`]).
    pub mirror: bool,
}

/// [`DirPattern`] as encoded (the same fields in the same order), before its checks.
#[derive(Deserialize)]
struct DirPatternFields {
    chunk_size: u32,
    stripe_count: u32,
    pool: PoolId,
    chooser: Chooser,
    mirror: bool,
}

impl TryFrom<DirPatternFields> for DirPattern {
    type Error = String;
    fn try_from(f: DirPatternFields) -> Result<DirPattern, String> {
        DirPattern::new(f.chunk_size, f.stripe_count, f.pool, f.chooser, f.mirror)
    }
}

impl DirPattern {
    /// Directory settings, if they are valid (see [`DirPattern`]).
    pub fn new(
        chunk_size: u32,
        stripe_count: u32,
        pool: PoolId,
        chooser: Chooser,
        mirror: bool,
    ) -> Result<DirPattern, String> {
        let p = DirPattern { chunk_size, stripe_count, pool, chooser, mirror };
        p.validate()?;
        Ok(p)
    }

    /// Checks the settings (see [`DirPattern`]).
    pub fn validate(&self) -> Result<(), String> {
        validate_chunk_size(u64::from(self.chunk_size))?;
        if self.stripe_count as usize > STRIPE_MAX {
            return Err(format!("a stripe count of {} is invalid: 0 (all targets) to {STRIPE_MAX}", self.stripe_count));
        }
        Ok(())
    }
}

impl Default for DirPattern {
    fn default() -> Self {
        DirPattern {
            chunk_size: CHUNK_SIZE_DEFAULT,
            stripe_count: 0,
            pool: PoolId::DEFAULT,
            chooser: Chooser::Balanced,
            mirror: false,
        }
    }
}

/// Checks a chunk size: a power of two from 4 KiB to 1 GiB.
pub fn validate_chunk_size(cs: u64) -> Result<u32, String> {
    if !cs.is_power_of_two() || cs < u64::from(CHUNK_SIZE_MIN) || cs > u64::from(CHUNK_SIZE_MAX) {
        return Err(format!("chunk size {cs} is invalid: it must be a power of two from 4 KiB to 1 GiB"));
    }
    Ok(cs as u32)
}

impl Pattern {
    /// A pattern, if it is valid (see [`Pattern`]).
    pub fn new(kind: PatternKind, chunk_size: u32, targets: Vec<TargetId>) -> Result<Pattern, String> {
        validate_chunk_size(u64::from(chunk_size))?;
        if targets.is_empty() || targets.len() > STRIPE_MAX {
            return Err(format!("a stripe of {} targets is invalid: 1 to {STRIPE_MAX}", targets.len()));
        }
        let mut seen = std::collections::HashSet::with_capacity(targets.len());
        if let Some(t) = targets.iter().find(|t| !seen.insert(**t)) {
            return Err(format!("target {t} appears twice in a stripe"));
        }
        Ok(Pattern { kind, chunk_size, targets })
    }

    pub fn kind(&self) -> PatternKind {
        self.kind
    }

    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Stripe targets in stripe order.
    pub fn targets(&self) -> &[TargetId] {
        &self.targets
    }

    pub fn is_mirrored(&self) -> bool {
        self.kind == PatternKind::BuddyMirror
    }

    /// The stripe unit at `idx`: a target, or a buddy group of a mirrored pattern.
    pub fn unit(&self, idx: usize) -> StripeUnit {
        let raw = self.targets[idx];
        match self.kind {
            PatternKind::Raid0 => StripeUnit::Target(raw),
            PatternKind::BuddyMirror => StripeUnit::Group(BuddyGroupId(raw.0)),
        }
    }

    /// Buddy groups in stripe order; empty for an unmirrored pattern.
    pub fn groups(&self) -> Vec<BuddyGroupId> {
        match self.kind {
            PatternKind::Raid0 => Vec::new(),
            PatternKind::BuddyMirror => self.targets.iter().map(|t| BuddyGroupId(t.0)).collect(),
        }
    }

    /// The stripe targets, taking the pattern apart.
    pub fn into_targets(self) -> Vec<TargetId> {
        self.targets
    }

    pub fn stripe_count(&self) -> usize {
        self.targets.len()
    }

    fn cs(&self) -> u64 {
        u64::from(self.chunk_size)
    }

    /// Maps a file offset to `(stripe index, local offset)`.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let n = self.targets.len() as u64;
        let chunk = offset / self.cs();
        let idx = (chunk % n) as usize;
        let local = (chunk / n) * self.cs() + offset % self.cs();
        (idx, local)
    }

    /// The file offset of byte `local` of stripe target `idx`'s chunk file
    /// (inverse of [`Pattern::locate`]).
    pub fn file_offset(&self, idx: usize, local: u64) -> u64 {
        let (cs, n) = (self.cs(), self.targets.len() as u64);
        ((local / cs) * n + idx as u64) * cs + local % cs
    }

    /// The offset in stripe target `idx`'s chunk file of the first byte of
    /// the file at or after `offset` that the target stores. Per target the
    /// mapping is monotonic, so the target's part of any file range
    /// `[a, b)` is the one local range `[at_or_after(a), at_or_after(b))`.
    pub fn local_at_or_after(&self, idx: usize, offset: u64) -> u64 {
        let (cs, n) = (self.cs(), self.targets.len() as u64);
        let chunk = offset / cs;
        let here = chunk % n;
        let idx = idx as u64;
        if here == idx {
            (chunk / n) * cs + offset % cs
        } else {
            // The next chunk of the file that lies on `idx`.
            let next = if idx > here { chunk - here + idx } else { chunk - here + n + idx };
            (next / n) * cs
        }
    }

    /// The local range of stripe target `idx` holding the file's bytes in
    /// `[start, end)`, if it holds any.
    pub fn local_range(&self, idx: usize, start: u64, end: u64) -> Option<(u64, u64)> {
        let (lo, hi) = (self.local_at_or_after(idx, start), self.local_at_or_after(idx, end));
        (hi > lo).then_some((lo, hi))
    }

    /// The stripe positions holding some byte of `[offset, offset+len)`.
    pub fn stripes_in(&self, offset: u64, len: u64) -> StripeSet {
        if len == 0 {
            return StripeSet::EMPTY;
        }
        let n = self.targets.len() as u64;
        let (first, last) = (offset / self.cs(), offset.saturating_add(len - 1) / self.cs());
        if last - first + 1 >= n {
            return StripeSet::first(self.targets.len());
        }
        let mut s = StripeSet::EMPTY;
        for c in first..=last {
            s.insert((c % n) as usize);
        }
        s
    }

    /// Splits `[offset, offset+len)` into per-chunk pieces in file order.
    pub fn pieces(&self, offset: u64, len: usize) -> Vec<Piece> {
        let mut out = Vec::with_capacity(len / self.chunk_size as usize + 2);
        let mut done = 0usize;
        while done < len {
            let o = offset + done as u64;
            let in_chunk = (self.cs() - o % self.cs()) as usize;
            let take = in_chunk.min(len - done);
            let (stripe_index, local_offset) = self.locate(o);
            out.push(Piece { stripe_index, local_offset, buf_offset: done, len: take });
            done += take;
        }
        out
    }

    /// Length of stripe target `idx`'s chunk file for a file of `size` bytes
    /// written densely (or truncated to `size`).
    pub fn chunk_file_len(&self, size: u64, idx: usize) -> u64 {
        let cs = self.cs();
        let n = self.targets.len() as u64;
        let idx = idx as u64;
        let full_chunks = size / cs;
        let tail = size % cs;
        // Chunks 0..full_chunks are complete; chunk `full_chunks` holds `tail` bytes.
        let full_here = full_chunks / n + u64::from(full_chunks % n > idx);
        let mut len = full_here * cs;
        if tail > 0 && full_chunks % n == idx {
            len += tail;
        }
        len
    }

    /// The smallest file size that explains a chunk file of `len` bytes on
    /// stripe target `idx` (inverse of the mapping for the last byte).
    pub fn size_from_chunk_len(&self, len: u64, idx: usize) -> u64 {
        if len == 0 {
            return 0;
        }
        let cs = self.cs();
        let n = self.targets.len() as u64;
        let last = len - 1;
        let local_chunk = last / cs;
        let chunk = local_chunk * n + idx as u64;
        chunk * cs + last % cs + 1
    }

    /// File size implied by the chunk file lengths of all stripe targets.
    pub fn size_from_chunk_lens(&self, lens: &[u64]) -> u64 {
        lens.iter().enumerate().map(|(i, &l)| self.size_from_chunk_len(l, i)).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pat(cs: u32, n: u32) -> Pattern {
        Pattern::new(PatternKind::Raid0, cs, (1..=n).map(TargetId).collect()).unwrap()
    }

    #[test]
    fn only_valid_patterns_are_made_or_decoded() {
        let t = |v: &[u32]| v.iter().copied().map(TargetId).collect::<Vec<_>>();
        assert!(Pattern::new(PatternKind::Raid0, 4096, t(&[1, 2])).is_ok());
        for (cs, targets) in [(0, t(&[1])), (5000, t(&[1])), (4096, t(&[])), (4096, t(&[1, 2, 1]))] {
            assert!(Pattern::new(PatternKind::Raid0, cs, targets.clone()).is_err(), "{cs} {targets:?}");
            // The same fields as they would arrive off the wire or the disk.
            #[derive(Serialize)]
            struct Raw {
                kind: PatternKind,
                chunk_size: u32,
                targets: Vec<TargetId>,
            }
            let bytes = postcard::to_allocvec(&Raw { kind: PatternKind::Raid0, chunk_size: cs, targets }).unwrap();
            assert!(postcard::from_bytes::<Pattern>(&bytes).is_err());
        }
        let good = pat(4096, 3);
        let bytes = postcard::to_allocvec(&good).unwrap();
        assert_eq!(postcard::from_bytes::<Pattern>(&bytes).unwrap(), good);
    }

    #[test]
    fn only_valid_directory_patterns_are_made_or_decoded() {
        let p = |cs, n| DirPattern { chunk_size: cs, stripe_count: n, ..DirPattern::default() };
        assert!(DirPattern::new(4096, 0, PoolId::DEFAULT, Chooser::Balanced, false).is_ok());
        assert!(p(1 << 30, STRIPE_MAX as u32).validate().is_ok());
        for (cs, n) in [(0, 1), (5000, 1), (2048, 0), (4096, STRIPE_MAX as u32 + 1)] {
            let bad = p(cs, n);
            assert!(bad.validate().is_err(), "{bad:?}");
            assert!(DirPattern::new(cs, n, PoolId::DEFAULT, Chooser::Random, true).is_err());
            // Encoding does not check; decoding does, as for a pattern off the wire or the disk.
            let bytes = postcard::to_allocvec(&bad).unwrap();
            let e = postcard::from_bytes::<DirPattern>(&bytes).unwrap_err();
            assert!(!e.to_string().is_empty());
        }
        let good = p(1 << 20, 4);
        let bytes = postcard::to_allocvec(&good).unwrap();
        assert_eq!(postcard::from_bytes::<DirPattern>(&bytes).unwrap(), good);
    }

    proptest! {
        #[test]
        fn local_ranges_are_the_pieces_of_a_range(
            cs_log in 12u32..16, n in 1u32..6, start in 0u64..200_000, len in 0u64..200_000,
        ) {
            let p = pat(1 << cs_log, n);
            for o in [start, start + len] {
                let (idx, local) = p.locate(o);
                prop_assert_eq!(p.file_offset(idx, local), o);
                prop_assert_eq!(p.local_at_or_after(idx, o), local);
            }
            // Every piece of the range lies inside its target's local range, and
            // the pieces of a target add up to it.
            let pieces = p.pieces(start, len as usize);
            for idx in 0..n as usize {
                let mine: Vec<_> = pieces.iter().filter(|x| x.stripe_index == idx).collect();
                match p.local_range(idx, start, start + len) {
                    None => prop_assert!(mine.is_empty()),
                    Some((lo, hi)) => {
                        prop_assert_eq!(mine.iter().map(|x| x.len as u64).sum::<u64>(), hi - lo);
                        prop_assert_eq!(mine[0].local_offset, lo);
                        let last = mine[mine.len() - 1];
                        prop_assert_eq!(last.local_offset + last.len as u64, hi);
                    }
                }
            }
        }
    }

    #[test]
    fn locate_matches_brief_formula() {
        let p = pat(4096, 3);
        assert_eq!(p.locate(0), (0, 0));
        assert_eq!(p.locate(4095), (0, 4095));
        assert_eq!(p.locate(4096), (1, 0));
        assert_eq!(p.locate(3 * 4096 + 5), (0, 4096 + 5));
    }

    #[test]
    fn chunk_sizes_are_validated() {
        assert!(validate_chunk_size(4096).is_ok());
        assert!(validate_chunk_size(1 << 30).is_ok());
        assert!(validate_chunk_size(2048).is_err());
        assert!(validate_chunk_size(5000).is_err());
        assert!(validate_chunk_size(2 << 30).is_err());
    }

    /// Naive oracle: walk every byte of the file.
    fn oracle_lens(p: &Pattern, size: u64) -> Vec<u64> {
        let mut lens = vec![0u64; p.stripe_count()];
        for o in 0..size {
            let (i, l) = p.locate(o);
            lens[i] = lens[i].max(l + 1);
        }
        lens
    }

    proptest! {
        /// The stripes of a range are exactly those its pieces are on.
        #[test]
        fn stripes_in_a_range_are_those_of_its_pieces(
            cs_shift in 12u32..15, n in 1u32..9, off in 0u64..200_000, len in 0usize..100_000,
        ) {
            let p = pat(1 << cs_shift, n);
            let mut want = StripeSet::EMPTY;
            for pc in p.pieces(off, len) {
                want.insert(pc.stripe_index);
            }
            prop_assert_eq!(p.stripes_in(off, len as u64), want);
        }
    }

    #[test]
    fn positions_past_63_share_the_last_bit() {
        let mut s = StripeSet::EMPTY;
        s.insert(70);
        assert!(s.contains(63) && s.contains(1000) && !s.contains(62));
        let targets: Vec<u32> = (0..100).collect();
        assert_eq!(s.pick(&targets), (63..100).collect::<Vec<_>>());
        assert_eq!(StripeSet::first(3).pick(&targets), vec![0, 1, 2]);
        assert_eq!(StripeSet::first(64), StripeSet::ALL);
        assert_eq!(StripeSet::EMPTY.pick(&targets), Vec::<u32>::new());
    }

    proptest! {
        #[test]
        fn pieces_cover_range_exactly(cs_shift in 12u32..15, n in 1u32..9, off in 0u64..200_000, len in 0usize..100_000) {
            let p = pat(1 << cs_shift, n);
            let pieces = p.pieces(off, len);
            let mut next = 0usize;
            for pc in &pieces {
                prop_assert_eq!(pc.buf_offset, next);
                prop_assert!(pc.len > 0);
                let (i, l) = p.locate(off + pc.buf_offset as u64);
                prop_assert_eq!((i, l), (pc.stripe_index, pc.local_offset));
                // A piece never crosses a chunk boundary.
                prop_assert!((pc.local_offset % u64::from(p.chunk_size)) + pc.len as u64 <= u64::from(p.chunk_size));
                next += pc.len;
            }
            prop_assert_eq!(next, len);
        }

        #[test]
        fn chunk_lens_match_oracle_and_invert(cs_shift in 12u32..14, n in 1u32..6, size in 0u64..60_000) {
            let p = pat(1 << cs_shift, n);
            let lens: Vec<u64> = (0..p.stripe_count()).map(|i| p.chunk_file_len(size, i)).collect();
            prop_assert_eq!(&lens, &oracle_lens(&p, size));
            prop_assert_eq!(p.size_from_chunk_lens(&lens), size);
        }
    }
}

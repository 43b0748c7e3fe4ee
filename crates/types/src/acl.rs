//! POSIX access control lists as Linux stores them in the extended attributes
//! `system.posix_acl_access` and `system.posix_acl_default`, and the rules
//! that tie them to an inode's mode: the mode an ACL implies, `chmod` of an
//! inode with an ACL, and the inheritance of a directory's default ACL into
//! a new entry.
//!
//! The attribute value is the Linux xattr format: a little-endian `u32`
//! version ([`VERSION`], 2), then 8-byte entries of tag (`u16`), permission
//! (`u16`) and id (`u32`, [`UNDEFINED_ID`] for the entries without one).
//! [`Acl::decode`] refuses anything the kernel's `posix_acl_valid` refuses
//! (with an error, never a panic: the bytes come from clients), so a stored
//! ACL is always one the kernel can use.

use std::fmt;

/// Version number in the header of the xattr format.
pub const VERSION: u32 = 2;
/// Id of the entries that name no user or group.
pub const UNDEFINED_ID: u32 = u32::MAX;
/// Name of the access ACL attribute.
pub const XATTR_ACCESS: &[u8] = b"system.posix_acl_access";
/// Name of the default ACL attribute (directories only).
pub const XATTR_DEFAULT: &[u8] = b"system.posix_acl_default";

/// The permission bits of one entry (read 4, write 2, execute 1).
pub const PERM_MASK: u16 = 0o7;

/// What an entry applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    /// The owner (mode bits 0700).
    UserObj,
    /// A named user.
    User(u32),
    /// The owning group (mode bits 0070 when there is no mask).
    GroupObj,
    /// A named group.
    Group(u32),
    /// Upper bound of named users, the owning group and named groups (mode bits 0070).
    Mask,
    /// Everyone else (mode bits 0007).
    Other,
}

impl Tag {
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const GROUP: u16 = 0x08;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;

    fn code(&self) -> u16 {
        match self {
            Tag::UserObj => Self::USER_OBJ,
            Tag::User(_) => Self::USER,
            Tag::GroupObj => Self::GROUP_OBJ,
            Tag::Group(_) => Self::GROUP,
            Tag::Mask => Self::MASK,
            Tag::Other => Self::OTHER,
        }
    }

    fn id(&self) -> u32 {
        match self {
            Tag::User(id) | Tag::Group(id) => *id,
            _ => UNDEFINED_ID,
        }
    }
}

/// One entry: a tag and its `rwx` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u16,
}

/// Why bytes are not a valid ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclError(pub String);

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AclError {}

fn bad(m: impl Into<String>) -> AclError {
    AclError(m.into())
}

/// A valid ACL: entries in the order Linux keeps them (owner, named users
/// by id, owning group, named groups by id, mask, other), the three base
/// entries present, a mask when there are named entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Most entries an ACL may have (what fits in the largest xattr value).
pub const MAX_ENTRIES: usize = (crate::XATTR_SIZE_MAX - 4) / 8;

impl Acl {
    /// Checks `entries` as the kernel's `posix_acl_valid` does.
    pub fn new(entries: Vec<Entry>) -> Result<Acl, AclError> {
        if entries.len() > MAX_ENTRIES {
            return Err(bad(format!("ACL of {} entries exceeds {MAX_ENTRIES}", entries.len())));
        }
        // States: 0 owner next, 1 named users, 2 named groups, 3 other next, 4 done.
        let mut state = 0;
        let (mut needs_mask, mut has_mask) = (false, false);
        let mut prev_id: Option<u32> = None;
        for e in &entries {
            if e.perm & !PERM_MASK != 0 {
                return Err(bad(format!("ACL entry {:?} has permission bits {:#o} beyond rwx", e.tag, e.perm)));
            }
            let ok = match e.tag {
                Tag::UserObj if state == 0 => {
                    state = 1;
                    true
                }
                Tag::User(id) if state == 1 => {
                    if prev_id.is_some_and(|p| id <= p) {
                        return Err(bad(format!("named user {id} is out of order or repeated")));
                    }
                    prev_id = Some(id);
                    needs_mask = true;
                    true
                }
                Tag::GroupObj if state == 1 => {
                    state = 2;
                    prev_id = None;
                    true
                }
                Tag::Group(id) if state == 2 => {
                    if prev_id.is_some_and(|p| id <= p) {
                        return Err(bad(format!("named group {id} is out of order or repeated")));
                    }
                    prev_id = Some(id);
                    needs_mask = true;
                    true
                }
                Tag::Mask if state == 2 => {
                    state = 3;
                    has_mask = true;
                    true
                }
                Tag::Other if state == 3 || (state == 2 && !needs_mask) => {
                    state = 4;
                    true
                }
                _ => false,
            };
            if !ok {
                return Err(bad(format!("ACL entry {:?} is out of order, repeated or misplaced", e.tag)));
            }
        }
        if state != 4 {
            return Err(bad("ACL lacks one of the owner, owning group and other entries"));
        }
        if needs_mask && !has_mask {
            return Err(bad("ACL with named users or groups lacks a mask entry"));
        }
        Ok(Acl { entries })
    }

    /// The minimal ACL of a mode: owner, owning group and other.
    pub fn from_mode(mode: u32) -> Acl {
        let p = |shift: u32| ((mode >> shift) & 0o7) as u16;
        Acl {
            entries: vec![
                Entry { tag: Tag::UserObj, perm: p(6) },
                Entry { tag: Tag::GroupObj, perm: p(3) },
                Entry { tag: Tag::Other, perm: p(0) },
            ],
        }
    }

    /// Parses and validates an xattr value.
    pub fn decode(b: &[u8]) -> Result<Acl, AclError> {
        if b.len() < 4 {
            return Err(bad(format!("ACL attribute of {} bytes has no header", b.len())));
        }
        let version = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if version != VERSION {
            return Err(bad(format!("ACL attribute version {version}, expected {VERSION}")));
        }
        let body = &b[4..];
        if body.is_empty() || !body.len().is_multiple_of(8) {
            return Err(bad(format!("ACL attribute body of {} bytes is not a non-empty list of entries", body.len())));
        }
        let mut entries = Vec::with_capacity(body.len() / 8);
        for c in body.chunks_exact(8) {
            let code = u16::from_le_bytes([c[0], c[1]]);
            let perm = u16::from_le_bytes([c[2], c[3]]);
            let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            let tag = match code {
                Tag::USER_OBJ => Tag::UserObj,
                Tag::USER => Tag::User(id),
                Tag::GROUP_OBJ => Tag::GroupObj,
                Tag::GROUP => Tag::Group(id),
                Tag::MASK => Tag::Mask,
                Tag::OTHER => Tag::Other,
                _ => return Err(bad(format!("unknown ACL entry tag {code:#x}"))),
            };
            entries.push(Entry { tag, perm });
        }
        Acl::new(entries)
    }

    /// The xattr value.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.code().to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.tag.id().to_le_bytes());
        }
        v
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn perm_of(&self, tag: Tag) -> Option<u16> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// True when the mode bits say all the ACL says (owner, owning group
    /// and other only): such an ACL is not stored (as Linux file systems).
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    /// The permission bits (0777) the ACL implies: the group bits are the
    /// mask's when there is one.
    pub fn mode(&self) -> u32 {
        let p = |t: Tag| self.perm_of(t).unwrap_or(0) as u32;
        let group = self.perm_of(Tag::Mask).map_or(p(Tag::GroupObj), |m| m as u32);
        (p(Tag::UserObj) << 6) | (group << 3) | p(Tag::Other)
    }

    /// `chmod`: the owner, mask (or owning group without a mask) and other
    /// entries take the new mode's bits; named entries keep theirs.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.perm_of(Tag::Mask).is_some();
        for e in &mut self.entries {
            let shift = match e.tag {
                Tag::UserObj => 6,
                Tag::Mask => 3,
                Tag::GroupObj if !has_mask => 3,
                Tag::Other => 0,
                _ => continue,
            };
            e.perm = ((mode >> shift) & 0o7) as u16;
        }
    }

    /// A new entry's access ACL from its parent's default ACL (`self`) and
    /// the mode the creator asked for (as the kernel's `posix_acl_create`):
    /// the owner and other entries, and the mask (or owning group without
    /// one), are limited by the mode, and the mode by them. Returns the new
    /// mode (file type bits and 07000 kept) and the access ACL, `None` when
    /// the mode says it all.
    pub fn inherit(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut mode = mode;
        let has_mask = acl.perm_of(Tag::Mask).is_some();
        for e in &mut acl.entries {
            let shift = match e.tag {
                Tag::UserObj => 6,
                Tag::Other => 0,
                Tag::Mask => 3,
                Tag::GroupObj if !has_mask => 3,
                _ => continue,
            };
            e.perm &= ((mode >> shift) & 0o7) as u16;
            mode &= ((e.perm as u32) << shift) | !(0o7 << shift);
        }
        let acl = if acl.is_minimal() { None } else { Some(acl) };
        (mode, acl)
    }
}

/// What a new entry gets from its parent directory's default ACL: its mode,
/// its access ACL and (directories) its default ACL, as xattr values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inherited {
    pub mode: u32,
    pub access: Option<Vec<u8>>,
    pub default: Option<Vec<u8>>,
}

/// The mode and ACLs of a new entry: with the parent's default ACL the
/// entry inherits it (the umask is not used, as POSIX says); without one
/// the umask applies. `dir`: the entry is a directory and keeps the default
/// ACL too.
pub fn create_mode(parent_default: Option<&Acl>, mode: u32, umask: u32, dir: bool) -> Inherited {
    match parent_default {
        None => Inherited { mode: mode & !(umask & 0o777), access: None, default: None },
        Some(d) => {
            let (mode, access) = d.inherit(mode);
            Inherited { mode, access: access.map(|a| a.encode()), default: dir.then(|| d.encode()) }
        }
    }
}

/// Who asks for access: a user and every group it is in (primary first).
#[derive(Clone, Debug)]
pub struct Asker<'a> {
    pub uid: u32,
    pub groups: &'a [u32],
}

/// Whether `who` may access a file of owner `uid`/`gid` with mode `mode`
/// (and access ACL `acl`, if it has one) for `want` (`rwx` bits: read 4,
/// write 2, execute 1), as the kernel decides for a file system without
/// its own `permission` (`generic_permission` with `posix_acl_permission`).
/// Root may read and write anything, and execute what has an `x` bit.
pub fn permits(mode: u32, (uid, gid): (u32, u32), acl: Option<&Acl>, who: &Asker<'_>, want: u16) -> bool {
    let want = want & PERM_MASK;
    if who.uid == 0 {
        return want & 1 == 0 || mode & 0o111 != 0;
    }
    let has = |perm: u16| perm & want == want;
    let Some(acl) = acl else {
        let bits = if who.uid == uid {
            mode >> 6
        } else if who.groups.contains(&gid) {
            mode >> 3
        } else {
            mode
        };
        return has(bits as u16 & PERM_MASK);
    };
    let mask = acl.perm_of(Tag::Mask).unwrap_or(PERM_MASK);
    let mut in_a_group = false;
    for e in acl.entries() {
        match e.tag {
            Tag::UserObj if who.uid == uid => return has(e.perm),
            Tag::User(id) if who.uid == id => return has(e.perm & mask),
            Tag::GroupObj if who.groups.contains(&gid) => {
                in_a_group = true;
                if has(e.perm & mask) {
                    return true;
                }
            }
            Tag::Group(id) if who.groups.contains(&id) => {
                in_a_group = true;
                if has(e.perm & mask) {
                    return true;
                }
            }
            Tag::Other if !in_a_group => return has(e.perm),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(tag: Tag, perm: u16) -> Entry {
        Entry { tag, perm }
    }

    fn named() -> Acl {
        Acl::new(vec![
            e(Tag::UserObj, 7),
            e(Tag::User(1001), 6),
            e(Tag::GroupObj, 5),
            e(Tag::Group(3000), 4),
            e(Tag::Mask, 7),
            e(Tag::Other, 1),
        ])
        .unwrap()
    }

    #[test]
    fn access_follows_the_kernels_rules() {
        let ask = |uid: u32, groups: &'static [u32]| Asker { uid, groups };
        let owner = (500, 600);
        // Mode bits alone: owner, owning group, other; root reads and writes anything.
        assert!(permits(0o640, owner, None, &ask(500, &[1]), 6));
        assert!(permits(0o640, owner, None, &ask(7, &[9, 600]), 4));
        assert!(!permits(0o640, owner, None, &ask(7, &[9, 600]), 2));
        assert!(!permits(0o640, owner, None, &ask(7, &[9]), 4));
        assert!(permits(0o000, owner, None, &ask(0, &[0]), 6));
        assert!(!permits(0o600, owner, None, &ask(0, &[0]), 1));
        // The owner's bits decide for the owner even when other's would allow more.
        assert!(!permits(0o407, owner, None, &ask(500, &[600]), 2));
        // Named user: its entry under the mask; named and owning groups likewise;
        // a caller in a matching group that grants nothing gets nothing from other.
        let a = named();
        assert!(permits(0o751, (1, 2), Some(&a), &ask(1001, &[5]), 6));
        assert!(permits(0o751, (1, 2), Some(&a), &ask(9, &[3000]), 4));
        assert!(!permits(0o751, (1, 2), Some(&a), &ask(9, &[3000]), 2));
        assert!(!permits(0o751, (1, 2), Some(&a), &ask(9, &[3000]), 1));
        assert!(permits(0o751, (1, 2), Some(&a), &ask(9, &[4000]), 1));
        let mut masked = a.clone();
        masked.chmod(0o741);
        assert!(!permits(0o741, (1, 2), Some(&masked), &ask(1001, &[5]), 2), "the mask limits named users");
        assert!(permits(0o741, (1, 2), Some(&masked), &ask(1, &[5]), 7), "not the owner");
    }

    #[test]
    fn encodes_the_linux_format() {
        let a = Acl::from_mode(0o640);
        let b = a.encode();
        assert_eq!(&b[..4], &[2, 0, 0, 0]);
        assert_eq!(&b[4..12], &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[12..20], &[4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[20..28], &[0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(Acl::decode(&b), Ok(a));
        let n = named();
        assert_eq!(Acl::decode(&n.encode()), Ok(n.clone()));
        assert_eq!(&n.encode()[12..20], &[2, 0, 6, 0, 0xe9, 0x03, 0, 0], "named user 1001");
    }

    #[test]
    fn refuses_invalid_acls() {
        let ok = named().encode();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("header only", vec![2, 0, 0, 0]),
            ("version 1", {
                let mut b = ok.clone();
                b[0] = 1;
                b
            }),
            ("torn entry", ok[..ok.len() - 3].to_vec()),
            ("unknown tag", {
                let mut b = ok.clone();
                b[4] = 0x40;
                b
            }),
            ("perm beyond rwx", {
                let mut b = ok.clone();
                b[6] = 8;
                b
            }),
        ];
        for (what, b) in cases {
            assert!(Acl::decode(&b).is_err(), "{what} must be refused");
        }
        let bad_lists: Vec<(&str, Vec<Entry>)> = vec![
            ("no owner", vec![e(Tag::GroupObj, 5), e(Tag::Other, 0)]),
            ("no other", vec![e(Tag::UserObj, 7), e(Tag::GroupObj, 5)]),
            ("no group", vec![e(Tag::UserObj, 7), e(Tag::Other, 0)]),
            (
                "named user without mask",
                vec![e(Tag::UserObj, 7), e(Tag::User(5), 7), e(Tag::GroupObj, 5), e(Tag::Other, 0)],
            ),
            (
                "named group without mask",
                vec![e(Tag::UserObj, 7), e(Tag::GroupObj, 5), e(Tag::Group(5), 7), e(Tag::Other, 0)],
            ),
            (
                "users out of order",
                vec![
                    e(Tag::UserObj, 7),
                    e(Tag::User(9), 7),
                    e(Tag::User(5), 7),
                    e(Tag::GroupObj, 5),
                    e(Tag::Mask, 7),
                    e(Tag::Other, 0),
                ],
            ),
            (
                "user twice",
                vec![
                    e(Tag::UserObj, 7),
                    e(Tag::User(5), 7),
                    e(Tag::User(5), 7),
                    e(Tag::GroupObj, 5),
                    e(Tag::Mask, 7),
                    e(Tag::Other, 0),
                ],
            ),
            ("owner twice", vec![e(Tag::UserObj, 7), e(Tag::UserObj, 7), e(Tag::GroupObj, 5), e(Tag::Other, 0)]),
            ("other first", vec![e(Tag::Other, 0), e(Tag::UserObj, 7), e(Tag::GroupObj, 5)]),
            ("entry after other", vec![e(Tag::UserObj, 7), e(Tag::GroupObj, 5), e(Tag::Other, 0), e(Tag::Mask, 7)]),
        ];
        for (what, l) in bad_lists {
            assert!(Acl::new(l).is_err(), "{what} must be refused");
        }
        // A mask without named entries is valid (setfacl -m m::r writes one).
        assert!(Acl::new(vec![e(Tag::UserObj, 7), e(Tag::GroupObj, 5), e(Tag::Mask, 4), e(Tag::Other, 0)]).is_ok());
    }

    #[test]
    fn mode_and_chmod() {
        let mut a = named();
        assert_eq!(a.mode(), 0o771, "group bits are the mask's");
        assert!(!a.is_minimal());
        a.chmod(0o640);
        assert_eq!(a.mode(), 0o640);
        assert_eq!(a.perm_of(Tag::GroupObj), Some(5), "with a mask the owning group keeps its bits");
        assert_eq!(a.perm_of(Tag::User(1001)), Some(6), "named entries keep theirs");
        assert_eq!(a.perm_of(Tag::Mask), Some(4));
        let mut m = Acl::from_mode(0o755);
        assert!(m.is_minimal());
        m.chmod(0o604);
        assert_eq!(m.mode(), 0o604);
        assert_eq!(m.perm_of(Tag::GroupObj), Some(0), "without a mask the owning group takes the bits");
    }

    #[test]
    fn inheritance_masks_by_the_requested_mode() {
        let d = named();
        // A file created 0666 (as open(O_CREAT, 0666) by most programs).
        let i = create_mode(Some(&d), 0o100666, 0o077, false);
        assert_eq!(i.mode, 0o100660, "owner rw, mask rw (default mask rwx & 6), other --- (1 & 6); umask ignored");
        let a = Acl::decode(i.access.as_ref().unwrap()).unwrap();
        assert_eq!(a.perm_of(Tag::User(1001)), Some(6), "named entries inherited as they are");
        assert_eq!(a.perm_of(Tag::Mask), Some(6));
        assert_eq!(a.mode(), 0o660);
        assert_eq!(i.default, None, "files get no default ACL");
        // A directory created 0777 keeps the default too; setgid etc. survive.
        let i = create_mode(Some(&d), 0o2777, 0o022, true);
        assert_eq!(i.mode, 0o2771);
        assert_eq!(i.default, Some(d.encode()));
        assert!(i.access.is_some());
        // A minimal default ACL gives no access ACL, only mode bits.
        let m = Acl::from_mode(0o750);
        let i = create_mode(Some(&m), 0o666, 0o000, false);
        assert_eq!((i.mode, i.access), (0o640, None));
        // No default: the umask.
        assert_eq!(create_mode(None, 0o666, 0o022, false), Inherited { mode: 0o644, access: None, default: None });
        assert_eq!(create_mode(None, 0o4777, 0o027, true).mode, 0o4750);
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(a) = Acl::decode(&b) {
                prop_assert_eq!(Acl::decode(&a.encode()), Ok(a.clone()));
            }
        }

        #[test]
        fn valid_acls_round_trip(users in proptest::collection::btree_set(0u32..100, 0..4),
                                 groups in proptest::collection::btree_set(0u32..100, 0..4),
                                 perms in proptest::collection::vec(0u16..8, 12),
                                 mode in 0u32..0o7777) {
            let mut l = vec![e(Tag::UserObj, perms[0])];
            l.extend(users.iter().enumerate().map(|(k, u)| e(Tag::User(*u), perms[1 + k])));
            l.push(e(Tag::GroupObj, perms[5]));
            l.extend(groups.iter().enumerate().map(|(k, g)| e(Tag::Group(*g), perms[6 + k])));
            if !users.is_empty() || !groups.is_empty() {
                l.push(e(Tag::Mask, perms[10]));
            }
            l.push(e(Tag::Other, perms[11]));
            let a = Acl::new(l).unwrap();
            prop_assert_eq!(Acl::decode(&a.encode()), Ok(a.clone()));
            let mut c = a.clone();
            c.chmod(mode);
            prop_assert_eq!(c.mode(), mode & 0o777);
            let (m, acc) = a.inherit(mode);
            prop_assert_eq!(m & !0o777, mode & !0o777);
            prop_assert!(m & 0o777 & !(mode & 0o777) == 0, "inheritance only takes bits away");
            if let Some(acc) = acc {
                prop_assert_eq!(acc.mode(), m & 0o777);
            }
        }
    }
}

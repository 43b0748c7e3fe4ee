//! Message bodies. Requests of all services share one enum so that a type id
//! names a message unambiguously; a service answers requests that are not its
//! own with `ErrorCode::NotSupported`.

use hivefs_types::attr::{EntryAttr, FileKind, SetAttr, Timespec};
use hivefs_types::error::FsError;
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, NodeType, PoolId, TargetId};
use hivefs_types::pattern::{DirPattern, Pattern, StripeSet, StripeUnit};
use serde::{Deserialize, Serialize};

/// Handshake messages (frame kind `Hello`). See `hivefs-net` for the exchange.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hello {
    /// Server → client, first frame on every connection.
    Server {
        protocol_version: u16,
        node_type: NodeType,
        nonce: [u8; 32],
        auth_required: bool,
    },
    /// Client → server: its nonce and HMAC(secret, "client" | server nonce | client nonce).
    Client {
        protocol_version: u16,
        nonce: [u8; 32],
        mac: Vec<u8>,
    },
    /// Server → client: HMAC(secret, "server" | client nonce | server nonce), proving the server knows the secret too.
    Accepted {
        mac: Vec<u8>,
    },
    Refused {
        reason: String,
    },
}

/// Identity of the user on whose behalf a namespace operation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The caller's file mode creation mask, for the creates (`Create`,
    /// `CreateOpen`, `Mkdir`) of a client with POSIX ACLs on (a mount
    /// without `--no-acl`): the new entry inherits its parent's default
    /// ACL, or without one gets `mode & !umask`, decided on the metadata
    /// node in the create's transaction (the kernel leaves both to the file
    /// system once it enforces ACLs). `None` (tools, and mounts without
    /// ACLs, whose kernel already applied the umask): the mode is taken as
    /// given and no ACL is inherited. Other requests ignore it.
    pub umask: Option<u32>,
}

impl Caller {
    /// A caller without ACL semantics for its creates (`umask: None`).
    pub const fn new(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, umask: None }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetCapacity {
    pub target: TargetId,
    pub capacity: Capacity,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reachability {
    Online,
    ProbablyOffline,
    Offline,
}

impl Reachability {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reachability::Online => "online",
            Reachability::ProbablyOffline => "probably-offline",
            Reachability::Offline => "offline",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub node_type: NodeType,
    /// Address the service listens on, `host:port`.
    pub addr: String,
    pub hostname: String,
    /// Milliseconds since the last heartbeat or registration.
    pub last_seen_ms: u64,
    pub reachability: Reachability,
    /// Metadata nodes: space of their metadata target.
    pub capacity: Option<Capacity>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub id: TargetId,
    pub node: NodeId,
    pub pool: PoolId,
    pub capacity: Capacity,
    pub last_seen_ms: u64,
    pub reachability: Reachability,
    /// Capacity pool by free space and free inodes against mgmtd's limits.
    pub capacity_pool: CapacityPool,
}

/// Capacity class of a target (BeeGFS's capacity pools): choosers take
/// targets from `Normal`, from `Low` only when a stripe cannot be filled
/// otherwise, and never from `Emergency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CapacityPool {
    Normal,
    Low,
    Emergency,
}

impl CapacityPool {
    pub fn as_str(&self) -> &'static str {
        match self {
            CapacityPool::Normal => "normal",
            CapacityPool::Low => "low",
            CapacityPool::Emergency => "emergency",
        }
    }
}

/// A storage pool: a named set of targets a directory's files may use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub id: PoolId,
    pub name: String,
    pub targets: Vec<TargetId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub id: EntryId,
    pub kind: FileKind,
}

/// What a request carries besides itself, in one header before its body
/// (frame flag [`crate::FLAG_ENVELOPE`]): which operation of which client
/// it carries out, and whether that client takes attribute leases. Sent
/// only to metadata nodes; other services ignore it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// A non-idempotent request made safe to retry: the metadata node applies
    /// each operation at most once, records the outcome in the same
    /// transaction as the change, and answers a repeat (after a lost
    /// connection or its own restart) with that first outcome.
    pub op: Option<OpId>,
    /// The client, which takes attribute leases from this node: an `Entry`
    /// answer for a non-directory whose inode this node stores comes back as
    /// `Reply::Leased`, and until the lease ends the node tells the client
    /// (through `LeaseWait`) before it acknowledges any change of those
    /// attributes made by someone else.
    pub lease_client: Option<u64>,
    /// A chunk request for a mirrored file (`docs/design-mirror.md`): the
    /// buddy group, the epoch its sender believes in, and who sends it.
    /// Sent only to storage nodes.
    pub mirror: Option<MirrorHdr>,
}

/// Mirroring header of a chunk request (`Envelope::mirror`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorHdr {
    pub group: BuddyGroupId,
    pub epoch: u64,
    pub role: MirrorRole,
    /// A storage primary's forwards and resync requests: the secondary
    /// target's mirroring session they belong to (`MirrorFence`); the
    /// secondary applies only those of its current session. A metadata
    /// primary's resync steps: the attempt (its `Hello` and the full copy
    /// that follows), so that steps of an attempt given up on are refused.
    /// 0 elsewhere.
    pub session: u64,
}

/// Who sends a mirrored chunk request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MirrorRole {
    /// A client (or a metadata node) to the group's primary.
    Client,
    /// The primary to its secondary: a change being mirrored.
    Forward,
    /// The primary to its secondary: a chunk file being resynced.
    Resync,
    /// `hivefs fsck` reading either member's copy (reads and listings only).
    Check,
}

/// Kind of a buddy group's members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupKind {
    /// Two storage targets.
    Storage,
    /// Two metadata nodes.
    Meta,
}

impl GroupKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            GroupKind::Storage => "storage",
            GroupKind::Meta => "meta",
        }
    }
}

/// Consistency of a buddy group member (`docs/design-mirror.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Consistency {
    /// Has every acknowledged change.
    #[default]
    Good,
    /// Misses changes its primary lists.
    NeedsResync,
    /// Its primary is copying the missed changes.
    Resyncing,
    /// Lost its data: only a full resync helps.
    Bad,
}

impl Consistency {
    pub fn as_str(&self) -> &'static str {
        match self {
            Consistency::Good => "good",
            Consistency::NeedsResync => "needs-resync",
            Consistency::Resyncing => "resyncing",
            Consistency::Bad => "bad",
        }
    }
}

/// A buddy group as mgmtd has it. Members are target ids (storage) or
/// metadata node ids (meta).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub id: BuddyGroupId,
    pub kind: GroupKind,
    pub primary: u32,
    pub secondary: u32,
    /// Role switches so far.
    pub epoch: u64,
    pub primary_state: Consistency,
    pub secondary_state: Consistency,
    /// The primary's last reported resync progress: (chunks done, chunks to do).
    pub resync: Option<(u64, u64)>,
    /// A metadata group: the namespace it mirrors (the metadata node id its
    /// entries name as owner, its first primary). `None` for storage groups.
    pub serves: Option<NodeId>,
}

impl Envelope {
    /// Whether the request may be sent again after a lost answer: it is
    /// idempotent itself, or its operation id makes it so.
    pub fn may_repeat(&self, req: &Request) -> bool {
        req.is_idempotent() || self.op.is_some()
    }
}

/// Identity of one non-idempotent operation of one client (see [`Envelope`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpId {
    /// Random per client instance (a mount), chosen at start.
    pub client: u64,
    /// Increases by one per operation of that client.
    pub seq: u64,
    /// Every operation of this client below this sequence number has had its
    /// answer: the server may forget their outcomes.
    pub done_below: u64,
}

/// `rename` flags (as Linux's renameat2).
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// `setxattr` flags (as Linux).
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;
/// HiveFS's `setxattr` flag for `system.posix_acl_access`: the caller is
/// neither in the file's group nor privileged, so setting the ACL clears
/// S_ISGID in the same change (what the kernel asks of FUSE file systems
/// with `FUSE_SETXATTR_ACL_KILL_SGID`, as other file systems do in
/// `posix_acl_update_mode`).
pub const XATTR_ACL_KILL_SGID: u32 = 0x100;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum Request {
    Ping,

    // ---- management (mgmtd) ----
    /// Registers a node. A node that presents a uuid already known gets its old id back.
    RegisterNode {
        node_type: NodeType,
        uuid: String,
        addr: String,
        hostname: String,
    },
    /// Registers a storage target of a registered node (by the uuid in its
    /// `target.toml`), with its current capacity so that it is classified
    /// (capacity pool) from the moment it is known.
    RegisterTarget {
        node: NodeId,
        uuid: String,
        capacity: Capacity,
    },
    Heartbeat {
        node_type: NodeType,
        node: NodeId,
        targets: Vec<TargetCapacity>,
        meta: Option<Capacity>,
    },
    ListNodes {
        node_type: Option<NodeType>,
    },
    ListTargets,
    /// Owner of the root directory (the first metadata node ever registered).
    GetRootOwner,

    // ---- metadata (meta) ----
    Lookup {
        parent: EntryId,
        name: Vec<u8>,
    },
    GetAttr {
        id: EntryId,
    },
    SetAttr {
        id: EntryId,
        attr: SetAttr,
        caller: Caller,
    },
    /// Creates a non-directory, non-symlink entry (regular file, fifo, socket, device).
    Create {
        parent: EntryId,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        rdev: u32,
        excl: bool,
        caller: Caller,
    },
    Mkdir {
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        caller: Caller,
    },
    Unlink {
        parent: EntryId,
        name: Vec<u8>,
    },
    Rmdir {
        parent: EntryId,
        name: Vec<u8>,
    },
    Rename {
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_name: Vec<u8>,
        flags: u32,
    },
    /// Lists entries with names after `after` (exclusive), in name order, at most `max` of them.
    ReadDir {
        dir: EntryId,
        after: Option<Vec<u8>>,
        max: u32,
    },
    Symlink {
        parent: EntryId,
        name: Vec<u8>,
        target: Vec<u8>,
        caller: Caller,
    },
    ReadLink {
        id: EntryId,
    },
    Link {
        id: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
    },
    GetXattr {
        id: EntryId,
        name: Vec<u8>,
    },
    SetXattr {
        id: EntryId,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    ListXattr {
        id: EntryId,
    },
    RemoveXattr {
        id: EntryId,
        name: Vec<u8>,
    },
    SetDirPattern {
        id: EntryId,
        pattern: DirPattern,
    },
    /// A client opens a file; the server counts opens so that an unlinked open file keeps its data.
    Open {
        id: EntryId,
        write: bool,
    },
    /// The last handle of a client on a file is gone. `write`: it may have
    /// changed the file's chunk files (written, truncated, allocated); a
    /// node forgets then that a file it made has none (`ReleaseMany`).
    Release {
        id: EntryId,
        write: bool,
    },
    /// A client reports the size it computed from the chunk files after writing (on close and fsync).
    UpdateSize {
        id: EntryId,
        size: u64,
        mtime: Option<Timespec>,
    },
    MetaStat,

    // ---- storage ----
    /// Payload: the bytes to write at `offset` of the chunk file.
    WriteChunk {
        target: TargetId,
        entry: EntryId,
        offset: u64,
    },
    ReadChunk {
        target: TargetId,
        entry: EntryId,
        offset: u64,
        len: u32,
    },
    TruncateChunk {
        target: TargetId,
        entry: EntryId,
        len: u64,
    },
    UnlinkChunk {
        target: TargetId,
        entry: EntryId,
    },
    StatChunk {
        target: TargetId,
        entry: EntryId,
    },
    FsyncChunk {
        target: TargetId,
        entry: EntryId,
    },

    // ---- storage pools (mgmtd) ----
    /// Creates a storage pool; names are unique.
    CreatePool {
        name: String,
    },
    /// Moves a target into a pool (existing files keep their targets).
    MoveTargetToPool {
        target: TargetId,
        pool: PoolId,
    },
    ListPools,
    /// mgmtd → metadata nodes: targets or pools changed; reload the view
    /// before answering, so new files can use them at once.
    RefreshView,

    // ---- retired ----
    /// Id 38, retired: a request made safe to retry now carries its operation
    /// id in the [`Envelope`]. Servers refuse it.
    RetiredRetryable,

    // ---- fsck (metadata nodes: scans and repairs; storage: chunk listing) ----
    /// Dentries of this node in key order (parent, name), strictly after `after`.
    FsckDentries {
        after: Option<(EntryId, Vec<u8>)>,
        max: u32,
    },
    /// Inodes of this node in id order, strictly after `after`.
    FsckInodes {
        after: Option<EntryId>,
        max: u32,
    },
    /// Disposal records of this node in id order, strictly after `after`.
    FsckDisposals {
        after: Option<EntryId>,
        max: u32,
    },
    /// One repair, applied by the metadata node's writer (transactional,
    /// re-checked against the current records before it writes).
    FsckFix {
        fix: FsckFix,
    },
    /// Chunk files of a storage target with their lengths, in the order
    /// (hash directory, entry id), strictly after `after`.
    ListChunks {
        target: TargetId,
        after: Option<EntryId>,
        max: u32,
    },

    // ---- benchmarks (`hivefs bench`) ----
    /// StorageBench: the storage node writes, then reads back, `bytes_per_target`
    /// bytes on each of `targets` (all its targets when empty) in scratch files
    /// under the target's `bench/` (removed afterwards), with no network in the
    /// data path. Not idempotent: a repeat would run the benchmark again.
    StorageBench {
        targets: Vec<TargetId>,
        bytes_per_target: u64,
        block_bytes: u32,
        threads: u32,
        direct: bool,
    },
    /// NetBench: the payload is received and discarded (no disk I/O).
    NetBenchWrite,
    /// NetBench: answered with `len` zero bytes (no disk I/O).
    NetBenchRead {
        len: u32,
    },
    /// Requests this metadata node has answered since it started.
    MetaOpCount,

    // ---- global file locks (meta; in memory only, see the meta crate's `locks`) ----
    /// Sets `lock` (shared or exclusive) for its owner, replacing what that
    /// owner held in the range (POSIX split/merge; upgrade and downgrade).
    /// Refused with `Reply::Lock(Some(conflicting lock))`; with `wait_ms > 0`
    /// the node first waits up to that long for the conflict to go away.
    /// Setting the same lock twice is harmless, so a client may send it again.
    LockAcquire {
        entry: EntryId,
        lock: FileLock,
        wait_ms: u32,
    },
    /// Unlocks the range `lock.start..=lock.end` of `lock`'s owner and kind
    /// (`exclusive` is ignored). The whole range drops everything the owner holds.
    LockRelease {
        entry: EntryId,
        lock: FileLock,
    },
    /// F_GETLK: the first lock of another owner that conflicts with `lock`,
    /// as `Reply::Lock`.
    LockTest {
        entry: EntryId,
        lock: FileLock,
    },
    /// A client (mount) is alive: the node keeps its locks for another
    /// lease. Answered with `Reply::LockLease`.
    LockKeepAlive {
        client: u64,
    },

    // ---- several metadata nodes (meta ↔ meta, see the meta crate's `multi`) ----
    /// One step of a cross-node operation, sent by the metadata node that
    /// coordinates it. Every step is idempotent (keyed by the entry or the
    /// intent id), so the coordinator repeats it until it gets an answer.
    MetaPeer {
        op: PeerOp,
    },
    /// `Rename` where the new parent is owned by another metadata node than
    /// the old parent (sent to the old parent's owner).
    RenameTo {
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_parent_owner: NodeId,
        new_name: Vec<u8>,
        flags: u32,
    },
    /// Sets the metadata-node chooser of a directory (inherited by new subdirectories).
    SetMetaChooser {
        id: EntryId,
        chooser: MetaChooser,
    },
    /// The metadata-node chooser of a directory, as `Reply::MetaChooser`.
    GetMetaChooser {
        id: EntryId,
    },
    /// Pending cross-node operations of this metadata node (`Reply::FsckIntents`).
    FsckIntents,
    /// `Link` where the new parent is owned by another metadata node than
    /// the inode (sent to the inode's owner, which keeps the link count).
    LinkTo {
        id: EntryId,
        new_parent: EntryId,
        new_parent_owner: NodeId,
        new_name: Vec<u8>,
    },
    /// `Create` of a regular file that also opens it (counted like `Open`),
    /// answered with the new entry's attributes and pattern: one round trip
    /// for open(O_CREAT). Sent with an operation id; the open is counted once.
    CreateOpen {
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        excl: bool,
        caller: Caller,
    },
    /// Deletes the chunk files of `entries` on `target` (storage), in one
    /// go; a missing chunk file is success. At most [`UNLINK_CHUNKS_MAX`]
    /// entries: a longer batch is refused with `Invalid`. On failure the
    /// error names the target and the first entry that failed; repeating
    /// the whole batch is safe.
    UnlinkChunks {
        target: TargetId,
        entries: Vec<EntryId>,
    },
    // ---- attribute leases (client ↔ meta, see the meta crate's `leases`) ----
    /// Id 60, retired: a client that takes attribute leases now says so in
    /// the [`Envelope`]. Servers refuse it.
    RetiredLeasing,
    /// A client's long poll for revoked leases: it has handled every
    /// revocation up to sequence number `acked`; the node answers with
    /// `Reply::Revoked` as soon as there are new ones, or empty after at most
    /// `wait_ms`. A client takes leases from a node only while it polls it.
    LeaseWait {
        client: u64,
        acked: u64,
        wait_ms: u32,
    },

    // ---- storage (continued) ----
    /// fallocate(2) of local `[offset, offset+len)` of a chunk file. `mode`:
    /// 0 (allocate; the chunk file grows to `offset+len`),
    /// [`FALLOC_KEEP_SIZE`] (allocate only), [`FALLOC_PUNCH_HOLE`]` |
    /// KEEP_SIZE` (free; reads as zeroes), [`FALLOC_ZERO_RANGE`] with or
    /// without KEEP_SIZE (zeroes, allocated). Any other mode is refused with
    /// `NotSupported`. Allocations create a missing chunk file; punching and
    /// zeroing within the size leave a missing one missing (it reads as zeroes).
    FallocateChunk {
        target: TargetId,
        entry: EntryId,
        mode: u32,
        offset: u64,
        len: u64,
    },
    /// Where the chunk file's next data (`hole: false`, lseek's SEEK_DATA)
    /// or hole (`hole: true`, SEEK_HOLE; the end of the chunk file counts as
    /// one) is at or after local `offset`: `Reply::Seek(None)` where there is
    /// none (lseek's ENXIO; a missing chunk file has neither).
    SeekChunk {
        target: TargetId,
        entry: EntryId,
        offset: u64,
        hole: bool,
    },
    /// Server-side copy (copy_file_range) of one piece, sent to the node of
    /// the destination target. It copies within its own disks, or reads the
    /// source from the node of `src_target`; the bytes never pass through
    /// the client. Answer: `Written(len)`.
    CopyChunk(ChunkCopy),
    /// A client read `id` at time `at`: its access time moves to `at` (never
    /// back), always with `strict` (strictatime), else only when the access
    /// time is not newer than the modification or change time or is a day
    /// old (relatime, Linux's rule). The change time stays. Answer: `Entry`.
    TouchAtime {
        id: EntryId,
        at: Timespec,
        strict: bool,
    },
    /// The first page of a listing (`ReadDir` with no `after`), with the
    /// directory's parent (for the `..` entry's inode number). Answer:
    /// `DirPageFirst`.
    ReadDirFirst {
        dir: EntryId,
        max: u32,
    },

    // ---- buddy mirroring (mgmtd) ----
    /// Makes a buddy group of two members of `kind` (target ids or metadata
    /// node ids). Refused when they share a server unless `force`. Answer:
    /// `GroupCreated`.
    CreateGroup {
        kind: GroupKind,
        primary: u32,
        secondary: u32,
        force: bool,
    },
    /// Answer: `Groups`.
    ListGroups {
        kind: Option<GroupKind>,
    },
    /// Sets the consistency of `member` of `group`, sent by the group's
    /// primary at `epoch` (refused when the epoch is not current: a stale
    /// primary cannot change its group) or by an administrator (`epoch`
    /// `None`, only to `NeedsResync` or `Bad`, to ask for a resync).
    SetMemberState {
        group: BuddyGroupId,
        epoch: Option<u64>,
        member: u32,
        state: Consistency,
    },
    /// A primary's resync progress for its group: (chunks done, chunks to do).
    ResyncProgress {
        group: BuddyGroupId,
        done: u64,
        total: u64,
    },
    /// The lengths of `entry`'s chunk files on several (unmirrored) targets
    /// of this storage node, at most [`STAT_CHUNKS_MAX`]: one request where
    /// a file's size needs every target of a server. Answer: `ChunkLens`, in
    /// the order of `targets` (0 where there is no chunk file).
    StatChunks {
        entry: EntryId,
        targets: Vec<TargetId>,
    },
    /// `LeaseWait` of a client that also takes leases on the names of whole
    /// directories: the node may wrap its answers in `Reply::DirNames`.
    /// An older node answers `Protocol`; the client then polls with `LeaseWait`.
    LeaseWaitDirs {
        client: u64,
        acked: u64,
        wait_ms: u32,
    },
    /// `Release` of several handles at once (at most [`RELEASE_MANY_MAX`]),
    /// sent by a client in the background. Answer: `Ok` (a handle the node
    /// does not count is skipped, as `Release` would). `wrote`: the entries
    /// of `ids` whose chunk files the client changed through them (each
    /// released as `Release { write: true }`, the others with `false`).
    /// A node that made a file and heard of no write to it removes it
    /// without deleting chunk files on its targets.
    ReleaseMany {
        ids: Vec<EntryId>,
        wrote: Vec<EntryId>,
    },
    /// A step of metadata buddy mirroring, from a group's primary to its
    /// secondary (`Envelope::mirror` names the group and the epoch;
    /// `docs/design-mirror.md`, "Metadata groups"). The payload carries a
    /// journal record body (`Record`) or a piece of a full copy (`Piece`).
    MetaMirror {
        step: MetaStep,
    },
    /// CRC-32 of the whole contents of `entries`' chunk files on `target`
    /// (at most [`DIGEST_CHUNKS_MAX`]): `hivefs fsck` comparing a storage
    /// buddy group's two copies. Answer: `ChunkDigests`, in order (`None`
    /// where there is no chunk file).
    DigestChunks {
        target: TargetId,
        entries: Vec<EntryId>,
    },
    /// The answering process's metrics in Prometheus text format (`hivefs stats`);
    /// answered by the server loop of every service. Answer: `Metrics`.
    Metrics,
    /// Modification events of a metadata node with a sequence number above `after`
    /// (at most `max`, at most [`EVENTS_MAX`]); with none yet, waits up to `wait_ms`
    /// (at most 10 s) for one. `after = u64::MAX` asks only where the stream stands.
    /// Answer: `Events`.
    Events {
        after: u64,
        max: u32,
        wait_ms: u32,
    },
    /// Inodes and bytes a metadata node's entries hold per user and per
    /// group (`docs/design-quota.md`); `ids` empty: every user and group
    /// that holds any (at most [`QUOTA_IDS_MAX`] asked). Answer: `QuotaUsage`.
    QuotaUsage {
        ids: Vec<QuotaId>,
    },
    /// mgmtd: sets (or with both `None`, removes) the limits of one user or
    /// group. Answer: `Ok`.
    SetQuota(QuotaLimit),
    /// mgmtd: every limit with the usage mgmtd last gathered from the
    /// metadata nodes. Answer: `Quotas`.
    GetQuotas,
    /// mgmtd, from the metadata node serving `namespace` (every
    /// `interval_ms` of the last answer): what that namespace's inodes hold
    /// for the users and groups with a limit. Answer: `Quotas`, which
    /// carries the sum over every namespace's last report.
    QuotaReport {
        namespace: NodeId,
        usage: Vec<(QuotaId, QuotaUse)>,
        /// The same users' and groups' regular files by the first stripe
        /// unit of their pattern (inodes: files): mgmtd sums them per pool.
        by_unit: Vec<(QuotaId, StripeUnit, QuotaUse)>,
    },
    /// From a storage group's primary to its secondary `target`
    /// (`Envelope::mirror` names the group and the epoch): starts a new
    /// mirroring session once every request of the older sessions still
    /// running there has finished; later requests of older sessions are
    /// refused (`docs/design-mirror.md`, "Sessions"). Answer: `Fenced`.
    MirrorFence {
        target: TargetId,
    },
    /// A client reports the size its own writes reached (`size`: a lower
    /// bound of the file's size, not read off the chunk files), applied as
    /// `UpdateSize` only if the file's ctime is still `ctime`, the one the
    /// client last saw: no other change (a truncation, say) came between.
    /// Otherwise nothing changes and the answer is `Busy`: the client then
    /// computes the size from the chunk files and sends `UpdateSize`.
    UpdateSizeIf {
        id: EntryId,
        size: u64,
        mtime: Option<Timespec>,
        ctime: Timespec,
    },
    /// From a client taking leases on directories' names, to the owner of
    /// directory `dir` it just made through another metadata node (the
    /// parent's): answered `Entry` with the directory's attributes and,
    /// while the directory has no entries, a lease on its (empty) set of
    /// names, as a mkdir the owner ran itself gives (`Reply::DirNames`);
    /// `Ok` (no lease) once it has entries.
    LeaseDirNames {
        dir: EntryId,
    },
    /// `MetaPeer` for a step of intent `intent` (a cross-node operation of
    /// the namespace `intent.node`), applied at most once ever: the peer
    /// records the answer under the intent and the step, and answers a
    /// repeat with it. `floor` is the coordinator's lowest unfinished
    /// intent (at most `intent`): every intent below it has finished, so
    /// the peer drops its records of them and refuses their steps, which
    /// can then only be late deliveries (a request the coordinator gave up
    /// on). A peer that does not know this request answers `Protocol`, and
    /// the coordinator sends `MetaPeer` instead.
    PeerStep {
        intent: EntryId,
        floor: EntryId,
        op: PeerOp,
    },
    /// `ReleaseMany` that says where each handle wrote: per handle the file
    /// and the stripe positions whose chunk files the client changed
    /// through it (empty: none). At most [`RELEASE_MANY_MAX`] handles;
    /// answer `Ok`. A node that made a file and knows every position
    /// written to it deletes chunk files only on those targets at its
    /// removal. A node that does not know this request answers `Protocol`,
    /// and the client sends `ReleaseMany` instead.
    ReleaseWritten {
        handles: Vec<(EntryId, StripeSet)>,
    },
    /// Ends the waits of `LockAcquire` requests on `entry` of `lock`'s
    /// client, owner and kind (the range and type are ignored): each answers
    /// at once, refused by the lock it waits for, unless granted first. Sent
    /// when the waiting process was interrupted by a signal. Answer `Ok`,
    /// also when nothing waited (the client sends it again while its
    /// `LockAcquire` has not come back). A node that does not know this
    /// request answers `Protocol`; the wait then runs to its `wait_ms`.
    LockCancel {
        entry: EntryId,
        lock: FileLock,
    },
    /// `CreateOpen` whose handle holds the file's size (answered as
    /// `CreateOpen`): the client reports the size its writes through the
    /// handle leave with the handle's release (`ReleaseSized`), not at
    /// close. From the answer until that release the node answers others'
    /// requests for the file's attributes with the size read off its chunk
    /// files, and leases those attributes to nobody else. Only from a
    /// client that takes leases (the envelope names it). A node that does
    /// not know this request answers `Protocol`, and the client sends
    /// `CreateOpen` and reports sizes at close.
    CreateOpenHeld {
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        excl: bool,
        caller: Caller,
    },
    /// `ReleaseWritten` whose handles may carry the size their writes left
    /// (handles opened with `CreateOpenHeld`): each size lands (as
    /// `UpdateSizeIf`, or read off the chunk files when the file changed
    /// since the client saw it) before the handle is released. At most
    /// [`RELEASE_MANY_MAX`] handles; answer `Landed`. The envelope names
    /// the client. A node that does not know this request answers `Protocol`.
    ReleaseSized {
        handles: Vec<SizedRelease>,
    },
    /// Entry ids and stripe patterns for up to [`RESERVE_MAX`] regular
    /// files the client will make in `parent` ahead of telling this node
    /// (write-back creates, `CreateMany`); answer `Reserved`. Only for a
    /// client holding the lease on `parent`'s names (the envelope names
    /// it); refused (`NotSupported`) where the node could not make the file
    /// as the client would (a default ACL or the setgid bit on `parent`,
    /// quota limits). From then on another client's request that reads or
    /// changes `parent`'s names first recalls that lease, which the client
    /// gives back only after its creates there have landed.
    ReserveCreates {
        parent: EntryId,
        count: u32,
    },
    /// Regular files the client made in `parent` under ids and patterns
    /// this node reserved for it (`ReserveCreates`), each open with a
    /// handle that holds its size (as `CreateOpenHeld`); at most
    /// [`CREATE_MANY_MAX`]. A file already made under its id by an earlier
    /// attempt counts as made (so a repeat is harmless). Answer `CreatedMany`.
    CreateMany {
        parent: EntryId,
        files: Vec<NewFile>,
    },
}

/// One file of `Request::CreateMany`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewFile {
    pub name: Vec<u8>,
    /// Reserved by `ReserveCreates`, with its pattern.
    pub id: EntryId,
    pub pattern: Pattern,
    pub mode: u32,
    pub caller: Caller,
    /// When the client made it (its times).
    pub at: Timespec,
}

/// Most ids one `ReserveCreates` hands out.
pub const RESERVE_MAX: u32 = 1024;
/// Most files in one `CreateMany`.
pub const CREATE_MANY_MAX: usize = 1024;

/// One handle of `Request::ReleaseSized`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizedRelease {
    pub id: EntryId,
    /// Stripe positions whose chunk files the client changed through it.
    pub wrote: StripeSet,
    /// Opened with `CreateOpenHeld`: the handle held the file's size.
    pub held: bool,
    /// The size a held handle's writes left (`None`: it wrote nothing
    /// since its size was last reported).
    pub size: Option<HeldSize>,
}

/// A size a client held for its metadata node (`Request::ReleaseSized`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSize {
    /// Where the client's writes end (the size the file had at open counts).
    pub size: u64,
    /// The time of the client's last write.
    pub mtime: Timespec,
    /// The file's ctime as the client last saw it, while `size` is exact
    /// (`UpdateSizeIf`); `None`: the node reads the size off the chunk files.
    pub seen: Option<Timespec>,
}

/// Most users and groups one `QuotaUsage` request names.
pub const QUOTA_IDS_MAX: usize = 65_536;

/// Whose usage a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QuotaKind {
    User,
    Group,
}

impl QuotaKind {
    pub fn name(self) -> &'static str {
        match self {
            QuotaKind::User => "user",
            QuotaKind::Group => "group",
        }
    }
}

/// A user (uid) or a group (gid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QuotaId {
    pub kind: QuotaKind,
    pub id: u32,
}

/// What one user's or group's entries hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUse {
    /// Files, directories, symlinks and special files.
    pub inodes: u64,
    /// The lengths of their regular files.
    pub bytes: u64,
}

/// The limits of one user or group (`None`: unlimited), on the whole file
/// system or (`pool`) on the regular files of one storage pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLimit {
    pub who: QuotaId,
    pub pool: Option<PoolId>,
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

/// A limit and the usage mgmtd last gathered for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaState {
    pub limit: QuotaLimit,
    pub used: QuotaUse,
}

impl QuotaState {
    /// `extra_inodes` more inodes or `extra_bytes` more bytes would pass a limit.
    pub fn exceeded_by(&self, extra_inodes: u64, extra_bytes: u64) -> bool {
        let over = |limit: Option<u64>, used: u64, extra: u64| limit.is_some_and(|l| used.saturating_add(extra) > l);
        over(self.limit.inodes, self.used.inodes, extra_inodes) || over(self.limit.bytes, self.used.bytes, extra_bytes)
    }
}

/// Most events one `Events` answer carries.
pub const EVENTS_MAX: u32 = 4096;

/// What a file-system modification event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    Create,
    Mknod,
    Mkdir,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    SetAttr,
    Truncate,
    /// A file's size and modification time published at its close after writes.
    CloseWrite,
    SetXattr,
    RemoveXattr,
    SetPattern,
}

impl EventKind {
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Create => "create",
            EventKind::Mknod => "mknod",
            EventKind::Mkdir => "mkdir",
            EventKind::Symlink => "symlink",
            EventKind::Link => "link",
            EventKind::Unlink => "unlink",
            EventKind::Rmdir => "rmdir",
            EventKind::Rename => "rename",
            EventKind::SetAttr => "setattr",
            EventKind::Truncate => "truncate",
            EventKind::CloseWrite => "close_write",
            EventKind::SetXattr => "setxattr",
            EventKind::RemoveXattr => "removexattr",
            EventKind::SetPattern => "setpattern",
        }
    }
}

/// A file-system modification event, numbered per metadata node in commit order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    /// Commit time, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    pub kind: EventKind,
    /// The entry made, changed or linked (for unlink, rmdir and rename: not known,
    /// see parent and name).
    pub entry: Option<EntryId>,
    /// The directory and name concerned (made, removed, or a rename's source).
    pub parent: Option<EntryId>,
    pub name: Vec<u8>,
    /// A rename's or link's destination.
    pub new_parent: Option<EntryId>,
    pub new_name: Vec<u8>,
    /// The user, where the request names one (creates).
    pub uid: Option<u32>,
}

/// What a metadata group's primary asks of its secondary (`Request::MetaMirror`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaStep {
    /// Journal batch `seq` (payload: its body), forwarded before the
    /// primary's own append, or resent by a resync. Answer: `Ok`; `Invalid`
    /// with `ReplicaAt` numbers in the message when it does not follow the
    /// secondary's last batch.
    Record { seq: u64 },
    /// Which batch the secondary holds last. Answer: `ReplicaAt`.
    Hello,
    /// A full copy of the namespace as of batch `seq` (whose checksum is
    /// `crc`) begins: the secondary closes its copy and starts a new one.
    /// Answer: `Ok`.
    Begin { seq: u64, crc: Option<u32> },
    /// Records of the full copy (payload: a record body of puts). Answer: `Ok`.
    Piece,
    /// The full copy is complete: the secondary puts it in place of its
    /// old copy and takes records after `seq` again. Answer: `ReplicaAt`.
    Finish,
    /// (`hivefs fsck` to the primary, role `Check`.) Compare both copies
    /// at one batch, commits held: answer `ReplicaAt` with the digest when
    /// they are equal, `Io` naming both digests when they differ,
    /// `Unavailable` when the secondary is not current (a resync is due).
    Compare,
    /// (The primary to the secondary.) A digest of every record of the
    /// copy. Answer: `ReplicaAt { seq, crc: Some(digest) }`.
    Digest,
}

/// `len` bytes (at most `MAX_PAYLOAD_LEN`) from `src_offset` of
/// `src_entry`'s chunk file on `src_target` to `offset` of `entry`'s chunk
/// file on `target` (`Request::CopyChunk`). Source bytes past the source
/// chunk file's end are zeroes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkCopy {
    pub target: TargetId,
    pub entry: EntryId,
    pub offset: u64,
    pub src_target: TargetId,
    pub src_entry: EntryId,
    pub src_offset: u64,
    pub len: u32,
}

/// `FallocateChunk` mode bits, as Linux's fallocate(2) numbers them.
pub const FALLOC_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_ZERO_RANGE: u32 = 0x10;

/// Most entries one `UnlinkChunks` request may carry.
pub const UNLINK_CHUNKS_MAX: usize = 1024;

/// Most chunk files one `DigestChunks` request may name.
pub const DIGEST_CHUNKS_MAX: usize = 1024;

/// Most handles one `ReleaseMany` request may release.
pub const RELEASE_MANY_MAX: usize = 4096;

/// Most targets one `StatChunks` request may name (a stripe's most targets).
pub const STAT_CHUNKS_MAX: usize = 65_536;

/// Most entries one `Reply::Revoked` carries (more wait for the next poll).
pub const REVOKED_MAX: usize = 16384;

/// A dentry as `hivefs fsck` sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckDentry {
    pub parent: EntryId,
    pub name: Vec<u8>,
    pub id: EntryId,
    pub kind: FileKind,
    /// Metadata node holding the inode `id`.
    pub owner: NodeId,
}

/// An inode as `hivefs fsck` sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckInode {
    pub id: EntryId,
    pub kind: FileKind,
    pub nlink: u32,
    pub size: u64,
    pub pattern: Option<hivefs_types::pattern::Pattern>,
    pub parent: Option<EntryId>,
    /// A client holds the entry open (its size may be changing).
    pub open: bool,
}

/// A disposal record as `hivefs fsck` sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckDisposal {
    pub id: EntryId,
    /// `true`: unlinked while open (inode kept, nlink 0); `false`: chunk files to delete.
    pub open_unlinked: bool,
    pub targets: Vec<TargetId>,
}

/// Repairs of a metadata node's records. Each names the state it expects
/// and is refused with `Busy` when the records changed since the check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsckFix {
    /// Removes the dentry `parent/name` if it still names `id` and `id` has no inode here.
    RemoveDentry { parent: EntryId, name: Vec<u8>, id: EntryId },
    /// Sets the link count of `id` from `from` to `to`.
    SetNlink { id: EntryId, from: u32, to: u32 },
    /// Sets the cached size of file `id` from `from` to `to`.
    SetSize { id: EntryId, from: u64, to: u64 },
    /// Sets the parent pointer of directory `id`.
    SetParent { id: EntryId, from: Option<EntryId>, to: EntryId },
    /// Removes an unlinked inode (nlink 0, no `OpenUnlinked` record, not
    /// open) and queues its chunk files for deletion.
    DropUnlinked { id: EntryId },
    /// Gives an inode that no dentry names (nlink > 0) the name `<id>` in
    /// `/lost+found` (created on demand; needs the root on this node).
    LostFound { id: EntryId },
    /// Counts every inode's quota usage again and compares it with the
    /// records (answer: `UsageDiff`); with `apply`, replaces the wrong ones
    /// (answer: `FsckFixed`).
    CountUsage { apply: bool },
}

impl Request {
    /// The variant name, for messages (no field contents).
    pub fn name(&self) -> String {
        self.kind().to_string()
    }

    /// The variant name without an allocation (a metric label).
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// The user a namespace request runs for, when it names one.
    pub fn caller(&self) -> Option<Caller> {
        match self {
            Request::SetAttr { caller, .. }
            | Request::Create { caller, .. }
            | Request::Mkdir { caller, .. }
            | Request::Symlink { caller, .. }
            | Request::CreateOpen { caller, .. }
            | Request::CreateOpenHeld { caller, .. } => Some(*caller),
            _ => None,
        }
    }

    /// The name (parent, name) a successful answer to this request maps to
    /// the answered entry, and which the answering node stores: a lookup of
    /// a real name, or a name the request creates there.
    /// Refuses a request whose list is longer than its message's bound
    /// ([`STAT_CHUNKS_MAX`], [`RELEASE_MANY_MAX`]): checked by the service
    /// before any work.
    pub fn check_batch(&self) -> Result<(), FsError> {
        let (what, len, max) = match self {
            Request::StatChunks { targets, .. } => ("targets", targets.len(), STAT_CHUNKS_MAX),
            Request::ReleaseMany { ids, wrote } => ("handles", ids.len().max(wrote.len()), RELEASE_MANY_MAX),
            Request::ReleaseWritten { handles } => ("handles", handles.len(), RELEASE_MANY_MAX),
            Request::ReleaseSized { handles } => ("handles", handles.len(), RELEASE_MANY_MAX),
            Request::CreateMany { files, .. } => ("files", files.len(), CREATE_MANY_MAX),
            Request::ReserveCreates { count, .. } => ("ids", *count as usize, RESERVE_MAX as usize),
            Request::DigestChunks { entries, .. } => ("chunk files", entries.len(), DIGEST_CHUNKS_MAX),
            Request::QuotaUsage { ids } => ("users and groups", ids.len(), QUOTA_IDS_MAX),
            Request::QuotaReport { usage, by_unit, .. } => {
                ("users and groups", usage.len().max(by_unit.len()), QUOTA_IDS_MAX)
            }
            _ => return Ok(()),
        };
        if len > max {
            return Err(FsError::new(
                hivefs_types::error::ErrorCode::Invalid,
                format!("{} names {len} {what}, more than {max}", self.name()),
            ));
        }
        Ok(())
    }

    pub fn names(&self) -> Option<(EntryId, &[u8])> {
        match self {
            Request::Lookup { parent, name } if name != b"." && name != b".." => Some((*parent, name)),
            Request::Create { parent, name, .. }
            | Request::CreateOpen { parent, name, .. }
            | Request::CreateOpenHeld { parent, name, .. }
            | Request::Mkdir { parent, name, .. }
            | Request::Symlink { parent, name, .. } => Some((*parent, name)),
            Request::Link { new_parent, new_name, .. } => Some((*new_parent, new_name)),
            _ => None,
        }
    }

    /// The directory whose entries the request changes, when it is one
    /// directory (a rename's two are not covered): the one whose attributes
    /// `Reply::WithParent` carries.
    pub fn changed_dir(&self) -> Option<EntryId> {
        match self {
            Request::Create { parent, .. }
            | Request::CreateOpen { parent, .. }
            | Request::CreateOpenHeld { parent, .. }
            | Request::CreateMany { parent, .. }
            | Request::Mkdir { parent, .. }
            | Request::Symlink { parent, .. }
            | Request::Unlink { parent, .. }
            | Request::Rmdir { parent, .. } => Some(*parent),
            Request::Link { new_parent, .. } => Some(*new_parent),
            _ => None,
        }
    }

    /// The storage target a chunk request names, to be replaced by the
    /// current primary when it goes to a buddy group (`None` for other requests).
    pub fn chunk_target_mut(&mut self) -> Option<&mut TargetId> {
        match self {
            Request::WriteChunk { target, .. }
            | Request::ReadChunk { target, .. }
            | Request::TruncateChunk { target, .. }
            | Request::UnlinkChunk { target, .. }
            | Request::UnlinkChunks { target, .. }
            | Request::StatChunk { target, .. }
            | Request::FsyncChunk { target, .. }
            | Request::ListChunks { target, .. }
            | Request::FallocateChunk { target, .. }
            | Request::SeekChunk { target, .. }
            | Request::DigestChunks { target, .. } => Some(target),
            Request::CopyChunk(c) => Some(&mut c.target),
            _ => None,
        }
    }

    /// Requests that may be sent again after a timeout without changing the outcome.
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self,
            Request::Ping
                | Request::RegisterNode { .. }
                | Request::RegisterTarget { .. }
                | Request::Heartbeat { .. }
                | Request::ListNodes { .. }
                | Request::ListTargets
                | Request::GetRootOwner
                | Request::Lookup { .. }
                | Request::GetAttr { .. }
                | Request::ReadDir { .. }
                | Request::ReadLink { .. }
                | Request::GetXattr { .. }
                | Request::ListXattr { .. }
                | Request::MetaStat
                | Request::UpdateSize { .. }
                // A repeat finds the ctime the first one set: Busy, and the
                // client falls back to `UpdateSize`.
                | Request::UpdateSizeIf { .. }
                | Request::LeaseDirNames { .. }
                // A file made by the first attempt counts as made.
                | Request::CreateMany { .. }
                // A repeat hands out other ids; the first ones go unused.
                | Request::ReserveCreates { .. }
                | Request::LockCancel { .. }
                | Request::PeerStep { .. }
                | Request::WriteChunk { .. }
                | Request::ReadChunk { .. }
                | Request::TruncateChunk { .. }
                | Request::UnlinkChunk { .. }
                | Request::UnlinkChunks { .. }
                | Request::StatChunk { .. }
                | Request::StatChunks { .. }
                | Request::DigestChunks { .. }
                | Request::Metrics
                | Request::Events { .. }
                | Request::QuotaUsage { .. }
                | Request::SetQuota(_)
                | Request::GetQuotas
                | Request::QuotaReport { .. }
                | Request::FsyncChunk { .. }
                | Request::MoveTargetToPool { .. }
                | Request::ListPools
                | Request::RefreshView
                | Request::FsckDentries { .. }
                | Request::FsckInodes { .. }
                | Request::FsckDisposals { .. }
                | Request::ListChunks { .. }
                | Request::NetBenchWrite
                | Request::NetBenchRead { .. }
                | Request::MetaOpCount
                | Request::MetaPeer { .. }
                | Request::LeaseWait { .. }
                | Request::LeaseWaitDirs { .. }
                | Request::GetMetaChooser { .. }
                | Request::FsckIntents
                | Request::FallocateChunk { .. }
                | Request::SeekChunk { .. }
                | Request::CopyChunk(_)
                // Moves the access time forward to a given time: a repeat changes nothing.
                | Request::TouchAtime { .. }
                | Request::ReadDirFirst { .. }
                | Request::ListGroups { .. }
                | Request::SetMemberState { .. }
                | Request::ResyncProgress { .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Pong {
        node_type: NodeType,
        node: NodeId,
    },
    NodeRegistered {
        node: NodeId,
    },
    TargetRegistered {
        target: TargetId,
        pool: PoolId,
    },
    Nodes(Vec<NodeInfo>),
    Targets(Vec<TargetInfo>),
    RootOwner(Option<NodeId>),
    Entry(EntryAttr),
    DirPage {
        entries: Vec<DirEntry>,
        more: bool,
    },
    LinkTarget(Vec<u8>),
    Xattr(Vec<u8>),
    XattrNames(Vec<Vec<u8>>),
    MetaStat {
        files: u64,
        dirs: u64,
        capacity: Capacity,
    },
    Written(u32),
    /// The frame's payload carries the bytes read (short at the end of the chunk file).
    Data,
    ChunkLen(u64),
    PoolCreated {
        pool: PoolId,
    },
    Pools(Vec<PoolInfo>),
    FsckDentries {
        entries: Vec<FsckDentry>,
        more: bool,
    },
    FsckInodes {
        inodes: Vec<FsckInode>,
        more: bool,
    },
    FsckDisposals {
        records: Vec<FsckDisposal>,
        more: bool,
    },
    /// `(entry, chunk file length)` in listing order.
    Chunks {
        chunks: Vec<(EntryId, u64)>,
        more: bool,
    },
    /// What an `FsckFix` did (for the report).
    FsckFixed(String),
    /// Answer to `StorageBench`: one result per target, in request order.
    StorageBench(Vec<TargetBench>),
    /// Answer to `MetaOpCount`.
    MetaOpCount {
        node: NodeId,
        requests: u64,
    },
    /// Answer to `LockAcquire` (`None`: granted) and `LockTest` (`None`: free):
    /// otherwise the conflicting lock.
    Lock(Option<FileLock>),
    /// Answer to `LockKeepAlive`: the node drops the locks of a client not
    /// heard from for `lease_ms`; `known` is false when it had no lease for
    /// the client (expired, or the node restarted: its locks are gone).
    LockLease {
        lease_ms: u64,
        known: bool,
    },
    /// Answer to `PeerOp::GetParent`: a directory's parent and the node owning it.
    DirParent {
        parent: EntryId,
        owner: NodeId,
    },
    /// Answer to `GetMetaChooser`.
    MetaChooser(MetaChooser),
    /// Answer to `FsckIntents`: one line per pending cross-node operation.
    FsckIntents(Vec<String>),
    /// Answer to a lease client's request (`Envelope::lease_client`): the
    /// entry, and for how long (from when the client sent the request) it may
    /// cache these attributes.
    Leased {
        attr: EntryAttr,
        lease_ms: u32,
        /// Lease on the name the request looked up or created
        /// ([`Request::names`]): how long the client may keep it (0: none).
        name_ms: u32,
    },
    /// Answer to `LeaseWait`: the client must drop its cached attributes of
    /// `ids` (at most [`REVOKED_MAX`]), then acknowledge `upto` in its next
    /// `LeaseWait`.
    Revoked {
        ids: Vec<EntryId>,
        /// A name the client leased changed: it must drop every cached name.
        names: bool,
        upto: u64,
    },
    /// Answer to a lease client's change of a directory's entries: the
    /// answer, and the directory's attributes as read after the change.
    WithParent {
        parent: EntryAttr,
        reply: Box<Reply>,
    },
    /// Answer to `SeekChunk`: the local offset found (`None`: lseek's ENXIO).
    Seek(Option<u64>),
    /// Answer to `ReadDirFirst`: a `DirPage` and the directory's parent (the root's is itself).
    DirPageFirst {
        parent: EntryId,
        entries: Vec<DirEntry>,
        more: bool,
    },
    GroupCreated {
        group: BuddyGroupId,
    },
    Groups(Vec<GroupInfo>),
    /// Answer to `Heartbeat`: the sender may act as a group's primary until
    /// `lease_ms` after it sent this heartbeat (`docs/design-mirror.md`).
    HeartbeatAck {
        lease_ms: u64,
    },
    /// Answer to `StatChunks`.
    ChunkLens(Vec<u64>),
    /// Answer to a request of a client that polls with `LeaseWaitDirs`:
    /// the answer, and leases on the set of names of directories (`(dir,
    /// ms)`, from when the client sent the request): until one ends, the
    /// node revokes it (as `Revoked::ids` naming the directory) before it
    /// acknowledges anyone else's new name in that directory. The
    /// directory a `Mkdir` made is granted empty; others are renewals of a
    /// lease the client holds.
    DirNames {
        grants: Vec<(EntryId, u32)>,
        reply: Box<Reply>,
    },
    /// Answer to `MetaMirror { Hello | Finish }`: the last journal batch the
    /// secondary holds of the namespace, and its checksum when its journal
    /// still has it (`None`: only a full copy can be trusted to follow).
    ReplicaAt {
        seq: u64,
        crc: Option<u32>,
    },
    /// Answer to `DigestChunks`.
    ChunkDigests(Vec<Option<u32>>),
    /// Answer to `Metrics`.
    Metrics(String),
    /// Answer to `Events`: the node's stream (`boot` changes when it restarts and
    /// numbering starts again), the oldest sequence number still held, the last one
    /// given out (0: none yet), events dropped from the buffer since it started, and
    /// the events.
    Events {
        node: NodeId,
        boot: u64,
        oldest: u64,
        last: u64,
        dropped: u64,
        events: Vec<Event>,
    },
    /// Answer to `FsckFix::CountUsage` without `apply`: each user and group
    /// whose usage record differs from a count of the inodes: (who,
    /// recorded, counted).
    UsageDiff(Vec<(QuotaId, QuotaUse, QuotaUse)>),
    /// Answer to `QuotaUsage`, sorted by id.
    QuotaUsage(Vec<(QuotaId, QuotaUse)>),
    /// Answer to `GetQuotas` and `QuotaReport`: every limit and its usage,
    /// summed over the namespaces' last reports, the oldest of which is
    /// `age_ms` old (`u64::MAX`: none yet), and how often namespaces report.
    Quotas {
        interval_ms: u64,
        age_ms: u64,
        quotas: Vec<QuotaState>,
    },
    /// Answer to `MirrorFence`: the secondary's new session.
    Fenced {
        session: u64,
    },
    /// Answer to `ReleaseSized`: the attributes of each file whose held
    /// size landed on this node, with the attribute lease (ms, 0: none)
    /// granted with them, as `Reply::Leased` grants one.
    Landed {
        attrs: Vec<(EntryAttr, u32)>,
    },
    /// Answer to `ReserveCreates`: ids with their patterns, and for how
    /// long (ms) the lease on the directory's names lasts from the request.
    Reserved {
        slots: Vec<(EntryId, Pattern)>,
        lease_ms: u32,
    },
    /// Answer to `CreateMany`: per file (in order) the leases granted on
    /// its attributes and on its name (ms, 0: none); the files not made,
    /// by index, with why; the renewed lease on the directory's names (ms).
    CreatedMany {
        leases: Vec<(u32, u32)>,
        failed: Vec<(u32, FsError)>,
        lease_ms: u32,
    },
}

/// How a new directory's owner (metadata node) is chosen; a per-directory
/// setting inherited by new subdirectories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum MetaChooser {
    /// The metadata node owning the fewest directories.
    #[default]
    Balanced,
    Random,
    RoundRobin,
}

impl MetaChooser {
    pub const ALL: [MetaChooser; 3] = [MetaChooser::Balanced, MetaChooser::Random, MetaChooser::RoundRobin];

    pub fn name(&self) -> &'static str {
        match self {
            MetaChooser::Balanced => "balanced",
            MetaChooser::Random => "random",
            MetaChooser::RoundRobin => "roundrobin",
        }
    }

    pub fn parse(s: &str) -> Option<MetaChooser> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// Steps of cross-node metadata operations (`Request::MetaPeer`). Inode
/// records travel as the metadata store's own encoding (`inode`), opaque here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerOp {
    /// Creates directory inode `id` unless it exists (answer: `Entry`),
    /// with extended attributes `xattrs` (the ACLs it inherits from its
    /// parent's default ACL, which the coordinator holds).
    CreateDir {
        id: EntryId,
        inode: Vec<u8>,
        parent_owner: NodeId,
        chooser: Option<MetaChooser>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Removes directory inode `id` if it is empty (`NotEmpty` otherwise); a
    /// missing inode is success.
    RemoveDir { id: EntryId },
    /// Sets directory `id`'s parent pointer.
    SetParent { id: EntryId, parent: EntryId, parent_owner: NodeId },
    /// A directory's parent (answer: `DirParent`).
    GetParent { id: EntryId },
    /// The destination half of a rename coordinated by another node, applied
    /// once per `intent`: puts `dentry` as `new_parent/new_name` (replacing
    /// what POSIX lets it replace), with the moved file's inode and xattrs.
    RenameIn {
        intent: EntryId,
        src_parent: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
        flags: u32,
        id: EntryId,
        kind: FileKind,
        owner: NodeId,
        inode: Option<Vec<u8>>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// The coordinator committed `intent`: its record of `RenameIn` may go.
    Forget { intent: EntryId },
    /// The dentry half of a hard link coordinated by the inode's owner,
    /// applied once per `intent`: puts `new_parent/new_name` naming `id` on `owner`.
    LinkIn { intent: EntryId, new_parent: EntryId, new_name: Vec<u8>, id: EntryId, kind: FileKind, owner: NodeId },
    /// Drops one link of file `id` (its dentry on the coordinator goes),
    /// once per `intent`; the last link removes the inode and queues its chunks.
    DropLink { intent: EntryId, id: EntryId },
    /// File `id` moved here by a rename while `count` handles were open on
    /// the node it left: they count here now (their requests are forwarded).
    /// Counted at each delivery: replaced by `HandOver`, sent only to a
    /// node that does not know that.
    Opened { id: EntryId, count: u32 },
    /// The other half of a `RENAME_EXCHANGE` coordinated by another node,
    /// applied once per `intent`: `new_parent/new_name`, still naming
    /// `expect`, names `id` of `kind` on `owner` instead.
    ExchangeIn {
        intent: EntryId,
        new_parent: EntryId,
        new_name: Vec<u8>,
        expect: EntryId,
        id: EntryId,
        kind: FileKind,
        owner: NodeId,
    },
    /// `Opened`, counted once per `intent` (the rename that moved the
    /// file): a repeat or a late delivery of the same hand-over is not
    /// counted again. The receiver keeps the last [`HAND_OVERS_KEPT`]
    /// intents it counted, in memory (as the counts themselves).
    HandOver { intent: EntryId, id: EntryId, count: u32 },
}

/// How many hand-overs of open handles (`PeerOp::HandOver`) a metadata
/// node remembers to refuse counting again: far more than renames of open
/// files within the transport's retry window.
pub const HAND_OVERS_KEPT: usize = 4096;

/// Lock spaces: locks of different kinds never conflict with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    /// `flock(2)`: whole file, owned by an open file description.
    Flock,
    /// `fcntl(2)` byte ranges, owned by a process (the kernel's lock owner).
    Posix,
    /// The global append lock: held by a client while it writes at the end of file.
    Append,
}

/// A lock as the metadata node's lock table holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    pub kind: LockKind,
    /// The client instance (a mount's random id, as in [`OpId`]).
    pub client: u64,
    /// The owner inside that client (the kernel's lock owner).
    pub owner: u64,
    /// Process id on the client's machine, reported by F_GETLK (0: unknown).
    pub pid: u32,
    /// First byte of the range.
    pub start: u64,
    /// Last byte of the range, inclusive (`u64::MAX` or `i64::MAX`: to the end of file).
    pub end: u64,
    pub exclusive: bool,
}

/// What `StorageBench` measured on one target. Times are the storage node's
/// wall clock in nanoseconds since the Unix epoch, so that results of several
/// nodes can be combined (aggregate bandwidth = total bytes / (last end −
/// first start)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetBench {
    pub target: TargetId,
    /// Bytes written, and then read back.
    pub bytes: u64,
    pub write_start_ns: u64,
    pub write_end_ns: u64,
    pub read_start_ns: u64,
    pub read_end_ns: u64,
}

pub type Response = Result<Reply, FsError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{body_type_id, decode_body, encode_body};

    /// Every message's wire id (its variant index, the body's leading varint)
    /// pinned: a new message goes at the end; reordering or removing one
    /// changes every later id and fails here. Each id is decoded from a body
    /// of that id followed by zero bytes (zero decodes as every field's
    /// smallest value).
    #[test]
    fn message_ids_are_pinned() {
        fn name_of<T: std::fmt::Debug>(v: &T) -> String {
            let s = format!("{v:?}");
            s[..s.find([' ', '{', '(']).unwrap_or(s.len())].to_string()
        }
        fn decoded<T: serde::de::DeserializeOwned + std::fmt::Debug>(id: usize) -> String {
            let mut body = Vec::new();
            let mut v = id;
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                body.push(if v == 0 { b } else { b | 0x80 });
                if v == 0 {
                    break;
                }
            }
            assert_eq!(usize::from(body_type_id(&body)), id);
            let mut zeros = body.clone();
            zeros.extend([0u8; 256]);
            if let Ok((m, _)) = postcard::take_from_bytes::<T>(&zeros) {
                return name_of(&m);
            }
            // A message holding a `DirPattern` (`SetDirPattern`): a zero
            // chunk size does not decode; an entry id of zeros, then 4 KiB.
            body.extend([0, 0, 0, 0x80, 0x20]);
            body.extend([0u8; 256]);
            let (m, _): (T, _) = postcard::take_from_bytes(&body).unwrap_or_else(|e| panic!("id {id}: {e}"));
            name_of(&m)
        }
        const REQUESTS: [&str; 92] = [
            "Ping",
            "RegisterNode",
            "RegisterTarget",
            "Heartbeat",
            "ListNodes",
            "ListTargets",
            "GetRootOwner",
            "Lookup",
            "GetAttr",
            "SetAttr",
            "Create",
            "Mkdir",
            "Unlink",
            "Rmdir",
            "Rename",
            "ReadDir",
            "Symlink",
            "ReadLink",
            "Link",
            "GetXattr",
            "SetXattr",
            "ListXattr",
            "RemoveXattr",
            "SetDirPattern",
            "Open",
            "Release",
            "UpdateSize",
            "MetaStat",
            "WriteChunk",
            "ReadChunk",
            "TruncateChunk",
            "UnlinkChunk",
            "StatChunk",
            "FsyncChunk",
            "CreatePool",
            "MoveTargetToPool",
            "ListPools",
            "RefreshView",
            "RetiredRetryable",
            "FsckDentries",
            "FsckInodes",
            "FsckDisposals",
            "FsckFix",
            "ListChunks",
            "StorageBench",
            "NetBenchWrite",
            "NetBenchRead",
            "MetaOpCount",
            "LockAcquire",
            "LockRelease",
            "LockTest",
            "LockKeepAlive",
            "MetaPeer",
            "RenameTo",
            "SetMetaChooser",
            "GetMetaChooser",
            "FsckIntents",
            "LinkTo",
            "CreateOpen",
            "UnlinkChunks",
            "RetiredLeasing",
            "LeaseWait",
            "FallocateChunk",
            "SeekChunk",
            "CopyChunk",
            "TouchAtime",
            "ReadDirFirst",
            "CreateGroup",
            "ListGroups",
            "SetMemberState",
            "ResyncProgress",
            "StatChunks",
            "LeaseWaitDirs",
            "ReleaseMany",
            "MetaMirror",
            "DigestChunks",
            "Metrics",
            "Events",
            "QuotaUsage",
            "SetQuota",
            "GetQuotas",
            "QuotaReport",
            "MirrorFence",
            "UpdateSizeIf",
            "LeaseDirNames",
            "PeerStep",
            "ReleaseWritten",
            "LockCancel",
            "CreateOpenHeld",
            "ReleaseSized",
            "ReserveCreates",
            "CreateMany",
        ];
        const REPLIES: [&str; 51] = [
            "Ok",
            "Pong",
            "NodeRegistered",
            "TargetRegistered",
            "Nodes",
            "Targets",
            "RootOwner",
            "Entry",
            "DirPage",
            "LinkTarget",
            "Xattr",
            "XattrNames",
            "MetaStat",
            "Written",
            "Data",
            "ChunkLen",
            "PoolCreated",
            "Pools",
            "FsckDentries",
            "FsckInodes",
            "FsckDisposals",
            "Chunks",
            "FsckFixed",
            "StorageBench",
            "MetaOpCount",
            "Lock",
            "LockLease",
            "DirParent",
            "MetaChooser",
            "FsckIntents",
            "Leased",
            "Revoked",
            "WithParent",
            "Seek",
            "DirPageFirst",
            "GroupCreated",
            "Groups",
            "HeartbeatAck",
            "ChunkLens",
            "DirNames",
            "ReplicaAt",
            "ChunkDigests",
            "Metrics",
            "Events",
            "UsageDiff",
            "QuotaUsage",
            "Quotas",
            "Fenced",
            "Landed",
            "Reserved",
            "CreatedMany",
        ];
        for (id, want) in REQUESTS.iter().enumerate() {
            assert_eq!(decoded::<Request>(id), *want, "request id {id}");
        }
        for (id, want) in REPLIES.iter().enumerate() {
            assert_eq!(decoded::<Reply>(id), *want, "reply id {id}");
        }
        // One past the end is no message.
        let mut body = vec![REQUESTS.len() as u8];
        body.extend([0u8; 16]);
        assert!(postcard::take_from_bytes::<Request>(&body).is_err());
    }

    #[test]
    fn request_names_are_their_variants() {
        assert_eq!(Request::Ping.name(), "Ping");
        assert_eq!(Request::StatChunk { target: TargetId(1), entry: EntryId::ROOT }.name(), "StatChunk");
        assert_eq!(Request::RetiredLeasing.name(), "RetiredLeasing");
        let caller = Caller::new(7, 8);
        let r = Request::Mkdir { parent: EntryId::ROOT, name: b"d".to_vec(), mode: 0o755, caller };
        assert_eq!((r.kind(), r.caller()), ("Mkdir", Some(caller)));
    }

    #[test]
    fn request_round_trip_and_type_id() {
        let r = Request::Lookup { parent: EntryId::ROOT, name: b"a".to_vec() };
        let b = encode_body(&r);
        assert_eq!(decode_body::<Request>(&b).unwrap(), r);
        assert_eq!(body_type_id(&b), 7);
        let resp: Response = Err(FsError::new(hivefs_types::ErrorCode::NotFound, "x"));
        assert_eq!(decode_body::<Response>(&encode_body(&resp)).unwrap(), resp);
    }

    #[test]
    fn a_full_unlink_chunks_batch_fits_in_one_body() {
        let worst = EntryId { node: u32::MAX, epoch: u32::MAX, counter: u64::MAX };
        let r = Request::UnlinkChunks { target: TargetId(u32::MAX), entries: vec![worst; UNLINK_CHUNKS_MAX] };
        let b = encode_body(&r);
        assert!(b.len() <= crate::MAX_BODY_LEN as usize, "{} bytes", b.len());
        assert_eq!(decode_body::<Request>(&b).unwrap(), r);
        assert!(r.is_idempotent());
    }

    #[test]
    fn a_full_release_batch_fits_in_one_body_and_is_sent_once() {
        let worst = EntryId { node: u32::MAX, epoch: u32::MAX, counter: u64::MAX };
        let many = Request::ReleaseMany { ids: vec![worst; RELEASE_MANY_MAX], wrote: vec![worst; RELEASE_MANY_MAX] };
        let written = Request::ReleaseWritten { handles: vec![(worst, StripeSet::ALL); RELEASE_MANY_MAX] };
        let worst_time = Timespec { sec: i64::MIN, nsec: u32::MAX };
        let held = HeldSize { size: u64::MAX, mtime: worst_time, seen: Some(worst_time) };
        let sized = Request::ReleaseSized {
            handles: vec![
                SizedRelease { id: worst, wrote: StripeSet::ALL, held: true, size: Some(held) };
                RELEASE_MANY_MAX
            ],
        };
        for r in [many, written, sized] {
            let b = encode_body(&r);
            assert!(b.len() <= crate::MAX_BODY_LEN as usize, "{} bytes", b.len());
            assert_eq!(decode_body::<Request>(&b).unwrap(), r);
            // Open counts in memory: a repeat would release twice.
            assert!(!Envelope::default().may_repeat(&r));
        }
    }

    #[test]
    fn a_full_revocation_fits_in_one_body() {
        let worst = EntryId { node: u32::MAX, epoch: u32::MAX, counter: u64::MAX };
        let r: Response = Ok(Reply::Revoked { ids: vec![worst; REVOKED_MAX], names: true, upto: u64::MAX });
        let b = encode_body(&r);
        assert!(b.len() <= crate::MAX_BODY_LEN as usize, "{} bytes", b.len());
        assert_eq!(decode_body::<Response>(&b).unwrap(), r);
    }

    #[test]
    fn an_envelope_goes_before_the_request_and_keeps_its_type_id() {
        let r = Request::Mkdir { parent: EntryId::ROOT, name: b"d".to_vec(), mode: 0o755, caller: Caller::default() };
        let (flags, body) = crate::encode_request(&Envelope::default(), &r);
        assert_eq!((flags, body.clone()), (0, encode_body(&r)), "an empty envelope is left out");
        assert_eq!(crate::decode_request(flags, &body).unwrap(), (Envelope::default(), r.clone()));
        let env =
            Envelope { op: Some(OpId { client: 7, seq: 300, done_below: 299 }), lease_client: Some(7), mirror: None };
        let (flags, body) = crate::encode_request(&env, &r);
        assert_eq!(flags, crate::FLAG_ENVELOPE);
        // The envelope's bytes, pinned: op Some(7, 300, 299), lease client Some(7), mirror None.
        assert_eq!(&body[..9], &[1, 7, 0xac, 2, 0xab, 2, 1, 7, 0]);
        let m = Envelope {
            mirror: Some(MirrorHdr { group: BuddyGroupId(3), epoch: 2, role: MirrorRole::Forward, session: 7 }),
            ..Envelope::default()
        };
        let (_, mb) = crate::encode_request(&m, &r);
        // op None, lease client None, mirror Some(group 3, epoch 2, Forward).
        assert_eq!(&mb[..6], &[0, 0, 1, 3, 2, 1]);
        assert_eq!(crate::decode_request(crate::FLAG_ENVELOPE, &mb).unwrap(), (m, r.clone()));
        assert_eq!(crate::frame_type_id(flags, &body), 11);
        assert_eq!(crate::frame_type_id(flags, &body), crate::frame_type_id(0, &encode_body(&r)));
        assert_eq!(crate::decode_request(flags, &body).unwrap(), (env, r));
        assert!(crate::decode_request(flags, &body[..3]).is_err());
        assert!(env.may_repeat(&Request::Mkdir {
            parent: EntryId::ROOT,
            name: vec![],
            mode: 0,
            caller: Caller::default()
        }));
    }

    #[test]
    fn trailing_garbage_is_an_error() {
        let mut b = encode_body(&Request::Ping);
        b.push(0);
        assert!(decode_body::<Request>(&b).is_err());
    }
}

//! A power-cut file system for tests, in the spirit of LazyFS: a FUSE file
//! system held in this process's memory whose changes stay volatile until
//! they are synced. A file's contents (and size) become durable when the
//! file is `fsync`ed or `fdatasync`ed; a directory's entries (creates,
//! unlinks, renames, `mkdir`s in it) when the directory is synced.
//! [`PowerCutFs::cut`] is the power cut: it unmounts, forgets everything
//! not synced and mounts what survived, so the next process sees exactly
//! what a disk would hold after a power loss under POSIX's rules.
//!
//! A [`Cut::Torn`] cut is harsher: besides the synced state, a random
//! prefix of each file's unsynced appends reaches the disk (a torn last
//! write), and each directory's unsynced entries survive or not at random
//! (metadata written back before the data it names). `fail_fsync` makes
//! every sync answer `EIO`; `fail_writes` makes every write (and every new
//! file) answer an error, `ENOSPC` for a full disk (its `statfs` then shows
//! no free block) or `EIO`.
//!
//! Mounting needs `/dev/fuse` and the right to mount (root, or
//! `fusermount3`); [`PowerCutFs::mount`] says why it cannot, and the tests
//! then skip with that reason (or fail, with `TAILRACE_REQUIRE_FUSE=1`).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// How long the kernel may cache names and attributes: every change goes
/// through this file system, and a cut remounts.
const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

/// What a power cut keeps.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// Exactly what was synced.
    Clean,
    /// What was synced, plus random parts of what was not (the seed
    /// picks which).
    Torn(u64),
}

#[derive(Clone, Debug)]
enum Kind {
    /// `dirty_from`: the lowest offset changed since the last sync.
    File {
        data: Vec<u8>,
        dirty_from: Option<usize>,
    },
    Dir {
        entries: BTreeMap<OsString, u64>,
        dirty: bool,
    },
}

#[derive(Clone, Debug)]
struct Inode {
    kind: Kind,
    perm: u16,
    mtime: SystemTime,
    /// Names that link to it in the live tree.
    links: u32,
    /// Open handles.
    open: u32,
}

#[derive(Clone, Debug)]
enum Durable {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, u64>),
}

/// The live tree (what processes see) and what a cut would keep.
#[derive(Default)]
struct State {
    live: HashMap<u64, Inode>,
    durable: HashMap<u64, Durable>,
    next_ino: u64,
}

/// Counters of what the file system was asked to do.
#[derive(Default, Debug)]
pub struct Counts {
    pub file_syncs: AtomicU64,
    pub dir_syncs: AtomicU64,
    pub cuts: AtomicU64,
}

struct Shared {
    state: Mutex<State>,
    fail_fsync: AtomicBool,
    /// The errno every write answers now (0: writes work).
    fail_writes: std::sync::atomic::AtomicI32,
    counts: Counts,
}

/// See the module documentation.
pub struct PowerCutFs {
    shared: Arc<Shared>,
    mountpoint: PathBuf,
    session: Option<BackgroundSession>,
}

impl PowerCutFs {
    /// Mounts an empty file system on `mountpoint` (an empty directory);
    /// `Err` says why FUSE cannot be used here.
    pub fn mount(mountpoint: &Path) -> Result<Self, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse is missing".into());
        }
        let mut state = State { next_ino: ROOT + 1, ..State::default() };
        let root = Inode { kind: Kind::Dir { entries: BTreeMap::new(), dirty: false }, ..inode(0o755) };
        state.live.insert(ROOT, Inode { links: 1, ..root });
        state.durable.insert(ROOT, Durable::Dir(BTreeMap::new()));
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            fail_fsync: AtomicBool::new(false),
            fail_writes: std::sync::atomic::AtomicI32::new(0),
            counts: Counts::default(),
        });
        let mut fs = Self { shared, mountpoint: mountpoint.to_path_buf(), session: None };
        fs.start()?;
        Ok(fs)
    }

    /// Mounts on `mountpoint` for a test: `None` (the test skips, saying
    /// why) where FUSE cannot be used, unless `TAILRACE_REQUIRE_FUSE=1`
    /// (CI sets it) makes that a failure.
    pub fn mount_or_skip(mountpoint: &Path) -> Option<Self> {
        match Self::mount(mountpoint) {
            Ok(fs) => Some(fs),
            Err(why) if std::env::var("TAILRACE_REQUIRE_FUSE").is_ok_and(|v| v == "1") => {
                panic!("TAILRACE_REQUIRE_FUSE=1, but {why}")
            }
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    fn start(&mut self) -> Result<(), String> {
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("powercut".into()), MountOption::RW];
        let session = fuser::spawn_mount(Volatile(self.shared.clone()), &self.mountpoint, &config)
            .map_err(|e| format!("cannot mount a FUSE file system on {}: {e}", self.mountpoint.display()))?;
        self.session = Some(session);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    pub fn counts(&self) -> &Counts {
        &self.shared.counts
    }

    /// Makes every sync fail with `EIO` (or stop failing).
    pub fn fail_fsync(&self, fail: bool) {
        self.shared.fail_fsync.store(fail, Ordering::SeqCst);
    }

    /// Makes every write and every new file fail with `errno`
    /// (`libc::ENOSPC`, `libc::EIO`), or work again (`None`).
    pub fn fail_writes(&self, errno: Option<i32>) {
        self.shared.fail_writes.store(errno.unwrap_or(0), Ordering::SeqCst);
    }

    /// The power cut. Every process using the mount must be dead first
    /// (a machine that loses power runs nothing either).
    pub fn cut(&mut self, cut: Cut) -> Result<(), String> {
        if let Some(session) = self.session.take() {
            match session.umount_and_join() {
                // The kernel may answer the session's last read with
                // ECONNABORTED instead of ENODEV as it tears the mount
                // down: unmounted all the same.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                result => result.map_err(|e| format!("unmounting {}: {e}", self.mountpoint.display()))?,
            }
        }
        self.shared.counts.cuts.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared).power_cut(cut);
        self.start()
    }

    /// Everything written so far becomes durable, as when the OS writes
    /// its dirty pages back.
    pub fn write_back(&self) {
        let mut state = lock(&self.shared);
        let inos: Vec<u64> = state.live.keys().copied().collect();
        for ino in inos {
            state.sync(ino);
        }
    }
}

impl Drop for PowerCutFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn inode(perm: u16) -> Inode {
    Inode { kind: Kind::File { data: Vec::new(), dirty_from: None }, perm, mtime: SystemTime::now(), links: 0, open: 0 }
}

/// A tiny deterministic generator for torn cuts.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl State {
    /// Makes `ino`'s current state durable (its data, or its entries).
    fn sync(&mut self, ino: u64) {
        let Some(node) = self.live.get_mut(&ino) else { return };
        match &mut node.kind {
            Kind::File { data, dirty_from } => {
                let from = dirty_from.take();
                match self.durable.get_mut(&ino) {
                    Some(Durable::File(kept)) => {
                        let from = from.unwrap_or(kept.len()).min(kept.len());
                        kept.truncate(from);
                        kept.extend_from_slice(data.get(from..).unwrap_or_default());
                        kept.truncate(data.len());
                    }
                    _ => {
                        self.durable.insert(ino, Durable::File(data.clone()));
                    }
                }
            }
            Kind::Dir { entries, dirty } => {
                *dirty = false;
                let entries = entries.clone();
                for child in entries.values() {
                    if !self.durable.contains_key(child) {
                        self.durable.insert(*child, empty_like(self.live.get(child)));
                    }
                }
                self.durable.insert(ino, Durable::Dir(entries));
            }
        }
    }

    fn power_cut(&mut self, cut: Cut) {
        if let Cut::Torn(seed) = cut {
            let mut rng = SplitMix(seed);
            let mut inos: Vec<u64> = self.live.keys().copied().collect();
            inos.sort_unstable();
            for ino in inos {
                match &self.live[&ino].kind {
                    // Unsynced appends: a random prefix of them reached the disk.
                    Kind::File { data, dirty_from: Some(from) } => {
                        let kept = match self.durable.get(&ino) {
                            Some(Durable::File(kept)) => kept.len(),
                            _ => 0,
                        };
                        if *from >= kept && data.len() > kept {
                            let extra = (rng.next() % (data.len() - kept + 1) as u64) as usize;
                            self.durable.insert(ino, Durable::File(data[..kept + extra].to_vec()));
                        }
                    }
                    // The directory's entries were written back without the
                    // data of the files they name.
                    Kind::Dir { entries, dirty: true } if rng.next().is_multiple_of(2) => {
                        for child in entries.values() {
                            let empty = empty_like(self.live.get(child));
                            self.durable.entry(*child).or_insert(empty);
                        }
                        self.durable.insert(ino, Durable::Dir(entries.clone()));
                    }
                    _ => {}
                }
            }
        }
        // Only what the durable tree reaches survives.
        let mut reachable = HashMap::new();
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if reachable.contains_key(&ino) {
                continue;
            }
            let Some(durable) = self.durable.get(&ino) else { continue };
            if let Durable::Dir(entries) = durable {
                stack.extend(entries.values().copied());
            }
            let old = &self.live.get(&ino);
            reachable.insert(ino, (durable.clone(), old.map_or(0o644, |o| o.perm), old.map(|o| o.mtime)));
        }
        let mut links: HashMap<u64, u32> = HashMap::new();
        for (durable, _, _) in reachable.values() {
            if let Durable::Dir(entries) = durable {
                for child in entries.values() {
                    *links.entry(*child).or_default() += 1;
                }
            }
        }
        self.live.clear();
        self.durable.clear();
        for (ino, (durable, perm, mtime)) in reachable {
            let kind = match &durable {
                Durable::File(data) => Kind::File { data: data.clone(), dirty_from: None },
                Durable::Dir(entries) => Kind::Dir { entries: entries.clone(), dirty: false },
            };
            let links = if ino == ROOT { 1 } else { links.get(&ino).copied().unwrap_or(0) };
            let mtime = mtime.unwrap_or_else(SystemTime::now);
            self.live.insert(ino, Inode { kind, perm, mtime, links, open: 0 });
            self.durable.insert(ino, durable);
        }
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.live.get(&ino)?;
        let (kind, size) = match &node.kind {
            Kind::File { data, .. } => (FileType::RegularFile, data.len() as u64),
            Kind::Dir { entries, .. } => (FileType::Directory, entries.len() as u64),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind,
            perm: node.perm,
            nlink: node.links.max(1),
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn entries(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.live.get_mut(&ino).map(|n| &mut n.kind) {
            Some(Kind::Dir { entries, dirty }) => {
                *dirty = true;
                Ok(entries)
            }
            Some(Kind::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        match self.live.get(&parent).map(|n| &n.kind) {
            Some(Kind::Dir { entries, .. }) => entries.get(name).copied().ok_or(Errno::ENOENT),
            Some(Kind::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Adds a new inode named `name` in `parent`.
    fn make(&mut self, parent: u64, name: &OsStr, kind: Kind, perm: u16) -> Result<FileAttr, Errno> {
        if self.child(parent, name).is_ok() {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.entries(parent)?.insert(name.to_owned(), ino);
        self.live.insert(ino, Inode { kind, links: 1, ..inode(perm) });
        self.attr(ino).ok_or(Errno::EIO)
    }

    /// Drops one link to `ino`; forgets it once nothing links or holds it.
    fn unlinked(&mut self, ino: u64) {
        if let Some(node) = self.live.get_mut(&ino) {
            node.links = node.links.saturating_sub(1);
            if node.links == 0 && node.open == 0 {
                self.live.remove(&ino);
            }
        }
    }

    fn file(&mut self, ino: u64) -> Result<(&mut Vec<u8>, &mut Option<usize>), Errno> {
        match self.live.get_mut(&ino).map(|n| &mut n.kind) {
            Some(Kind::File { data, dirty_from }) => Ok((data, dirty_from)),
            Some(Kind::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }
}

/// What a new name's inode holds on disk before its own sync.
fn empty_like(node: Option<&Inode>) -> Durable {
    match node.map(|n| &n.kind) {
        Some(Kind::Dir { .. }) => Durable::Dir(BTreeMap::new()),
        _ => Durable::File(Vec::new()),
    }
}

fn dirty(dirty_from: &mut Option<usize>, at: usize) {
    *dirty_from = Some(dirty_from.map_or(at, |d| d.min(at)));
}

/// The FUSE side.
struct Volatile(Arc<Shared>);

impl Volatile {
    /// The error writes answer now, if they fail.
    fn write_failure(&self) -> Option<Errno> {
        match self.0.fail_writes.load(Ordering::SeqCst) {
            0 => None,
            errno => Some(Errno::from_i32(errno)),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }
}

impl Filesystem for Volatile {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let state = self.state();
        match state.child(parent.0, name).and_then(|ino| state.attr(ino).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state();
        if let Some(size) = size {
            match state.file(ino.0) {
                Ok((data, dirty_from)) => {
                    let size = size as usize;
                    if size != data.len() {
                        dirty(dirty_from, size.min(data.len()));
                        data.resize(size, 0);
                    }
                }
                Err(e) => return reply.error(e),
            }
        }
        if let Some(node) = state.live.get_mut(&ino.0) {
            if let Some(mode) = mode {
                node.perm = (mode & 0o7777) as u16;
            }
            node.mtime = SystemTime::now();
        }
        match state.attr(ino.0) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let dir = Kind::Dir { entries: BTreeMap::new(), dirty: false };
        match self.state().make(parent.0, name, dir, (mode & 0o7777) as u16) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state();
        let removed = state.child(parent.0, name).and_then(|ino| match state.live[&ino].kind {
            Kind::Dir { .. } => Err(Errno::EISDIR),
            Kind::File { .. } => Ok(ino),
        });
        match removed.and_then(|ino| state.entries(parent.0).map(|e| (e.remove(name), ino))) {
            Ok((_, ino)) => {
                state.unlinked(ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state();
        let removed = state.child(parent.0, name).and_then(|ino| match &state.live[&ino].kind {
            Kind::Dir { entries, .. } if entries.is_empty() => Ok(ino),
            Kind::Dir { .. } => Err(Errno::ENOTEMPTY),
            Kind::File { .. } => Err(Errno::ENOTDIR),
        });
        match removed.and_then(|ino| state.entries(parent.0).map(|e| (e.remove(name), ino))) {
            Ok((_, ino)) => {
                state.unlinked(ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        let result = (|| {
            let ino = state.child(parent.0, name)?;
            let replaced = state.child(newparent.0, newname).ok();
            if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                return Err(Errno::EINVAL);
            }
            if replaced.is_some() && flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if let Some(old) = replaced
                && let Kind::Dir { entries, .. } = &state.live[&old].kind
                && !entries.is_empty()
            {
                return Err(Errno::ENOTEMPTY);
            }
            state.entries(parent.0)?.remove(name);
            state.entries(newparent.0)?.insert(newname.to_owned(), ino);
            if let Some(old) = replaced.filter(|old| *old != ino) {
                state.unlinked(old);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.state();
        if flags.0 & libc::O_TRUNC != 0
            && let Ok((data, dirty_from)) = state.file(ino.0)
            && !data.is_empty()
        {
            data.clear();
            dirty(dirty_from, 0);
        }
        match state.live.get_mut(&ino.0) {
            Some(node) => {
                node.open += 1;
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if let Some(errno) = self.write_failure() {
            return reply.error(errno);
        }
        let mut state = self.state();
        let file = Kind::File { data: Vec::new(), dirty_from: None };
        match state.make(parent.0, name, file, (mode & 0o7777) as u16) {
            Ok(attr) => {
                if let Some(node) = state.live.get_mut(&attr.ino.0) {
                    node.open += 1;
                }
                reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.state();
        match state.file(ino.0) {
            Ok((data, _)) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                reply.data(&data[start..end])
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        bytes: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Some(errno) = self.write_failure() {
            return reply.error(errno);
        }
        let mut state = self.state();
        match state.file(ino.0) {
            Ok((data, dirty_from)) => {
                let at = if flags.0 & libc::O_APPEND != 0 { data.len() } else { offset as usize };
                if data.len() < at + bytes.len() {
                    data.resize(at + bytes.len(), 0);
                }
                data[at..at + bytes.len()].copy_from_slice(bytes);
                dirty(dirty_from, at);
                if let Some(node) = state.live.get_mut(&ino.0) {
                    node.mtime = SystemTime::now();
                }
                reply.written(bytes.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state();
        if let Some(node) = state.live.get_mut(&ino.0) {
            node.open = node.open.saturating_sub(1);
            if node.open == 0 && node.links == 0 {
                state.live.remove(&ino.0);
            }
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if self.0.fail_fsync.load(Ordering::SeqCst) {
            return reply.error(Errno::EIO);
        }
        self.0.counts.file_syncs.fetch_add(1, Ordering::Relaxed);
        self.state().sync(ino.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let state = self.state();
        let Some(Kind::Dir { entries, .. }) = state.live.get(&ino.0).map(|n| &n.kind) else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [(ino.0, FileType::Directory, OsString::from(".")), (ROOT, FileType::Directory, "..".into())];
        let listed = entries.iter().map(|(name, child)| {
            let kind = match state.live.get(child).map(|c| &c.kind) {
                Some(Kind::Dir { .. }) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            (*child, kind, name.clone())
        });
        for (i, (child, kind, name)) in dots.into_iter().chain(listed).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if self.0.fail_fsync.load(Ordering::SeqCst) {
            return reply.error(Errno::EIO);
        }
        self.0.counts.dir_syncs.fetch_add(1, Ordering::Relaxed);
        self.state().sync(ino.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let free = if self.0.fail_writes.load(Ordering::SeqCst) == libc::ENOSPC { 0 } else { 1 << 23 };
        reply.statfs(1 << 24, free, free, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

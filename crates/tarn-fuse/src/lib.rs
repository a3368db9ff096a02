//! tarn-fuse: the FUSE front end. It exposes a [`tarn_fs::Fs`] as a
//! mounted Linux filesystem through `/dev/fuse`, using the `fuser` crate's
//! pure-Rust mount path (a direct `mount(2)`, so it needs root or
//! `CAP_SYS_ADMIN`, but no libfuse and no `fusermount`).
//!
//! # Shape
//!
//! [`mount`] mounts, completes the FUSE handshake and returns a [`Mount`]
//! handle while worker threads serve requests in the background. Dropping
//! the handle (or calling [`Mount::unmount`]) unmounts. Each FUSE request
//! maps to one `Fs` call: `Fs` is inode based like the FUSE low-level API,
//! so the adapter only converts types, fills in credentials and turns
//! [`tarn_fs::FsError::errno`] into the reply's errno. Nothing here keeps
//! filesystem state except the open flags inside file handles and the
//! table of inodes the kernel knows (for invalidation, below).
//!
//! # Threading
//!
//! The session runs [`MountOptions::threads`] worker threads (default
//! [`DEFAULT_THREADS`]). Each has its own clone of the `/dev/fuse`
//! descriptor (`FUSE_DEV_IOC_CLONE`), reads one request, runs the `Fs`
//! call to completion on that thread and replies. `Fs` is safe to call
//! from many threads and the engine below runs them in parallel: a
//! transaction holds only its dataset's lock, and a read plans under it
//! and fetches, verifies and decompresses its blocks after releasing it
//! (docs/design.md, "Locks"). So many readers keep as many disk reads
//! in flight, and a slow request occupies one worker while the others
//! keep serving; with `threads = 1` everything is serialised. The kernel
//! side is asynchronous as well: `FUSE_ASYNC_READ` lets it send several
//! reads of one file at once, and `FUSE_PARALLEL_DIROPS` lets it send
//! lookups and readdirs of one directory concurrently. The default of 16
//! workers matches the deepest queue common workloads produce (16 jobs of
//! random reads; a sequential reader with 1 MiB readahead in flight beside
//! a writer); an idle worker costs a thread blocked in `read(2)` and the
//! pages of its last request, nothing else.
//!
//! A mount has one more thread, `tarn-fuse-inval`, that applies
//! invalidations caused by another mount's workers (below); it sleeps on a
//! channel and ends with the mount.
//!
//! # Caching, TTLs and invalidation
//!
//! Replies carry a time-to-live for the attributes and the name → inode
//! entry ([`MountOptions::attr_ttl`], [`MountOptions::entry_ttl`],
//! [`DEFAULT_TTL`], a minute, by default). The TTLs can be long because
//! the daemon sees every change: it serves the one `Fs` of a dataset to
//! every front end, and `Fs` reports each committed change to its
//! subscribers ([`tarn_fs::notify`]). Each mount subscribes and turns the
//! reports into kernel invalidations (module `invalidate`):
//! `FUSE_NOTIFY_INVAL_ENTRY` for each added, removed or re-pointed name,
//! and `FUSE_NOTIFY_INVAL_INODE` for each changed inode, for its
//! attributes only (a chmod, an atime) or with its cached pages (a write,
//! a truncate: size or mtime moved). So a change made through NFS, WebDAV,
//! another mount or a direct `Fs` call is seen through this mount at
//! once: for a change made by a thread that is not a FUSE worker, before
//! the changing call returns; for one made by another mount's workers, a
//! moment later, from `tarn-fuse-inval`. This mount's own changes are not
//! reported back to it (its workers mark themselves with an
//! [`tarn_fs::Origin`]): the kernel made them and keeps its caches right
//! by itself, and a worker waiting for the kernel's inode lock while the
//! kernel waits for its reply would deadlock.
//!
//! The order makes this race-free: `Fs` reports a change only after its
//! transaction committed, and the kernel serialises an invalidation with
//! what could bring the old state back. An entry invalidation takes the
//! directory's inode lock, which a lookup in progress holds until its
//! reply is in the dentry cache, so a lookup that read the old name is
//! either invalidated after it or started after the commit; an inode
//! invalidation bumps the inode's attribute version, so a `GETATTR` reply
//! computed before it is not cached; a page being read is locked until
//! the read completes, and the invalidation waits for it.
//!
//! What changes without a transaction of the live dataset keeps a short
//! TTL (one second): the `.snapshot` directory and the names in it (taking
//! or destroying a snapshot). Snapshot contents never change. A rollback,
//! a receive and a destroy unmount the dataset first (the daemon's
//! `Mounts`), so no cache survives them; [`Mount::invalidate_all`] remains
//! for a tree replaced under a live mount. A name that does not exist is
//! cached as missing (a negative entry, inode 0) for the entry TTL, since
//! whoever adds it reports the new entry, which invalidates the negative
//! one; in `.snapshot` missing names are not cached, so a new snapshot
//! shows at once. Without `default_permissions` the entry TTL is capped
//! at one second (see below).
//!
//! The writeback cache is off: every `write(2)` reaches `Fs` before it
//! returns. Turning it on would break three promises. ENOSPC and EDQUOT
//! are reported by the `write` that hits them, and a copy-on-write pool
//! cannot reserve space for pages the kernel holds back (a later flush
//! would fail where nobody looks). A `sync=always` dataset makes every
//! write durable before it returns, which needs the write to reach `Fs`.
//! And with the writeback cache the kernel owns a regular file's size and
//! times, ignoring the attributes `Fs` reports, so a file extended or
//! truncated through NFS would keep its stale size here even after an
//! invalidation. Cached pages survive an open (`FOPEN_KEEP_CACHE`), so a
//! file read again is served from memory; a change made elsewhere drops
//! them (above), and so does the kernel when it sees a changed size or
//! mtime (`FUSE_AUTO_INVAL_DATA`).
//!
//! # Credentials
//!
//! Every `Fs` call gets a [`tarn_fs::Cred`]: `uid`/`gid` are the caller's
//! filesystem uid and gid from the request header. FUSE does not send
//! supplementary groups, so they are read from the `Groups:` line of
//! `/proc/<pid>/status` of the calling thread and cached per (pid, uid,
//! gid) for one second. This is best effort: a process that exits before
//! the read, or one in another pid namespace, gets no supplementary groups,
//! and a `setgroups(2)` takes up to a second to be seen. Root needs no
//! groups (it passes every check), so requests from uid 0 skip the read.
//! Requests the kernel makes on its own (pid 0) get no groups either.
//!
//! # `default_permissions`
//!
//! `Fs` enforces Linux permission rules on every call, so the result is
//! right without the kernel's help. It is nevertheless **on** by default
//! ([`MountOptions::default_permissions`]), because without it the kernel
//! checks nothing itself and only asks the filesystem on the operations
//! that reach it: a path walk through a directory whose entries are
//! cached never sends `LOOKUP`, so a search-permission (`x`) check on that
//! directory would be skipped for up to a TTL, and `execve` would only see
//! "some x bit is set". With the option on, the kernel checks every step
//! against its cached attributes using the caller's real credentials
//! (including supplementary groups, exactly), and `Fs` checks again with
//! the credentials above: the stricter of the two applies. The cost is that
//! `access(2)` is answered by the kernel from cached attributes instead of
//! reaching `Fs::access`. Turning it off leaves `Fs` as the only judge.
//!
//! # Other choices
//!
//! * Writes up to [`MountOptions::max_write`] (1 MiB, the most the kernel
//!   accepts by default) arrive in one request (`big_writes`, `max_pages`).
//!   Reads too: the kernel's readahead for the mount is raised to
//!   [`MountOptions::read_ahead`] (1 MiB, a record of a `recordsize=1M`
//!   dataset) through `/sys/class/bdi/<dev>/read_ahead_kb`, since FUSE's
//!   handshake cannot raise it above the kernel's default (128 KiB); a
//!   sequential read then costs one request and one record per MiB.
//! * `FLUSH` (sent at every `close`) has nothing to do: writes are already
//!   transactions and locks are the kernel's. It answers ENOSYS, which
//!   tells the kernel to stop sending it, saving a round trip per close.
//! * `O_TRUNC` is left to the kernel (no `FUSE_ATOMIC_O_TRUNC`): it
//!   truncates with a SETATTR after the open, once its own checks passed.
//!   Given the flag, the kernel sends the truncation with the OPEN before
//!   it checks that the file is not a program running (ETXTBSY): an
//!   `open(O_RDONLY|O_TRUNC)` of a running program failed, yet emptied it
//!   under the program, which then crashed while loading. `Fs` clears
//!   set-id bits on write, chown and truncate itself
//!   (`FUSE_HANDLE_KILLPRIV`), so an unprivileged write to a set-id file
//!   does not turn into a chmod that `Fs` refuses.
//! * `lseek(SEEK_DATA/SEEK_HOLE)`, `copy_file_range` and POSIX locks are not
//!   implemented: the kernel then falls back to its generic versions (the
//!   whole file counts as data; copies go through read and write; locks
//!   are local to this machine).
//! * Device numbers are stored as the kernel's 32-bit FUSE encoding.
//! * The mount uses `nodev` and `nosuid` (fuser's defaults for a direct
//!   mount): device nodes and set-id bits are stored but not honoured.

mod convert;
mod creds;
pub mod gmt;
mod invalidate;
mod known;
mod ops;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackgroundSession, INodeNo, MountOption, Notifier, Session, SessionACL};
use nix::errno::Errno;
use nix::mount::MntFlags;
use tarn_fs::{Backend, Fs, Origin, Subscription};

use crate::invalidate::Invalidator;
use crate::known::Known;
use crate::ops::TarnFuse;

/// Largest write the kernel is asked to send in one request.
pub const DEFAULT_MAX_WRITE: u32 = 1 << 20;
/// Default attribute and entry TTL: changes made elsewhere are invalidated
/// explicitly, so the TTL only bounds the damage of a missed one (see the
/// crate docs); a minute already saves nearly every revalidation.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// Default number of worker threads (see the crate docs, "Threading").
pub const DEFAULT_THREADS: usize = 16;
/// Most worker threads [`mount`] accepts.
pub const MAX_THREADS: usize = 64;

/// How to mount: the knobs of [`mount`]. Build it with
/// `MountOptions { allow_other: true, ..Default::default() }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Let users other than the one who mounted (root) use the mount
    /// (`allow_other`). Off by default. An unprivileged mounter also needs
    /// `user_allow_other` in `/etc/fuse.conf`; root does not.
    pub allow_other: bool,
    /// Mount read-only (`MS_RDONLY`): the kernel refuses every change with
    /// EROFS before it reaches `Fs`. A read-only dataset or a snapshot
    /// fails changes with EROFS either way; this makes it visible in
    /// `mount` output and to programs that check `statvfs`.
    pub read_only: bool,
    /// Worker threads serving requests (1..=[`MAX_THREADS`]). Default
    /// [`DEFAULT_THREADS`].
    pub threads: usize,
    /// The "source" shown in `/proc/mounts` and `df` (e.g. `tank/photos`).
    /// Must not contain `,` or NUL.
    pub fsname: String,
    /// Subtype: the filesystem type shows as `fuse.<subtype>`. Empty for
    /// plain `fuse`. Must not contain `,` or NUL.
    pub subtype: String,
    /// Let the kernel check permissions too (see the crate docs for why it
    /// is on by default). `Fs` checks them in any case.
    pub default_permissions: bool,
    /// How long the kernel may cache attributes. Default [`DEFAULT_TTL`].
    pub attr_ttl: Duration,
    /// How long the kernel may cache name → inode entries, and that a
    /// name does not exist. Default [`DEFAULT_TTL`].
    pub entry_ttl: Duration,
    /// Largest write request, in bytes; the kernel may lower it (it caps
    /// requests at `max_pages`, 256 pages by default). Default 1 MiB.
    pub max_write: u32,
    /// The kernel's readahead for the mount, in bytes (rounded down to
    /// KiB), so sequential reads arrive in requests this large (up to
    /// `max_pages`). 0 keeps the kernel's default. Default 1 MiB. Setting
    /// it needs write access to `/sys/class/bdi` (root); if that fails the
    /// mount works with the default.
    pub read_ahead: u32,
    /// List and look up the snapshots in `.snapshot` by the time they were
    /// taken (`@GMT-YYYY.MM.DD-HH.MM.SS`, see [`gmt`]) instead of by name:
    /// for a mount that Samba serves, whose shadow-copy module shows them
    /// as "Previous Versions". Off by default.
    pub snapshot_time_names: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            read_only: false,
            threads: DEFAULT_THREADS,
            fsname: "tarn".to_string(),
            subtype: "tarn".to_string(),
            default_permissions: true,
            attr_ttl: DEFAULT_TTL,
            entry_ttl: DEFAULT_TTL,
            max_write: DEFAULT_MAX_WRITE,
            read_ahead: DEFAULT_MAX_WRITE,
            snapshot_time_names: false,
        }
    }
}

/// Why mounting, unmounting or invalidating failed.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// FUSE cannot be used here: no `/dev/fuse` (load the `fuse` module),
    /// or the process may not open it.
    #[error("FUSE is not available: {0}")]
    Unavailable(String),
    /// A [`MountOptions`] field is out of range or malformed.
    #[error("invalid mount option: {0}")]
    InvalidOption(String),
    /// The mountpoint is missing or not a directory.
    #[error("bad mountpoint {path}: {reason}")]
    Mountpoint {
        /// The mountpoint as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `mount(2)` or the FUSE handshake failed (EPERM: not root).
    #[error("mounting {path}: {source}")]
    Mount {
        /// The mountpoint.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The filesystem is in use (open files, a working directory inside);
    /// it stays mounted. Dropping the handle detaches it lazily instead.
    #[error("{path} is busy")]
    Busy {
        /// The mountpoint.
        path: PathBuf,
    },
    /// `umount(2)` failed for another reason; the filesystem stays mounted.
    #[error("unmounting {path}: {source}")]
    Unmount {
        /// The mountpoint.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A worker thread ended abnormally (it panicked or the device failed).
    #[error("FUSE session of {path} ended with an error: {source}")]
    Session {
        /// The mountpoint.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The kernel refused a cache invalidation (e.g. the mount is gone).
    #[error("cache invalidation failed: {0}")]
    Notify(io::Error),
}

/// A mounted filesystem. Dropping it unmounts (lazily, with `MNT_DETACH`,
/// if the filesystem is busy); [`Mount::unmount`] unmounts explicitly and
/// reports errors.
pub struct Mount {
    mountpoint: PathBuf,
    session: Option<BackgroundSession>,
    /// A duplicate of the session's `/dev/fuse` descriptor: polling it
    /// tells whether the connection is still alive, without touching the
    /// mountpoint path (which may meanwhile hold another mount).
    device: OwnedFd,
    notifier: Notifier,
    known: Arc<Known>,
    /// Turns changes made through other front ends into invalidations;
    /// `None` once unmounted.
    subscription: Option<Subscription>,
    invalidator: Arc<Invalidator>,
    /// The device number of this mount's superblock, read once it was
    /// served: unmounting checks that the mount at the path is still this
    /// one, and never unmounts another filesystem mounted there since.
    dev: Option<u64>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("mountpoint", &self.mountpoint)
            .field("mounted", &self.is_mounted())
            .finish()
    }
}

fn check_option_string(what: &str, s: &str) -> Result<(), FuseError> {
    if s.contains(',') || s.contains('\0') {
        return Err(FuseError::InvalidOption(format!(
            "{what} {s:?} contains ',' or NUL"
        )));
    }
    Ok(())
}

fn fuser_config(opts: &MountOptions) -> Result<fuser::Config, FuseError> {
    if opts.threads == 0 || opts.threads > MAX_THREADS {
        return Err(FuseError::InvalidOption(format!(
            "threads must be 1..={MAX_THREADS}, not {}",
            opts.threads
        )));
    }
    if opts.max_write < 4096 {
        return Err(FuseError::InvalidOption(format!(
            "max_write must be at least 4096, not {}",
            opts.max_write
        )));
    }
    check_option_string("fsname", &opts.fsname)?;
    check_option_string("subtype", &opts.subtype)?;
    let mut mo = Vec::new();
    if !opts.fsname.is_empty() {
        mo.push(MountOption::FSName(opts.fsname.clone()));
    }
    if !opts.subtype.is_empty() {
        // fuser's direct mount(2) path does not pass `Subtype` on; the
        // kernel takes it as a plain `subtype=` option.
        mo.push(MountOption::CUSTOM(format!("subtype={}", opts.subtype)));
    }
    if opts.default_permissions {
        mo.push(MountOption::DefaultPermissions);
    }
    mo.push(if opts.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut config = fuser::Config::default();
    config.mount_options = mo;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads);
    config.clone_fd = true;
    Ok(config)
}

/// Mounts `fs` on `mountpoint` (an existing directory) and serves it from
/// background threads until the returned handle is dropped or unmounted.
/// Returns once the kernel has completed the FUSE handshake, so the mount
/// is usable at once. Needs root (or `CAP_SYS_ADMIN`) and `/dev/fuse`.
pub fn mount<B: Backend + 'static>(
    fs: Arc<Fs<B>>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mount, FuseError> {
    let config = fuser_config(opts)?;
    if !Path::new("/dev/fuse").exists() {
        return Err(FuseError::Unavailable(
            "/dev/fuse does not exist (is the fuse module loaded?)".to_string(),
        ));
    }
    let bad = |reason: String| FuseError::Mountpoint {
        path: mountpoint.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(mountpoint).map_err(|e| bad(e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".to_string()));
    }
    let canonical = mountpoint.canonicalize().map_err(|e| bad(e.to_string()))?;
    let known = Arc::new(Known::default());
    let origin = Origin::new();
    let adapter = TarnFuse::new(fs.clone(), opts, known.clone(), origin);
    let mount_err = |source: io::Error| FuseError::Mount {
        path: canonical.clone(),
        source,
    };
    let session = Session::new(adapter, &canonical, &config).map_err(mount_err)?;
    let device = session.as_fd().try_clone_to_owned().map_err(mount_err)?;
    let notifier = session.notifier();
    let (invalidator, deferred) = Invalidator::new(origin, session.notifier());
    let weak = Arc::downgrade(&invalidator);
    std::thread::Builder::new()
        .name("tarn-fuse-inval".to_string())
        .spawn(move || invalidate::run_deferred(weak, deferred))
        .map_err(mount_err)?;
    // Subscribed before the first request is served, so nothing the
    // kernel caches can miss a change. If anything below fails, dropping
    // the subscription unsubscribes and dropping the session unmounts.
    let subscription = fs.subscribe(invalidator.clone());
    // If spawning fails, the session is dropped inside `spawn`.
    let bg = session.spawn().map_err(mount_err)?;
    let dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&canonical).ok().map(|m| m.dev())
    };
    let mount = Mount {
        mountpoint: canonical,
        session: Some(bg),
        device,
        notifier,
        known,
        subscription: Some(subscription),
        invalidator,
        dev,
    };
    if opts.read_ahead > 0 {
        if let Err(e) = set_read_ahead(&mount.mountpoint, opts.read_ahead / 1024) {
            log::warn!(
                "tarn-fuse: cannot set the readahead of {}: {e}",
                mount.mountpoint.display()
            );
        }
    }
    Ok(mount)
}

/// Sets the kernel's readahead of the filesystem mounted at `mountpoint`
/// to `kib`: a FUSE superblock's backing device is named after its device
/// number in `/sys/class/bdi`.
fn set_read_ahead(mountpoint: &Path, kib: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    std::fs::write(path, kib.to_string())
}

/// True while the FUSE connection behind `device` is alive (not unmounted,
/// not aborted).
fn connection_alive(device: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        let mut fds = [PollFd::new(device.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => return true,
            Ok(_) => {
                return !fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLERR))
            }
            Err(Errno::EINTR) => continue,
            // Cannot tell; assume alive so that unmounting is attempted.
            Err(_) => return true,
        }
    }
}

impl Mount {
    /// The mountpoint (canonical path).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// True while the filesystem is mounted and served: the handle has not
    /// been unmounted and the kernel connection is alive (an external
    /// `umount` or an abort through `/sys/fs/fuse/connections` ends it).
    pub fn is_mounted(&self) -> bool {
        self.session.is_some() && connection_alive(&self.device)
    }

    /// Unmounts and waits for the worker threads to finish. If files are
    /// still open or a process has its working directory inside, fails
    /// with [`FuseError::Busy`] and stays mounted (retry, or drop the
    /// handle to detach lazily). Succeeds without doing anything if the
    /// filesystem is already unmounted, also when the kernel lost the mount
    /// by itself (external `umount`, aborted connection); a dead mount left
    /// at the path ("Transport endpoint is not connected") is detached.
    pub fn unmount(&mut self) -> Result<(), FuseError> {
        self.unmount_inner(false)
    }

    fn unmount_inner(&mut self, lazy_if_busy: bool) -> Result<(), FuseError> {
        let Some(bg) = self.session.take() else {
            return Ok(());
        };
        let path = self.mountpoint.clone();
        let subscription = self.subscription.take();
        let alive = connection_alive(&self.device);
        if let Some(ours) = self.dev.filter(|_| alive) {
            use std::os::unix::fs::MetadataExt;
            let top = std::fs::metadata(&path).map(|m| m.dev());
            if top.as_ref().is_ok_and(|d| *d != ours) {
                // Another filesystem is mounted at the path now: never
                // unmount it. Under it, this mount cannot be unmounted
                // without it; detached (`umount -l`), it ends when its
                // last file closes.
                if mounted_at(ours, &path) && !lazy_if_busy {
                    self.session = Some(bg);
                    self.subscription = subscription;
                    return Err(FuseError::Unmount {
                        path,
                        source: io::Error::other(
                            "another filesystem is mounted over it; unmount that first",
                        ),
                    });
                }
                log::warn!(
                    "tarn-fuse: {} holds another filesystem now; left it mounted",
                    path.display()
                );
                reap_later(bg);
                return Ok(());
            }
        }
        if alive {
            match nix::mount::umount2(&path, MntFlags::empty()) {
                Ok(()) => {}
                // Not mounted at the path any more (detached by someone
                // else) although the connection lives on: files are still
                // open. The session serves them until they are closed.
                Err(Errno::EINVAL) | Err(Errno::ENOENT) => {
                    reap_later(bg);
                    return Ok(());
                }
                Err(e) if lazy_if_busy => {
                    if let Err(e2) = nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
                        log::warn!(
                            "tarn-fuse: cannot unmount {} ({e}), nor detach it ({e2})",
                            path.display()
                        );
                    }
                    reap_later(bg);
                    return Ok(());
                }
                Err(Errno::EBUSY) => {
                    self.session = Some(bg);
                    self.subscription = subscription;
                    return Err(FuseError::Busy { path });
                }
                Err(e) => {
                    self.session = Some(bg);
                    self.subscription = subscription;
                    return Err(FuseError::Unmount {
                        path,
                        source: e.into(),
                    });
                }
            }
        } else if let Err(e) = std::fs::symlink_metadata(&path) {
            // The connection is gone; if a dead FUSE mount is still at the
            // path, detach it so the directory is usable again.
            if e.raw_os_error() == Some(libc::ENOTCONN) {
                let _ = nix::mount::umount2(&path, MntFlags::MNT_DETACH);
            }
        }
        drop(subscription);
        // The connection is aborted once the superblock goes, so every
        // worker sees ENODEV and exits.
        bg.join()
            .map_err(|source| FuseError::Session { path, source })
    }

    /// How many invalidations of changes made elsewhere the kernel
    /// refused for another reason than "not cached" (a mount going away).
    pub fn invalidation_errors(&self) -> u64 {
        self.invalidator
            .failed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the kernel to forget everything it caches about this mount:
    /// every name → inode entry and the attributes and data pages of every
    /// inode it holds. Call it after the tree changed under the mount
    /// without `Fs` reporting it (changes through the mounted `Fs` are
    /// invalidated by themselves); never from inside a request of this
    /// mount. Names the kernel caches as missing cannot be listed, so they
    /// stay cached up to the entry TTL. Returns the number of inodes
    /// invalidated.
    pub fn invalidate_all(&self) -> Result<usize, FuseError> {
        if self.session.is_none() {
            return Ok(0);
        }
        let snapshot = self.known.snapshot();
        for (_, names) in &snapshot {
            for (parent, name) in names {
                self.invalidate_entry(*parent, name)?;
            }
        }
        self.invalidate_inode(tarn_fs::ROOT_INO)?;
        for (ino, _) in &snapshot {
            self.invalidate_inode(*ino)?;
        }
        Ok(snapshot.len() + 1)
    }

    /// Tells the kernel to drop its cached attributes and data pages of
    /// `ino`. Unknown inodes are ignored.
    pub fn invalidate_inode(&self, ino: u64) -> Result<(), FuseError> {
        self.notifier
            .inval_inode(INodeNo(ino), 0, 0)
            .map_err(FuseError::Notify)
    }

    /// Tells the kernel to drop its cached entry `name` in directory
    /// `parent`. Unknown entries are ignored.
    pub fn invalidate_entry(&self, parent: u64, name: &OsStr) -> Result<(), FuseError> {
        self.notifier
            .inval_entry(INodeNo(parent), name)
            .map_err(FuseError::Notify)
    }
}

/// Joins a session in the background: used when the filesystem was
/// detached while busy, so the workers keep serving open files until the
/// last one is closed.
/// Whether the superblock of device `dev` is mounted at `path`, also
/// under another mount (`/proc/self/mountinfo`: the third field is the
/// device, the fifth the mount point with spaces and the like escaped in
/// octal).
fn mounted_at(dev: u64, path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let path = path.as_os_str().as_encoded_bytes();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 4 && f[2] == want && unescape_mount_path(f[4]) == path
    })
}

/// Undoes the octal escapes of a path in `/proc/self/mountinfo` or
/// `/proc/self/mounts` (`\040` for a space, and so on); an escape cut
/// short or past a byte is kept as it is.
pub fn unescape_mount_path(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                u8::try_from(v).ok()
            });
        match code {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

fn reap_later(bg: BackgroundSession) {
    let spawned = std::thread::Builder::new()
        .name("tarn-fuse-reap".to_string())
        .spawn(move || {
            let _ = bg.join();
        });
    if let Err(e) = spawned {
        log::warn!("tarn-fuse: cannot start a thread to reap a detached session: {e}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner(true) {
            log::warn!("tarn-fuse: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone_and_bad_ones_kept() {
        assert_eq!(unescape_mount_path(r"/mnt/a\040b"), b"/mnt/a b");
        assert_eq!(unescape_mount_path(r"/x\011\134y"), b"/x\t\\y");
        // Not three octal digits, or past a byte: taken as they are.
        assert_eq!(unescape_mount_path(r"/a\9zz"), br"/a\9zz");
        assert_eq!(unescape_mount_path(r"/a\777"), br"/a\777");
        assert_eq!(unescape_mount_path(r"/end\04"), br"/end\04");
        assert_eq!(unescape_mount_path(r"/a\040b/c"), b"/a b/c");
        assert_eq!(unescape_mount_path(r"/a\134b"), br"/a\b");
        assert_eq!(unescape_mount_path("/plain"), b"/plain");
    }

    #[test]
    fn handle_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Mount>();
        send_sync::<MountOptions>();
        send_sync::<FuseError>();
    }

    #[test]
    fn options_are_validated() {
        let bad = MountOptions {
            threads: 0,
            ..Default::default()
        };
        assert!(matches!(
            fuser_config(&bad),
            Err(FuseError::InvalidOption(_))
        ));
        let bad = MountOptions {
            fsname: "a,b".into(),
            ..Default::default()
        };
        assert!(matches!(
            fuser_config(&bad),
            Err(FuseError::InvalidOption(_))
        ));
        let ok = MountOptions {
            read_only: true,
            allow_other: true,
            ..Default::default()
        };
        let c = fuser_config(&ok).expect("valid");
        assert!(c.mount_options.contains(&MountOption::RO));
        assert!(c.mount_options.contains(&MountOption::DefaultPermissions));
        assert_eq!(c.acl, SessionACL::All);
        assert_eq!(c.n_threads, Some(DEFAULT_THREADS));
    }
}

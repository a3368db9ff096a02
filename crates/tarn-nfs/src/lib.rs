//! tarn-nfs: an NFSv3 + MOUNT v3 server over TCP for `tarn-fs`
//! filesystems, with its own ONC RPC, XDR and record marking (RFC 5531,
//! RFC 4506, RFC 1813).
//!
//! # RPC flow
//!
//! A TCP byte stream carries *records* (RFC 5531 §11): fragments with a
//! 4-byte header (last-fragment bit + 31-bit length). [`record::Decoder`]
//! reassembles them and refuses, at the header, any record above
//! [`NfsConfig::max_record`]: that connection is closed, no other is
//! affected. Each record is one call: [`rpc::parse_call`] reads the xid,
//! program, version, procedure and credential; then the service decodes
//! the arguments with [`xdr::Reader`], which fails (never panics, never
//! allocates from an untrusted length) on short or invalid input. The
//! outcomes:
//!
//! - unreadable header or a REPLY message: dropped, no answer;
//! - bad credential body: `MSG_DENIED / AUTH_ERROR(BADCRED)`;
//! - flavor other than AUTH_NONE / AUTH_SYS (on a non-NULL procedure):
//!   `AUTH_ERROR(TOOWEAK)`;
//! - unknown program / version / procedure: `PROG_UNAVAIL` /
//!   `PROG_MISMATCH` / `PROC_UNAVAIL`;
//! - undecodable arguments: `GARBAGE_ARGS`;
//! - otherwise `SUCCESS` with the procedure's result (whose own status may
//!   be an `nfsstat3` error, mapped from the filesystem's errno by
//!   [`NfsStat::from_errno`]).
//!
//! Every listener serves all three programs (NFS 100003 v3, MOUNT 100005
//! v3, and portmapper 100000 v2 NULL/GETPORT answering with our own ports),
//! so a client told `port=P,mountport=P` works without a portmapper.
//!
//! # Concurrency
//!
//! Network I/O runs on a small tokio runtime (2 threads) owned by a
//! dedicated thread, so the library can be started from sync or async code
//! and [`Running::stop`] can tear it down deterministically (ports free on
//! return). tokio is used rather than a thread per connection because
//! many idle connections (nconnect=8 from several clients) then cost
//! almost nothing, and because the daemon's other front ends use it too.
//! `Fs` calls block (they take the pool's locks and may wait for a txg),
//! so they never run on the async threads: each request runs in
//! `spawn_blocking` on a pool capped at [`NfsConfig::workers`] threads.
//!
//! Per connection, a reader task decodes records and starts each request
//! as its own task once one of `max_inflight_per_connection` slots is
//! free; when all slots are busy it stops reading (TCP back-pressure).
//! Replies go to a writer task through a channel and leave in completion
//! order, so a slow COMMIT never holds up a GETATTR behind it (no
//! head-of-line blocking; the xid matches replies to calls). Memory is
//! bounded by `max_connections × max_inflight_per_connection ×
//! max_record`.
//!
//! # Copies
//!
//! A READ reply is not assembled: `Fs::read_data` returns the ranges of
//! the blocks that hold the data (shared with the block cache) and the
//! writer task sends the record header, the reply body and those ranges
//! with one vectored write, gathering up to 32 queued replies into it. A
//! WRITE's payload is read from the socket straight into the request
//! record once a large fragment is under way
//! ([`record::Decoder::body_room`]); the filesystem then copies it once,
//! into the block that stores it.
//!
//! # Connection admission
//!
//! At accept, a client address that no export lists is closed at once and
//! takes no slot (it could not use any share anyway). Others are admitted
//! by [`tarn_conn::Admission`]: at most
//! [`NfsConfig::max_connections_per_address`] per address; when all
//! [`NfsConfig::max_connections`] are taken, an idle connection is closed
//! for the newcomer (one of the address holding the most connections,
//! the longest idle of those), and the newcomer is refused only if every
//! connection has requests in flight. A connection is busy from the moment a request
//! record is complete until its reply is written; a client trickling a
//! partial record is idle. After [`NfsConfig::idle_timeout`] without a
//! request the connection is closed (Linux clients reconnect
//! transparently), and so is one whose reply cannot be written within
//! that time. Refusals and evictions are counted ([`Running::stats`]) and
//! logged, at most one line per kind every 10 s.
//!
//! # File handles
//!
//! 36 bytes: version byte, three reserved bytes, the dataset guid, the
//! inode number and its generation (from [`tarn_fs::Attr::handle`]), and
//! an 8-byte keyed-BLAKE3 check over the rest (see [`handle`]). All of it
//! is persistent data of the dataset, so the same dataset yields the same
//! handles after a restart as long as [`NfsConfig::handle_key`] is kept.
//! A handle maps back to an export by its guid; the inode is fetched with
//! `Fs::getattr_handle`, which answers ESTALE (→ `NFS3ERR_STALE`) for a
//! freed inode or a reused number with another generation. A mangled
//! handle is `NFS3ERR_BADHANDLE`.
//!
//! # Writes, stability and the verifier
//!
//! `Fs::write` commits into the pool's open transaction group: the data is
//! visible at once and durable at the next txg sync. An `UNSTABLE` WRITE
//! is acknowledged at that point. `DATA_SYNC` and `FILE_SYNC` writes, and
//! COMMIT, call `Fs::fsync` (the dataset's `Backend::sync`, which makes the
//! dataset's changes durable through the intent log, or by committing the
//! txg when the log cannot take them) before replying; stable writes answer
//! `FILE_SYNC`. The 8-byte write verifier returned by WRITE and COMMIT is
//! drawn at random when the server starts: after a restart the client sees
//! a new verifier and resends every write it had not seen committed, so an
//! acknowledged-but-uncommitted write lost in a crash is rewritten, never
//! silently dropped (contract point 3).
//!
//! # Retransmissions
//!
//! A client that got no reply sends the same call again, often on a new
//! connection. The replies of non-idempotent calls (CREATE, MKDIR,
//! REMOVE, RENAME, ...) are kept for a few minutes, keyed by client
//! address, xid and the call's bytes, and a retransmission is answered
//! with the first reply instead of running again and failing with ENOENT
//! or EEXIST for work it did (see `drc.rs`).
//!
//! # Security model
//!
//! AUTH_SYS credentials are trusted as sent (that is what AUTH_SYS means);
//! access control is by client network. An [`Export`] lists the networks
//! (IPv4/IPv6 CIDR) whose clients may mount it *and* use its handles: a
//! client outside gets `MNT3ERR_ACCES` at MNT and `NFS3ERR_ACCES` on any
//! NFS call, even with a valid handle obtained elsewhere. The credential
//! is then squashed per export (`all_squash`: everyone; `root_squash`: uid
//! 0 and gid 0; AUTH_NONE: always) to the anonymous uid/gid, and passed as
//! [`tarn_fs::Cred`] to every `Fs` call, where Linux permission rules are
//! enforced. A `read_only` export refuses every change with
//! `NFS3ERR_ROFS`. As in Linux nfsd, READ and WRITE let a file's owner
//! through regardless of mode bits (the client checked at open time; this
//! is what makes `open(O_CREAT|O_WRONLY, 0444)` + write work).
//!
//! # Not provided
//!
//! NLM (byte-range locks) and NSM: clients mount with `nolock`. No
//! RPCSEC_GSS. No NFSv4. Exports are whole datasets (their root).
//! Snapshot inodes under `.snapshot` are served, but their handles are
//! only valid for the life of the server process (snapshot inode numbers
//! carry a per-mount slot assigned by `tarn-fs`).

#![warn(missing_docs)]

pub mod client;
mod drc;
mod export;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod handle;
pub mod proto;
pub mod record;
pub mod rpc;
mod server;
mod service;
pub mod xdr;

pub use export::{Export, ExportFs, IpNet, IpNetError, NOBODY};
pub use proto::NfsStat;
pub use server::{ConnStats, NfsConfig, NfsServer, Running};

/// Errors starting or reconfiguring the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or runtime setup failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Invalid exports or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod fuzz_tests;

//! tarn-webdav: a WebDAV (class 1 and 2) server for `tarn_fs::Fs`
//! filesystems, built on the `dav-server` crate, hyper and tokio.
//!
//! # Theory
//!
//! **Division of labour.** dav-server speaks the protocol: XML bodies,
//! PROPFIND/PROPPATCH, COPY/MOVE semantics, `If:` headers and locks,
//! ranges, ETag preconditions, status codes. This crate supplies three
//! things it cannot: a *filesystem* ([`davfs`](crate) — dav-server's
//! `GuardedFileSystem` over tarn-fs, by path), an *identity* for every
//! request (HTTP Basic through a pluggable [`Authenticator`], turned into a
//! `tarn_fs::Cred` so tarn-fs enforces POSIX permissions exactly as for
//! NFS or FUSE), and a *server* ([`serve`]) with bounded resources.
//!
//! **Paths.** tarn-fs is inode-based; WebDAV is path-based. Each request
//! resolves its path by `lookup` from the share's root inode, one
//! component at a time, with the caller's credentials (so search
//! permission on every directory is checked). dav-server has already
//! percent-decoded the path, removed `.`/`..` (refusing to climb above the
//! share prefix) and refused `%2F` and NUL inside a segment; we refuse
//! `.`, `..` and NUL again and only ever walk downwards, so no URL can name
//! an inode outside the share. Symlinks are never followed (and hidden from
//! listings). There is no path cache: a lookup is one B+tree probe, and a
//! cache would need invalidation on every rename by another front end.
//!
//! **Blocking.** Every `Fs` call takes the pool lock and may wait for I/O,
//! so it runs on tokio's blocking pool (`spawn_blocking`), which the
//! server's runtime bounds ([`WebdavConfig::blocking_threads`]); executor
//! threads only move bytes between sockets and buffers.
//!
//! **Streaming and memory.** A download reads at most 1 MiB per `Fs::read`
//! and hands it to hyper, which applies socket back-pressure; an upload
//! gathers request-body frames into a ~1 MiB buffer and writes whole
//! chunks (one transaction per MiB, record-aligned). So one transfer holds
//! about 2 MiB whatever the file size, and the server's memory is bounded
//! by `max_connections` × that plus dav-server's 64 KiB limit on XML
//! bodies.
//!
//! **Metadata.** Length, mtime, crtime and an ETag of
//! `ino-generation-mtime_ns-size` (changes whenever content may have).
//! Quotas (`quota-used-bytes`, `quota-available-bytes`) come from
//! `statfs`.
//!
//! **Dead properties** live in xattrs of the resource, one per property,
//! named `user.tarn.dav.<hash>`; see [`props`](crate) for why the name is a
//! hash and what the value holds. They follow the inode through MOVE, are
//! copied by COPY, and vanish with the resource. A PROPPATCH is
//! all-or-nothing: earlier changes of a failing request are undone.
//!
//! **Locks** use dav-server's in-memory lock table (`MemLs`), one per
//! share: locks do not survive a restart of the server (clients then see
//! their lock tokens rejected and re-lock), and they only bind WebDAV
//! clients, not NFS/FUSE users of the same dataset.
//!
//! **Errors.** tarn-fs errnos map to dav-server's `FsError`
//! (ENOENT→404, EEXIST/ENOTEMPTY→405/412 as dav-server decides,
//! EACCES/EPERM/EROFS→403, ENOSPC/EDQUOT→507, EFBIG→413, ENAMETOOLONG→414,
//! ELOOP→508); anything unexpected is logged to stderr and answered 500.
//!
//! **Authentication and abuse.** Credentials are checked on the blocking
//! pool (an authenticator may hash slowly), a few at a time
//! ([`tarn_conn::PASSWORD_CHECKS_AT_ONCE`]; a check keeps its slot until
//! its hash ends), once for requests that bring the same credentials at
//! the same time, and remembered for [`WebdavConfig::auth_cache_ttl`].
//! Each check counts as an attempt just before its hash and a right
//! password takes back only its own ([`tarn_conn::LoginLimiter`]); after
//! [`WebdavConfig::auth_max_failures`] attempts not taken back in
//! [`WebdavConfig::auth_failure_window`] an IP gets 429 for every request
//! until the window passes; failures are logged to stderr. A read-only
//! principal or share gets 403 on every method that is not GET, HEAD,
//! OPTIONS, PROPFIND or REPORT, before dav-server sees the request (and
//! the filesystem refuses writes again, as defence in depth).
//!
//! **Transport.** Plain HTTP is refused on non-loopback addresses unless
//! explicitly allowed; HTTPS uses rustls (ring provider) with a PEM
//! certificate or a self-signed one generated at first start (feature
//! `tls`, on by default).
//!
//! See `docs/webdav.md` for connecting clients.

#![warn(missing_docs)]

mod api;
mod auth;
mod davfs;
pub mod headers;
mod locks;
mod panics;
pub mod propfix;
mod props;
pub mod reqwatch;
mod server;
#[cfg(feature = "tls")]
mod tls;

pub use api::FsApi;

/// The rustls server configuration of `cfg` (the certificate WebDAV uses,
/// generated when self-signed and absent) and its SHA-256 fingerprint,
/// for another server of the node to offer the same certificate. Its ALPN
/// list names HTTP/1.1; a server of another protocol clears it.
#[cfg(feature = "tls")]
pub fn tls_server_config(
    cfg: &TlsConfig,
) -> Result<(std::sync::Arc<rustls::ServerConfig>, String), WebdavError> {
    tls::server_config(cfg)
}
pub use auth::{Anonymous, Authenticator, Principal, StaticUsers};
pub use davfs::IO_CHUNK;
pub use props::XATTR_PREFIX as PROP_XATTR_PREFIX;
pub use server::{serve, Running, Share, TlsConfig, WebdavConfig, WebdavError};
pub use tarn_conn::Stats as ConnStats;

#[cfg(test)]
mod fuzz_tests;

//! tarn-nbd: an NBD (Network Block Device) server for block devices
//! behind [`tarn_vol::Device`], such as tarn's volumes.
//!
//! The protocol is the one documented as `doc/proto.md` in the NBD
//! project: a handshake that picks an export, then a transmission phase
//! of requests and replies. User guide: `docs/nbd.md`.
//!
//! # Handshake
//!
//! Fixed newstyle only (module `handshake` explains the order): the client
//! must answer with `NBD_FLAG_C_FIXED_NEWSTYLE` (oldstyle and plain
//! newstyle clients are disconnected). Options: `EXPORT_NAME`, `ABORT`,
//! `LIST`, `STARTTLS`, `INFO`, `GO` (with the `EXPORT`, `NAME`,
//! `DESCRIPTION` and `BLOCK_SIZE` items), `STRUCTURED_REPLY`,
//! `LIST_META_CONTEXT` and `SET_META_CONTEXT` (`base:allocation` only).
//! Anything else is `NBD_REP_ERR_UNSUP`, a malformed option
//! `NBD_REP_ERR_INVALID`, an unknown export `NBD_REP_ERR_UNKNOWN`. The
//! option decoders ([`option`]) are pure functions that never allocate
//! from a count the client sent.
//!
//! # Transmission
//!
//! Commands: `READ`, `WRITE`, `DISC`, `FLUSH`, `TRIM`, `CACHE` (answered
//! at once), `WRITE_ZEROES` (with `NO_HOLE` and `FAST_ZERO`, see below)
//! and `BLOCK_STATUS`. A request is judged by [`request::classify`]
//! before anything is allocated, and carried out by `exec::run`.
//!
//! Per connection, one task reads requests. A request first takes one of
//! [`NbdConfig::max_inflight_per_connection`] slots and the memory it will
//! hold (its payload; 2 MiB for block status) out of
//! [`NbdConfig::max_inflight_bytes_per_connection`]; when
//! either is exhausted the connection is not read further (TCP
//! back-pressure). Then a write's payload is read in full (so the next
//! header is always at the start of the stream's next bytes), and the
//! device call runs on the blocking pool ([`NbdConfig::workers`] threads
//! shared by all connections), because `Device` calls block on disks;
//! except writes of whole blocks without FUA, which run one after the
//! other on a thread of the connection's own (`Writes` in `server.rs`:
//! they read nothing first, and in turn they do not wait for one another
//! on the volume's lock), and reads answered from memory on the
//! connection's task.
//! Its reply goes to the connection's one writer task, which writes
//! replies in completion order (the cookie matches them to requests),
//! batching those that are ready together; the slot and bytes are given
//! back only once the reply is written, so a client that does not read
//! its replies stops being read itself. Memory is thus bounded by
//! `max_connections × max_inflight_bytes_per_connection` (plus a few
//! bytes per small reply and 128 KiB of buffers per connection), and no
//! single request allocates more than [`NbdConfig::max_payload`].
//!
//! `NBD_CMD_DISC`, the end of the stream, a protocol violation, an
//! eviction or [`Running::stop`] all end the same way: reading stops,
//! the requests in flight finish and their replies are written, then
//! the stream is shut down (TLS `close_notify`, TCP FIN).
//!
//! # Durability and ordering
//!
//! A write is acknowledged when `Device::write` returns: visible to every
//! later read on any connection, durable at the next flush. `FUA` on a
//! write or write-zeroes is passed to the device as `fua` (durable
//! before the reply); on a trim it adds a `Device::flush`. `FLUSH` calls
//! `Device::flush`, which makes every write that has returned, on any
//! connection, durable; every write the client saw acknowledged before
//! sending the flush had returned, so it is covered, which is exactly
//! what the protocol asks. Requests of one connection run concurrently
//! and may complete in any order, as the protocol allows; since flush
//! and FUA act on the whole device, the server advertises
//! `NBD_FLAG_CAN_MULTI_CONN`.
//!
//! `NO_HOLE` on write-zeroes is accepted and has no effect: a volume
//! stores zeros as holes whatever the client asks, and space is
//! reserved per volume, not per block, so a hole does not make a later
//! write more likely to fail. `FAST_ZERO` succeeds over whole blocks
//! (zeroing frees them rather than writing them) and is refused with
//! `ENOTSUP` over part of a block, which a volume reads and writes again.
//!
//! # Replies
//!
//! Without structured replies every reply is simple. With them, a read
//! is one content chunk (`OFFSET_HOLE` if all zeros, else `OFFSET_DATA`),
//! which is why `NBD_CMD_FLAG_DF` costs nothing and is advertised; block
//! status is one chunk of at most 65536 extents (holes are
//! `HOLE | ZERO`); errors are `ERROR` chunks carrying the device's
//! message; other successes are simple replies.
//!
//! # Connections and limits
//!
//! Connections are admitted by [`tarn_conn::Admission`]: at most
//! [`NbdConfig::max_connections_per_address`] per address; when all
//! [`NbdConfig::max_connections`] are taken, an idle connection (no
//! request in flight, or still negotiating) is closed for the newcomer.
//! The handshake must finish within [`NbdConfig::handshake_timeout`]
//! and at most 1024 options; an option's payload is at most 64 KiB.
//! There is no idle timeout by default (NBD clients do not reconnect on
//! their own), but TCP keepalive finds vanished peers, and a client that
//! stops reading replies is given up after [`NbdConfig::reply_timeout`].
//!
//! # TLS
//!
//! With [`NbdConfig::tls`], `NBD_OPT_STARTTLS` upgrades the connection
//! with tokio-rustls and negotiation starts over inside TLS (nothing
//! negotiated before survives). With [`NbdConfig::tls_required`] the
//! server is in the protocol's FORCEDTLS mode: every option but
//! `STARTTLS` and `ABORT` is refused with `NBD_REP_ERR_TLS_REQD` until
//! TLS is on, and `EXPORT_NAME` in clear text closes the connection.
//!
//! # Runtime
//!
//! As the other network servers, the server owns a small tokio runtime
//! (2 threads) on a dedicated thread, so it can be started from sync or
//! async code and [`Running::stop`] tears it down deterministically.

#![warn(missing_docs)]

mod exec;
mod export;
mod handshake;
pub mod option;
pub mod proto;
pub mod request;
mod server;

pub use export::NbdExport;
pub use server::{ConnStats, NbdConfig, NbdServer, Running};

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

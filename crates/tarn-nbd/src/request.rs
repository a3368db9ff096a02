//! Decoding and judging transmission requests.
//!
//! A request is a fixed 28-byte header, followed by a payload only for
//! `NBD_CMD_WRITE`. [`decode_header`] checks the magic (a wrong magic
//! means the stream is out of step and cannot be resynchronised: the
//! connection is closed). [`classify`] then decides, from the header and
//! what was negotiated ([`SessionView`]), before anything is allocated:
//!
//! - [`Decision::Run`]: a command the device will carry out; its range
//!   is inside the export and a read or write is at most the maximum
//!   payload, so the caller may allocate `len` bytes;
//! - [`Decision::Refuse`]: an error reply, after reading and dropping
//!   the write payload that follows (`skip` bytes, never more than the
//!   larger of the maximum payload and [`MAX_SKIP`]), so the stream stays
//!   in step and the connection usable;
//! - [`Decision::Close`]: a write announcing more than [`MAX_SKIP`]
//!   bytes over the maximum payload; skipping it could take unbounded
//!   time, so the server hangs up (the protocol allows a hard disconnect
//!   when a client breaks a MUST);
//! - [`Decision::Disconnect`] for `NBD_CMD_DISC`.
//!
//! The errors follow the protocol's SHOULDs: an unknown command or a flag
//! not defined for the command is `EINVAL`; a read or trim past the end
//! is `EINVAL` while a write or write-zeroes past the end is `ENOSPC`; a
//! write of any kind to a read-only export is `EPERM`; a read over the
//! maximum payload is `EOVERFLOW` with structured replies (explicitly
//! allowed there) and `EINVAL` without.

use crate::proto::{self, cmd, cmd_flag, errno};

/// Longest write payload over the maximum that is read and dropped to
/// answer with an error instead of hanging up: 32 MiB, the size the
/// protocol says no server should treat as an attack.
pub const MAX_SKIP: u32 = 1 << 25;

/// A request header as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags (`NBD_CMD_FLAG_*`).
    pub flags: u16,
    /// Command (`NBD_CMD_*`).
    pub kind: u16,
    /// The client's opaque tag, echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (of the payload for a write).
    pub len: u32,
}

/// The request header did not start with the request magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad request magic {0:#010x}")]
pub struct BadMagic(pub u32);

/// Decodes a request header.
pub fn decode_header(b: &[u8; proto::REQUEST_HEADER_LEN]) -> Result<RequestHeader, BadMagic> {
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| (u32_at(i) as u64) << 32 | u32_at(i + 4) as u64;
    let magic = u32_at(0);
    if magic != proto::REQUEST_MAGIC {
        return Err(BadMagic(magic));
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes([b[4], b[5]]),
        kind: u16::from_be_bytes([b[6], b[7]]),
        cookie: u64_at(8),
        offset: u64_at(16),
        len: u32_at(24),
    })
}

/// What the negotiation settled that a request is judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionView {
    /// Export size in bytes, as advertised.
    pub size: u64,
    /// The export refuses writes.
    pub read_only: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export.
    pub block_status: bool,
    /// Largest read or write payload.
    pub max_payload: u32,
}

/// A command to carry out, checked against the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read `len` bytes.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes (at most the maximum payload).
        len: u32,
    },
    /// Write the `len`-byte payload that follows the header.
    Write {
        /// Byte offset.
        offset: u64,
        /// Payload bytes (at most the maximum payload).
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// Make every acknowledged write durable.
    Flush,
    /// Discard a range.
    Trim {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Durable before the reply.
        fua: bool,
    },
    /// A read-ahead hint (answered at once).
    Cache,
    /// Write zeros over a range.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Durable before the reply.
        fua: bool,
        /// `FAST_ZERO`: refuse at once (`ENOTSUP`) rather than be slower
        /// than a write of zeros.
        fast: bool,
    },
    /// Allocation status of a range (`base:allocation`).
    BlockStatus {
        /// Byte offset.
        offset: u64,
        /// Bytes asked about (a hint; never zero).
        len: u32,
        /// Exactly one extent, no longer than `len`.
        req_one: bool,
        /// Most descriptors the reply may hold: its payload stays within
        /// the maximum payload advertised, as the protocol asks.
        max_extents: u32,
    },
}

/// Most memory a block status request holds while in flight: the
/// device's answer for at most 65536 blocks (16 bytes an extent) and
/// the encoded reply (8 bytes an extent), rounded up.
pub const STATUS_MEMORY: u32 = 2 << 20;

impl Command {
    /// Bytes this command holds in memory while in flight at most: the
    /// payload read or written, [`STATUS_MEMORY`] for block status, 0
    /// for the rest (their replies are a few bytes).
    pub fn memory_bytes(&self) -> u32 {
        match *self {
            Command::Read { len, .. } | Command::Write { len, .. } => len,
            Command::BlockStatus { .. } => STATUS_MEMORY,
            _ => 0,
        }
    }
}

/// What to do with a request (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Carry out the command.
    Run(Command),
    /// Answer `errno` after reading and dropping `skip` payload bytes.
    Refuse {
        /// The reply's error value.
        errno: u32,
        /// Payload bytes to read and drop first (at most the larger of
        /// the maximum payload and [`MAX_SKIP`]).
        skip: u32,
        /// For the error message.
        why: &'static str,
    },
    /// Close the connection at once.
    Close,
    /// The client's orderly disconnect.
    Disconnect,
}

/// Judges a request (see the module docs).
pub fn classify(h: &RequestHeader, s: &SessionView) -> Decision {
    let refuse = |errno, why| Decision::Refuse {
        errno,
        skip: 0,
        why,
    };
    let fua = h.flags & cmd_flag::FUA != 0;
    let in_range = h
        .offset
        .checked_add(h.len as u64)
        .is_some_and(|end| end <= s.size);
    // FUA is valid on every command; others only where defined.
    let only = |allowed: u16| h.flags & !(allowed | cmd_flag::FUA) == 0;
    match h.kind {
        cmd::READ => {
            let df = if s.structured { cmd_flag::DF } else { 0 };
            if !only(df) {
                refuse(errno::EINVAL, "a flag not defined for reads")
            } else if h.len > s.max_payload {
                let e = if s.structured {
                    errno::EOVERFLOW
                } else {
                    errno::EINVAL
                };
                refuse(e, "a read over the maximum payload")
            } else if !in_range {
                refuse(errno::EINVAL, "a read past the end of the export")
            } else {
                Decision::Run(Command::Read {
                    offset: h.offset,
                    len: h.len,
                })
            }
        }
        cmd::WRITE => {
            let skip = |errno, why| Decision::Refuse {
                errno,
                skip: h.len,
                why,
            };
            if h.len > s.max_payload {
                if h.len > MAX_SKIP {
                    Decision::Close
                } else {
                    skip(errno::EINVAL, "a write over the maximum payload")
                }
            } else if !only(0) {
                skip(errno::EINVAL, "a flag not defined for writes")
            } else if s.read_only {
                skip(errno::EPERM, "the export is read-only")
            } else if !in_range {
                skip(errno::ENOSPC, "a write past the end of the export")
            } else {
                Decision::Run(Command::Write {
                    offset: h.offset,
                    len: h.len,
                    fua,
                })
            }
        }
        cmd::DISC => Decision::Disconnect,
        cmd::FLUSH => {
            if !only(0) {
                refuse(errno::EINVAL, "a flag not defined for flushes")
            } else {
                Decision::Run(Command::Flush)
            }
        }
        cmd::TRIM => {
            if !only(0) {
                refuse(errno::EINVAL, "a flag not defined for trims")
            } else if s.read_only {
                refuse(errno::EPERM, "the export is read-only")
            } else if !in_range {
                refuse(errno::EINVAL, "a trim past the end of the export")
            } else {
                Decision::Run(Command::Trim {
                    offset: h.offset,
                    len: h.len,
                    fua,
                })
            }
        }
        cmd::CACHE => {
            if !only(0) {
                refuse(errno::EINVAL, "a flag not defined for cache requests")
            } else if !in_range {
                refuse(errno::EINVAL, "a cache request past the end of the export")
            } else {
                Decision::Run(Command::Cache)
            }
        }
        cmd::WRITE_ZEROES => {
            if !only(cmd_flag::NO_HOLE | cmd_flag::FAST_ZERO) {
                refuse(errno::EINVAL, "a flag not defined for write zeroes")
            } else if s.read_only {
                refuse(errno::EPERM, "the export is read-only")
            } else if !in_range {
                refuse(errno::ENOSPC, "write zeroes past the end of the export")
            } else {
                Decision::Run(Command::WriteZeroes {
                    offset: h.offset,
                    len: h.len,
                    fua,
                    fast: h.flags & cmd_flag::FAST_ZERO != 0,
                })
            }
        }
        cmd::BLOCK_STATUS => {
            if !only(cmd_flag::REQ_ONE) {
                refuse(errno::EINVAL, "a flag not defined for block status")
            } else if !s.block_status {
                refuse(errno::EINVAL, "no metadata context was selected")
            } else if h.len == 0 {
                refuse(errno::EINVAL, "block status of an empty range")
            } else if !in_range {
                refuse(errno::EINVAL, "block status past the end of the export")
            } else {
                Decision::Run(Command::BlockStatus {
                    offset: h.offset,
                    len: h.len,
                    req_one: h.flags & cmd_flag::REQ_ONE != 0,
                    max_extents: (s.max_payload.saturating_sub(4) / 8).max(1),
                })
            }
        }
        _ => refuse(errno::EINVAL, "an unknown command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u32 = 1 << 20;

    fn encode(h: &RequestHeader) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[..4].copy_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&h.flags.to_be_bytes());
        b[6..8].copy_from_slice(&h.kind.to_be_bytes());
        b[8..16].copy_from_slice(&h.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&h.offset.to_be_bytes());
        b[24..].copy_from_slice(&h.len.to_be_bytes());
        b
    }

    fn req(kind: u16, flags: u16, offset: u64, len: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            cookie: 0x1122_3344_5566_7788,
            offset,
            len,
        }
    }

    fn session() -> SessionView {
        SessionView {
            size: 8 << 30,
            read_only: false,
            structured: true,
            block_status: true,
            max_payload: 32 * MIB,
        }
    }

    fn errno_of(d: Decision) -> u32 {
        match d {
            Decision::Refuse { errno, .. } => errno,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn header_roundtrip_and_magic() {
        let h = req(cmd::WRITE, cmd_flag::FUA, 1 << 40, 4096);
        assert_eq!(decode_header(&encode(&h)), Ok(h));
        let mut b = encode(&h);
        b[3] ^= 0xff;
        assert!(decode_header(&b).is_err());
    }

    #[test]
    fn commands_in_range_run() {
        let s = session();
        assert_eq!(
            classify(&req(cmd::READ, 0, 0, MIB), &s),
            Decision::Run(Command::Read {
                offset: 0,
                len: MIB
            })
        );
        assert_eq!(
            classify(&req(cmd::WRITE, cmd_flag::FUA, 4096, 512), &s),
            Decision::Run(Command::Write {
                offset: 4096,
                len: 512,
                fua: true
            })
        );
        assert_eq!(
            classify(&req(cmd::FLUSH, 0, 0, 0), &s),
            Decision::Run(Command::Flush)
        );
        assert_eq!(classify(&req(cmd::DISC, 0, 0, 0), &s), Decision::Disconnect);
        assert_eq!(
            classify(
                &req(
                    cmd::WRITE_ZEROES,
                    cmd_flag::NO_HOLE | cmd_flag::FAST_ZERO,
                    0,
                    u32::MAX
                ),
                &s
            ),
            Decision::Run(Command::WriteZeroes {
                offset: 0,
                len: u32::MAX,
                fua: false,
                fast: true
            }),
            "no payload: any length inside the export"
        );
        assert_eq!(
            classify(&req(cmd::BLOCK_STATUS, cmd_flag::REQ_ONE, 0, 10), &s),
            Decision::Run(Command::BlockStatus {
                offset: 0,
                len: 10,
                req_one: true,
                max_extents: (32 * MIB - 4) / 8
            })
        );
        // The whole export, ending exactly at its end.
        assert!(matches!(
            classify(&req(cmd::TRIM, 0, s.size - MIB as u64, MIB), &s),
            Decision::Run(Command::Trim { .. })
        ));
        assert_eq!(
            classify(&req(cmd::CACHE, cmd_flag::FUA, 0, 1), &s),
            Decision::Run(Command::Cache)
        );
    }

    #[test]
    fn out_of_range_errors_depend_on_the_command() {
        let s = session();
        let end = s.size;
        assert_eq!(
            errno_of(classify(&req(cmd::READ, 0, end, 1), &s)),
            errno::EINVAL
        );
        assert_eq!(
            errno_of(classify(&req(cmd::TRIM, 0, end - 1, 2), &s)),
            errno::EINVAL
        );
        assert_eq!(
            errno_of(classify(&req(cmd::BLOCK_STATUS, 0, end, 1), &s)),
            errno::EINVAL
        );
        assert_eq!(
            errno_of(classify(&req(cmd::WRITE_ZEROES, 0, end, 1), &s)),
            errno::ENOSPC
        );
        assert_eq!(
            classify(&req(cmd::WRITE, 0, end, 512), &s),
            Decision::Refuse {
                errno: errno::ENOSPC,
                skip: 512,
                why: "a write past the end of the export"
            }
        );
        // Offsets that overflow are out of range, not wrapped.
        assert_eq!(
            errno_of(classify(&req(cmd::READ, 0, u64::MAX, 2), &s)),
            errno::EINVAL
        );
    }

    #[test]
    fn oversized_payloads() {
        let s = session();
        assert_eq!(
            errno_of(classify(&req(cmd::READ, 0, 0, 32 * MIB + 1), &s)),
            errno::EOVERFLOW
        );
        let simple = SessionView {
            structured: false,
            ..s
        };
        assert_eq!(
            errno_of(classify(&req(cmd::READ, 0, 0, 32 * MIB + 1), &simple)),
            errno::EINVAL
        );
        // Over the maximum but skippable: dropped, then EINVAL.
        let small = SessionView {
            max_payload: MIB,
            ..s
        };
        assert!(matches!(
            classify(&req(cmd::WRITE, 0, 0, 2 * MIB), &small),
            Decision::Refuse { errno: errno::EINVAL, skip, .. } if skip == 2 * MIB
        ));
        // Too large to skip: the connection is closed.
        assert_eq!(
            classify(&req(cmd::WRITE, 0, 0, MAX_SKIP + 1), &s),
            Decision::Close
        );
    }

    #[test]
    fn flags_unknown_commands_read_only_and_contexts() {
        let s = session();
        assert_eq!(errno_of(classify(&req(99, 0, 0, 0), &s)), errno::EINVAL);
        assert_eq!(
            errno_of(classify(&req(cmd::READ, cmd_flag::NO_HOLE, 0, 1), &s)),
            errno::EINVAL
        );
        assert!(matches!(
            classify(&req(cmd::READ, cmd_flag::DF, 0, 1), &s),
            Decision::Run(_)
        ));
        let simple = SessionView {
            structured: false,
            ..s
        };
        assert_eq!(
            errno_of(classify(&req(cmd::READ, cmd_flag::DF, 0, 1), &simple)),
            errno::EINVAL,
            "DF is only advertised with structured replies"
        );
        assert!(matches!(
            classify(&req(cmd::WRITE, cmd_flag::DF, 0, 8), &s),
            Decision::Refuse {
                errno: errno::EINVAL,
                skip: 8,
                ..
            }
        ));
        let ro = SessionView {
            read_only: true,
            ..s
        };
        assert!(matches!(
            classify(&req(cmd::WRITE, 0, 0, 8), &ro),
            Decision::Refuse {
                errno: errno::EPERM,
                skip: 8,
                ..
            }
        ));
        assert_eq!(
            errno_of(classify(&req(cmd::TRIM, 0, 0, 8), &ro)),
            errno::EPERM
        );
        assert_eq!(
            errno_of(classify(&req(cmd::WRITE_ZEROES, 0, 0, 8), &ro)),
            errno::EPERM
        );
        assert!(matches!(
            classify(&req(cmd::READ, 0, 0, 8), &ro),
            Decision::Run(_)
        ));
        assert!(matches!(
            classify(&req(cmd::FLUSH, 0, 0, 0), &ro),
            Decision::Run(_)
        ));
        let no_ctx = SessionView {
            block_status: false,
            ..s
        };
        assert_eq!(
            errno_of(classify(&req(cmd::BLOCK_STATUS, 0, 0, 8), &no_ctx)),
            errno::EINVAL
        );
        assert_eq!(
            errno_of(classify(&req(cmd::BLOCK_STATUS, 0, 0, 0), &s)),
            errno::EINVAL
        );
    }

    fn any_session() -> impl Strategy<Value = SessionView> {
        (
            any::<u64>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            1u32..=u32::MAX,
        )
            .prop_map(|(size, read_only, structured, block_status, max_payload)| {
                SessionView {
                    size,
                    read_only,
                    structured,
                    block_status,
                    max_payload,
                }
            })
    }

    proptest! {
        #[test]
        fn arbitrary_headers_never_panic_and_runs_are_bounded(
            bytes in proptest::array::uniform28(any::<u8>()),
            kind in 0u16..10,
            s in any_session(),
            magic_ok in any::<bool>(),
        ) {
            let mut b = bytes;
            if magic_ok {
                b[..4].copy_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
                b[6..8].copy_from_slice(&kind.to_be_bytes());
            }
            let Ok(h) = decode_header(&b) else { return Ok(()) };
            match classify(&h, &s) {
                Decision::Run(c) => {
                    // What runs is inside the export and within the payload bound.
                    if matches!(c, Command::Read { .. } | Command::Write { .. }) {
                        prop_assert!(c.memory_bytes() <= s.max_payload);
                    }
                    prop_assert!(h.offset.checked_add(h.len as u64).is_some_and(|e| e <= s.size)
                        || c == Command::Flush);
                    if matches!(c, Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }) {
                        prop_assert!(!s.read_only);
                    }
                }
                Decision::Refuse { errno, skip, .. } => {
                    prop_assert!(errno != 0);
                    prop_assert!(skip <= MAX_SKIP.max(s.max_payload));
                    prop_assert!(skip == 0 || h.kind == cmd::WRITE);
                }
                Decision::Close => prop_assert!(h.kind == cmd::WRITE && h.len > MAX_SKIP),
                Decision::Disconnect => prop_assert_eq!(h.kind, cmd::DISC),
            }
        }
    }
}

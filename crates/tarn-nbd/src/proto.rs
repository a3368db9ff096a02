//! The NBD wire vocabulary: magic numbers, option and reply codes, flags,
//! error values, and the encoders of the server's messages.
//!
//! Every number is big-endian on the wire. The names are the protocol's
//! own (`NBD_OPT_GO` is [`opt::GO`]) so the code reads against the
//! specification. Only encoders live here; what the client sends is
//! decoded in [`crate::option`] and [`crate::request`].

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic after `NBDMAGIC`, and the magic of
/// every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of the server's option replies.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of a request header (magic to length).
pub const REQUEST_HEADER_LEN: usize = 28;
/// Bytes of an option header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;
/// Longest string (export name, description, query, message) the
/// protocol allows.
pub const MAX_STRING: usize = 4096;

/// Handshake flags (server, 16 bits).
pub mod hs {
    /// The server speaks fixed newstyle.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// The server can leave out the 124 zero bytes after
    /// `NBD_OPT_EXPORT_NAME`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits, answered to the handshake flags).
pub mod client {
    /// The client speaks fixed newstyle (required by this server).
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// The client asks that the 124 zero bytes be left out.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission flags (16 bits, per export and session).
pub mod tx {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// Writes fail with `EPERM`.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is understood.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is understood.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The medium is rotational (never set by this server).
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is understood.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` and `NBD_CMD_FLAG_NO_HOLE` are understood.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` on reads is understood (structured replies only).
    pub const SEND_DF: u16 = 1 << 7;
    /// Flushes and FUA are visible across every connection to the export.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is understood.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_CMD_FLAG_FAST_ZERO` is understood.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    /// Choose an export and enter transmission (no error possible).
    pub const EXPORT_NAME: u32 = 1;
    /// End the negotiation.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade the connection to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe one export.
    pub const INFO: u32 = 6;
    /// Describe one export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts for `NBD_CMD_BLOCK_STATUS`.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types (`NBD_REP_*`).
pub mod rep {
    /// The option succeeded (or its list is complete).
    pub const ACK: u32 = 1;
    /// One export of a list.
    pub const SERVER: u32 = 2;
    /// One piece of information about an export.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    const ERR: u32 = 1 << 31;
    /// The option is not known to this server.
    pub const ERR_UNSUP: u32 = ERR + 1;
    /// The option is refused by policy.
    pub const ERR_POLICY: u32 = ERR + 2;
    /// The option is malformed or not valid now.
    pub const ERR_INVALID: u32 = ERR + 3;
    /// TLS must be started first.
    pub const ERR_TLS_REQD: u32 = ERR + 5;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = ERR + 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERR + 7;
    /// The option is too large to process.
    pub const ERR_TOO_BIG: u32 = ERR + 9;
}

/// Information types of `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// The canonical export name.
    pub const NAME: u16 = 1;
    /// A description for people.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Commands (`NBD_CMD_*`).
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write (a payload follows the header).
    pub const WRITE: u16 = 1;
    /// Disconnect after the requests in flight.
    pub const DISC: u16 = 2;
    /// Make every acknowledged write durable.
    pub const FLUSH: u16 = 3;
    /// Discard a range.
    pub const TRIM: u16 = 4;
    /// Read-ahead hint.
    pub const CACHE: u16 = 5;
    /// Write zeros without a payload.
    pub const WRITE_ZEROES: u16 = 6;
    /// Allocation status of a range.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags (`NBD_CMD_FLAG_*`).
pub mod cmd_flag {
    /// Force unit access: durable before the reply.
    pub const FUA: u16 = 1 << 0;
    /// Write zeros without making a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// Do not fragment a read reply.
    pub const DF: u16 = 1 << 2;
    /// One extent in a block status reply.
    pub const REQ_ONE: u16 = 1 << 3;
    /// Fail write zeroes at once unless it is fast.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags (`NBD_REPLY_*`).
pub mod reply {
    /// The last chunk of a reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// No payload; ends a reply.
    pub const TYPE_NONE: u16 = 0;
    /// Data at an offset.
    pub const TYPE_OFFSET_DATA: u16 = 1;
    /// Zeros at an offset.
    pub const TYPE_OFFSET_HOLE: u16 = 2;
    /// Extents of one metadata context.
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    /// An error with a message.
    pub const TYPE_ERROR: u16 = (1 << 15) + 1;
}

/// Error values of replies (`NBD_E*`); the protocol fixes them, whatever
/// the host's errno numbers.
pub mod errno {
    /// Operation not permitted (a write to a read-only export).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left (also: a write past the end).
    pub const ENOSPC: u32 = 28;
    /// Value too large (a read over the maximum payload).
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// The `base:allocation` metadata context's name.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id this server gives `base:allocation` when it is selected.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` flag: not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` flag: reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..].copy_from_slice(&(hs::FIXED_NEWSTYLE | hs::NO_ZEROES).to_be_bytes());
    b
}

/// Appends one option reply to `out`.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an option error reply carrying `msg` (cut to the protocol's
/// string limit) to `out`.
pub fn option_error(out: &mut Vec<u8>, option: u32, kind: u32, msg: &str) {
    option_reply(out, option, kind, truncate(msg, MAX_STRING).as_bytes());
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, flags, and unless the client
/// asked otherwise, 124 zero bytes.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(134);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.resize(b.len() + 124, 0);
    }
    b
}

/// A simple reply header (16 bytes); a successful read's data follows it.
pub fn simple_reply(error: u32, cookie: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b
}

/// Appends a structured chunk header (20 bytes) announcing `len` payload
/// bytes to `out`.
pub fn chunk_header(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// An `NBD_REPLY_TYPE_ERROR` chunk that ends its reply.
pub fn error_chunk(error: u32, cookie: u64, msg: &str) -> Vec<u8> {
    // The message length field is 16 bits and strings are capped anyway;
    // a short message is kinder to logs than a long one.
    let msg = truncate(msg, 1024);
    let mut b = Vec::with_capacity(26 + msg.len());
    chunk_header(
        &mut b,
        reply::FLAG_DONE,
        reply::TYPE_ERROR,
        cookie,
        6 + msg.len() as u32,
    );
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg.as_bytes());
    b
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_is_the_newstyle_preamble() {
        let g = greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
    }

    #[test]
    fn option_reply_layout() {
        let mut b = Vec::new();
        option_reply(&mut b, opt::GO, rep::ACK, &[]);
        assert_eq!(b.len(), 20);
        assert_eq!(&b[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&b[8..12], &7u32.to_be_bytes());
        assert_eq!(&b[12..16], &1u32.to_be_bytes());
        assert_eq!(&b[16..20], &[0; 4]);
        let mut e = Vec::new();
        option_error(&mut e, 99, rep::ERR_UNSUP, &"x".repeat(10_000));
        assert_eq!(e.len(), 20 + MAX_STRING);
        assert_eq!(&e[12..16], &0x8000_0001u32.to_be_bytes());
    }

    #[test]
    fn export_name_reply_honours_no_zeroes() {
        assert_eq!(export_name_reply(1 << 20, 1, false).len(), 134);
        let r = export_name_reply(1 << 20, 0x0101, true);
        assert_eq!(r, [0, 0, 0, 0, 0, 0x10, 0, 0, 0x01, 0x01]);
    }

    #[test]
    fn error_chunk_layout() {
        let c = error_chunk(errno::EINVAL, 7, "bad");
        assert_eq!(c.len(), 20 + 6 + 3);
        assert_eq!(&c[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(u16::from_be_bytes([c[4], c[5]]), reply::FLAG_DONE);
        assert_eq!(u16::from_be_bytes([c[6], c[7]]), 0x8001);
        assert_eq!(u64::from_be_bytes(c[8..16].try_into().unwrap()), 7);
        assert_eq!(u32::from_be_bytes(c[16..20].try_into().unwrap()), 9);
        assert_eq!(u32::from_be_bytes(c[20..24].try_into().unwrap()), 22);
        assert_eq!(&c[26..], b"bad");
    }

    #[test]
    fn truncate_keeps_characters_whole() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }
}

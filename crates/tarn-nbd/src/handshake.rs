//! The handshake: fixed newstyle negotiation up to the transmission
//! phase.
//!
//! # Order
//!
//! 1. The server sends `NBDMAGIC`, `IHAVEOPT` and its handshake flags
//!    (`FIXED_NEWSTYLE | NO_ZEROES`); the client answers with its flags.
//!    A client without `FIXED_NEWSTYLE`, or with a bit the server does
//!    not know, is disconnected (oldstyle is never offered).
//! 2. Options, one at a time: the client sends one and waits for its
//!    final reply. [`negotiate`] reads the 16-byte header, refuses a
//!    payload over [`MAX_OPTION_LEN`] (`ERR_TOO_BIG`, then the connection
//!    is closed, as its bytes cannot be skipped cheaply), reads the
//!    payload, and hands both to [`handle`], a plain function of the
//!    negotiation state that writes the replies into a buffer. The
//!    buffer goes out in one write and is flushed (a TLS stream holds
//!    data until flushed) before the next option is read.
//! 3. It ends with `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME` (transmission),
//!    `NBD_OPT_ABORT`, or `NBD_OPT_STARTTLS`, after whose `ACK` the
//!    caller runs the TLS handshake and calls [`negotiate`] again over
//!    the encrypted stream with the state reset (the protocol forbids
//!    keeping what was negotiated in clear text).
//!
//! # State and invariants
//!
//! [`HsState`] holds what options changed: whether TLS is on, whether
//! structured replies were asked for, and the export for which
//! `base:allocation` was selected. Block status is enabled in the
//! session only if the last `NBD_OPT_SET_META_CONTEXT` named the same
//! export (after resolving the empty name) that `NBD_OPT_GO` enters.
//! With `tls_required`, every option other than `STARTTLS` and `ABORT`
//! gets `ERR_TLS_REQD` until TLS is on, and `EXPORT_NAME` (which cannot
//! fail) closes the connection. The export table is read afresh for
//! each option, so a client always negotiates against the current list;
//! the export it enters keeps its device for the whole session (or until
//! `set_exports` ends the session because it no longer admits it).

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::export::{NbdExport, Table};
use crate::option::{self, OptionError};
use crate::proto::{self, client, info, opt, rep, tx};
use crate::request::SessionView;

/// Largest option payload read: room for any well-formed option (names
/// and queries are at most 4096 bytes) with many queries or info items.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Most options in one handshake: no client needs more than a few dozen.
pub const MAX_OPTIONS: usize = 1024;

/// What the server's configuration says about negotiating.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// A TLS configuration exists (`STARTTLS` can succeed).
    pub tls_available: bool,
    /// Nothing but `STARTTLS` and `ABORT` before TLS.
    pub tls_required: bool,
    /// Largest read or write payload.
    pub max_payload: u32,
}

/// What the options so far have settled.
#[derive(Clone, Debug, Default)]
pub(crate) struct HsState {
    /// TLS is on.
    pub tls: bool,
    /// The client left out the 124 zero bytes after `EXPORT_NAME`.
    pub no_zeroes: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The export (its real name) for which `base:allocation` is selected.
    pub meta: Option<String>,
    /// Options seen on this connection.
    pub options: usize,
}

/// The transmission phase's settings for one connection.
#[derive(Clone)]
pub(crate) struct Session {
    /// The export entered (holding its device).
    pub export: Arc<NbdExport>,
    /// What requests are judged against.
    pub view: SessionView,
    /// The device's block size, read once in the handshake.
    pub block: u32,
}

/// How the handshake ended.
pub(crate) enum Outcome {
    /// Enter transmission.
    Go(Session),
    /// `STARTTLS` was acknowledged: upgrade, then negotiate again.
    StartTls,
    /// The client aborted (the `ACK` was sent).
    Abort,
}

/// Why the handshake failed; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HsError {
    /// The socket failed or the client hung up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol.
    #[error("{0}")]
    Protocol(String),
}

/// What [`handle`] decided after writing its replies.
#[derive(Debug)]
pub(crate) enum Step {
    /// Read the next option.
    Next,
    /// Enter transmission with this export.
    Go(Arc<NbdExport>),
    /// Upgrade to TLS.
    StartTls,
    /// The client aborted.
    Abort,
    /// Close the connection (after sending what was written, if anything).
    Close(String),
}

/// The transmission flags of an export in a session: every command is
/// offered except the writing ones on a read-only export; `DF` only with
/// structured replies (as the protocol requires). `CAN_MULTI_CONN` holds
/// because `Device::flush` makes the writes of every connection durable.
pub(crate) fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f = tx::HAS_FLAGS | tx::SEND_CACHE | tx::CAN_MULTI_CONN;
    if read_only {
        f |= tx::READ_ONLY;
    } else {
        f |= tx::SEND_FLUSH
            | tx::SEND_FUA
            | tx::SEND_TRIM
            | tx::SEND_WRITE_ZEROES
            | tx::SEND_FAST_ZERO;
    }
    if structured {
        f |= tx::SEND_DF;
    }
    f
}

/// `(minimum, preferred, maximum)` as `NBD_INFO_BLOCK_SIZE` advertises
/// them: any byte is addressable (the device does read-modify-write);
/// the preferred size is the device's block size, rounded up to a power
/// of two of at least 512 and down to fit the maximum payload.
pub(crate) fn block_sizes(device_block: u32, max_payload: u32) -> (u32, u32, u32) {
    let mut pref = device_block.max(512);
    if !pref.is_power_of_two() {
        pref = pref.checked_next_power_of_two().unwrap_or(1 << 31);
    }
    while pref > max_payload && pref > 512 {
        pref /= 2;
    }
    (1, pref, max_payload.max(pref))
}

/// The session an export is entered with.
pub(crate) fn session(export: Arc<NbdExport>, st: &HsState, policy: &Policy) -> Session {
    let read_only = export.is_read_only();
    let view = SessionView {
        size: export.device.size(),
        read_only,
        structured: st.structured,
        block_status: st.meta.as_deref() == Some(export.name.as_str()),
        max_payload: policy.max_payload,
    };
    let block = export.device.block_size();
    Session {
        export,
        view,
        block,
    }
}

/// Sends the greeting and reads the client's flags; returns whether the
/// client asked for no zeroes.
pub(crate) async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<bool, HsError> {
    s.write_all(&proto::greeting()).await?;
    s.flush().await?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await?;
    let flags = u32::from_be_bytes(b);
    if flags & !(client::FIXED_NEWSTYLE | client::NO_ZEROES) != 0 {
        return Err(HsError::Protocol(format!(
            "unknown client flags {flags:#x}"
        )));
    }
    if flags & client::FIXED_NEWSTYLE == 0 {
        return Err(HsError::Protocol(
            "the client does not speak fixed newstyle negotiation".into(),
        ));
    }
    Ok(flags & client::NO_ZEROES != 0)
}

/// Runs options until one ends the handshake (see the module docs).
/// `table` is called once per option for the current export list.
pub(crate) async fn negotiate<S, T>(
    s: &mut S,
    st: &mut HsState,
    policy: &Policy,
    table: T,
) -> Result<Outcome, HsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: Fn() -> Arc<Table>,
{
    loop {
        st.options += 1;
        if st.options > MAX_OPTIONS {
            return Err(HsError::Protocol(format!(
                "more than {MAX_OPTIONS} options in one handshake"
            )));
        }
        let mut hb = [0u8; proto::OPTION_HEADER_LEN];
        s.read_exact(&mut hb).await?;
        let h = option::decode_header(&hb).map_err(|e| HsError::Protocol(e.to_string()))?;
        if h.len > MAX_OPTION_LEN {
            let mut out = Vec::new();
            proto::option_error(
                &mut out,
                h.option,
                rep::ERR_TOO_BIG,
                &format!(
                    "option data of {} bytes is over the limit of {MAX_OPTION_LEN}",
                    h.len
                ),
            );
            // Best effort: the connection closes either way.
            let _ = send(s, &out).await;
            return Err(HsError::Protocol(format!(
                "option {} with {} bytes of data",
                h.option, h.len
            )));
        }
        let mut data = vec![0u8; h.len as usize];
        s.read_exact(&mut data).await?;
        // Answered on a blocking thread: an option asks the devices for
        // their size and state, which waits while a volume is resized,
        // closed for a rollback, or its pool commits a txg, and the
        // network threads serve every other connection meanwhile.
        let (table, pol, mut state) = (table(), *policy, std::mem::take(st));
        let answered = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let ended = match handle(h.option, &data, &mut state, &pol, &table, &mut out) {
                Step::Next => None,
                Step::Go(export) => Some(Ok(Outcome::Go(session(export, &state, &pol)))),
                Step::StartTls => Some(Ok(Outcome::StartTls)),
                Step::Abort => Some(Ok(Outcome::Abort)),
                Step::Close(why) => Some(Err(HsError::Protocol(why))),
            };
            (state, out, ended)
        })
        .await
        .map_err(|e| HsError::Protocol(format!("an option's handler failed: {e}")))?;
        let (state, out, ended) = answered;
        *st = state;
        if !out.is_empty() {
            send(s, &out).await?;
        }
        if let Some(ended) = ended {
            return ended;
        }
    }
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, b: &[u8]) -> std::io::Result<()> {
    s.write_all(b).await?;
    s.flush().await
}

/// The export a client may enter by `name`: offered, and with a size. A
/// device closed while it was found (its volume closing for a rollback)
/// has none: turned away, not shown empty. Asks the device, so only on a
/// blocking thread.
fn entered(table: &Table, name: &str) -> Option<Arc<NbdExport>> {
    table.find(name).cloned().filter(|e| e.device.size() > 0)
}

/// Handles one option: writes its replies to `out`, updates `st`, and
/// says what comes next. No I/O, so every branch is unit-tested.
pub(crate) fn handle(
    option: u32,
    data: &[u8],
    st: &mut HsState,
    policy: &Policy,
    table: &Table,
    out: &mut Vec<u8>,
) -> Step {
    let err = |out: &mut Vec<u8>, kind, msg: &str| {
        proto::option_error(out, option, kind, msg);
        Step::Next
    };
    let invalid = |out: &mut Vec<u8>, e: OptionError| err(out, rep::ERR_INVALID, &e.to_string());
    let unknown = |out: &mut Vec<u8>, name: &str| {
        err(
            out,
            rep::ERR_UNKNOWN,
            &if name.is_empty() {
                "no default export".to_string()
            } else {
                format!("no export named {name:?}")
            },
        )
    };
    if policy.tls_required && !st.tls && option != opt::STARTTLS && option != opt::ABORT {
        if option == opt::EXPORT_NAME {
            // It cannot be answered with an error.
            return Step::Close("NBD_OPT_EXPORT_NAME before TLS on a server requiring TLS".into());
        }
        return err(
            out,
            rep::ERR_TLS_REQD,
            "this server requires TLS (NBD_OPT_STARTTLS)",
        );
    }
    match option {
        opt::EXPORT_NAME => {
            let found = option::decode_export_name(data)
                .ok()
                .and_then(|n| entered(table, &n));
            let Some(export) = found else {
                // Cannot be answered with an error either.
                return Step::Close(format!(
                    "NBD_OPT_EXPORT_NAME for unknown export {:?}",
                    String::from_utf8_lossy(data)
                ));
            };
            let flags = transmission_flags(export.is_read_only(), st.structured);
            out.extend_from_slice(&proto::export_name_reply(
                export.device.size(),
                flags,
                st.no_zeroes,
            ));
            Step::Go(export)
        }
        opt::ABORT => {
            // Any data is ignored, as the protocol asks.
            proto::option_reply(out, option, rep::ACK, &[]);
            Step::Abort
        }
        opt::LIST => {
            if !data.is_empty() {
                return err(out, rep::ERR_INVALID, "NBD_OPT_LIST takes no data");
            }
            for e in table.exports.iter().filter(|e| e.device.is_open()) {
                let mut d = Vec::with_capacity(4 + e.name.len());
                d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                d.extend_from_slice(e.name.as_bytes());
                if let Some(desc) = &e.description {
                    d.extend_from_slice(desc.as_bytes());
                }
                proto::option_reply(out, option, rep::SERVER, &d);
            }
            proto::option_reply(out, option, rep::ACK, &[]);
            Step::Next
        }
        opt::STARTTLS => {
            if !data.is_empty() {
                err(out, rep::ERR_INVALID, "NBD_OPT_STARTTLS takes no data")
            } else if st.tls {
                err(out, rep::ERR_INVALID, "TLS is already on")
            } else if !policy.tls_available {
                err(out, rep::ERR_POLICY, "TLS is not configured on this server")
            } else {
                proto::option_reply(out, option, rep::ACK, &[]);
                Step::StartTls
            }
        }
        opt::INFO | opt::GO => {
            let req = match option::decode_info(data) {
                Ok(r) => r,
                Err(e) => return invalid(out, e),
            };
            let Some(export) = entered(table, &req.name) else {
                return unknown(out, &req.name);
            };
            info_replies(out, option, &req.items, &export, st, policy);
            proto::option_reply(out, option, rep::ACK, &[]);
            if option == opt::GO {
                Step::Go(export)
            } else {
                Step::Next
            }
        }
        opt::STRUCTURED_REPLY => {
            if !data.is_empty() {
                return err(
                    out,
                    rep::ERR_INVALID,
                    "NBD_OPT_STRUCTURED_REPLY takes no data",
                );
            }
            st.structured = true;
            proto::option_reply(out, option, rep::ACK, &[]);
            Step::Next
        }
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            let set = option == opt::SET_META_CONTEXT;
            if set {
                // Replaced even when the option fails.
                st.meta = None;
                if !st.structured {
                    return err(
                        out,
                        rep::ERR_INVALID,
                        "NBD_OPT_SET_META_CONTEXT needs structured replies first",
                    );
                }
            }
            let req = match option::decode_meta(data) {
                Ok(r) => r,
                Err(e) => return invalid(out, e),
            };
            let Some(export) = table.find(&req.name) else {
                return unknown(out, &req.name);
            };
            let matched = if set {
                option::match_set(&req.queries)
            } else {
                option::match_list(&req.queries)
            };
            let m = match matched {
                Ok(m) => m,
                Err(e) => return invalid(out, e),
            };
            if m.base_allocation {
                // Listing gives id 0, as the protocol recommends.
                let id = if set { proto::BASE_ALLOCATION_ID } else { 0 };
                let mut d = id.to_be_bytes().to_vec();
                d.extend_from_slice(proto::BASE_ALLOCATION.as_bytes());
                proto::option_reply(out, option, rep::META_CONTEXT, &d);
                if set {
                    st.meta = Some(export.name.clone());
                }
            }
            proto::option_reply(out, option, rep::ACK, &[]);
            Step::Next
        }
        other => err(
            out,
            rep::ERR_UNSUP,
            &format!("option {other} is not supported by this server"),
        ),
    }
}

/// The `NBD_REP_INFO` replies of `INFO` / `GO`: always the export's size
/// and flags and its block sizes; its name and description when asked.
fn info_replies(
    out: &mut Vec<u8>,
    option: u32,
    items: &[u16],
    export: &NbdExport,
    st: &HsState,
    policy: &Policy,
) {
    let flags = transmission_flags(export.is_read_only(), st.structured);
    let mut d = info::EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&export.device.size().to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    proto::option_reply(out, option, rep::INFO, &d);
    if items.contains(&info::NAME) {
        let mut d = info::NAME.to_be_bytes().to_vec();
        d.extend_from_slice(export.name.as_bytes());
        proto::option_reply(out, option, rep::INFO, &d);
    }
    if let (true, Some(desc)) = (items.contains(&info::DESCRIPTION), &export.description) {
        let mut d = info::DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(desc.as_bytes());
        proto::option_reply(out, option, rep::INFO, &d);
    }
    let (min, pref, max) = block_sizes(export.device.block_size(), policy.max_payload);
    let mut d = info::BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [min, pref, max] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    proto::option_reply(out, option, rep::INFO, &d);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    /// Option replies split into `(option, type, data)`.
    fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            assert_eq!(&b[..8], &proto::OPTION_REPLY_MAGIC.to_be_bytes());
            let o = u32::from_be_bytes(b[8..12].try_into().unwrap());
            let t = u32::from_be_bytes(b[12..16].try_into().unwrap());
            let n = u32::from_be_bytes(b[16..20].try_into().unwrap()) as usize;
            v.push((o, t, b[20..20 + n].to_vec()));
            b = &b[20 + n..];
        }
        v
    }

    fn table() -> Table {
        let mut a = NbdExport::new("a", Arc::new(MemDevice::new(1 << 20, 4096)));
        a.description = Some("disk A".into());
        let mut b = NbdExport::new("b", Arc::new(MemDevice::new(1 << 16, 512)));
        b.read_only = true;
        Table::new(vec![a, b], Some("a".into())).unwrap()
    }

    fn policy() -> Policy {
        Policy {
            tls_available: false,
            tls_required: false,
            max_payload: 32 << 20,
        }
    }

    fn run(
        option: u32,
        data: &[u8],
        st: &mut HsState,
        p: &Policy,
    ) -> (Step, Vec<(u32, u32, Vec<u8>)>) {
        let mut out = Vec::new();
        let step = handle(option, data, st, p, &table(), &mut out);
        (step, replies(&out))
    }

    /// The option payloads of the decoder's tests, with names as text.
    fn info_payload(name: &str, items: &[u16]) -> Vec<u8> {
        crate::option::tests::info_payload(name.as_bytes(), items)
    }

    use crate::option::tests::meta_payload;

    #[test]
    fn list_names_every_export_with_its_description() {
        let (step, r) = run(opt::LIST, &[], &mut HsState::default(), &policy());
        assert!(matches!(step, Step::Next));
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].1, rep::SERVER);
        assert_eq!(&r[0].2[..4], &1u32.to_be_bytes());
        assert_eq!(&r[0].2[4..], b"adisk A");
        assert_eq!(&r[1].2[4..], b"b");
        assert_eq!(r[2].1, rep::ACK);
        let (_, r) = run(opt::LIST, &[0], &mut HsState::default(), &policy());
        assert_eq!(r[0].1, rep::ERR_INVALID);
    }

    #[test]
    fn go_sends_export_info_and_enters_transmission() {
        let mut st = HsState::default();
        let p = info_payload("", &[info::NAME, info::DESCRIPTION, info::BLOCK_SIZE]);
        let (step, r) = run(opt::GO, &p, &mut st, &policy());
        let Step::Go(e) = step else {
            panic!("expected GO, got {step:?}")
        };
        assert_eq!(e.name, "a", "the empty name is the default export");
        let types: Vec<u16> = r[..4]
            .iter()
            .map(|x| u16::from_be_bytes([x.2[0], x.2[1]]))
            .collect();
        assert_eq!(
            types,
            [
                info::EXPORT,
                info::NAME,
                info::DESCRIPTION,
                info::BLOCK_SIZE
            ]
        );
        let ex = &r[0].2;
        assert_eq!(u64::from_be_bytes(ex[2..10].try_into().unwrap()), 1 << 20);
        let flags = u16::from_be_bytes([ex[10], ex[11]]);
        assert_eq!(flags, transmission_flags(false, false));
        assert_eq!(flags & tx::SEND_DF, 0, "no DF without structured replies");
        assert_eq!(&r[1].2[2..], b"a");
        assert_eq!(&r[2].2[2..], b"disk A");
        let bs = &r[3].2;
        let v = |i: usize| u32::from_be_bytes(bs[i..i + 4].try_into().unwrap());
        assert_eq!((v(2), v(6), v(10)), (1, 4096, 32 << 20));
        assert_eq!(r[4].1, rep::ACK);
        assert_eq!(r.len(), 5);
    }

    #[test]
    fn info_on_read_only_and_unknown_exports() {
        let mut st = HsState::default();
        let (step, r) = run(opt::INFO, &info_payload("b", &[]), &mut st, &policy());
        assert!(matches!(step, Step::Next));
        let flags = u16::from_be_bytes([r[0].2[10], r[0].2[11]]);
        assert_ne!(flags & tx::READ_ONLY, 0);
        assert_eq!(
            flags & (tx::SEND_TRIM | tx::SEND_WRITE_ZEROES | tx::SEND_FLUSH),
            0
        );
        // Preferred block size at least 512 even for a smaller device block.
        let bs = &r[1].2;
        assert_eq!(u32::from_be_bytes(bs[6..10].try_into().unwrap()), 512);
        let (step, r) = run(opt::GO, &info_payload("zz", &[]), &mut st, &policy());
        assert!(matches!(step, Step::Next));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, rep::ERR_UNKNOWN);
        let (_, r) = run(opt::GO, &[0, 0, 0, 9, b'a'], &mut st, &policy());
        assert_eq!(r[0].1, rep::ERR_INVALID);
    }

    #[test]
    fn export_name_replies_or_closes() {
        let mut st = HsState {
            no_zeroes: true,
            structured: true,
            ..HsState::default()
        };
        let mut out = Vec::new();
        let step = handle(
            opt::EXPORT_NAME,
            b"a",
            &mut st,
            &policy(),
            &table(),
            &mut out,
        );
        assert!(matches!(step, Step::Go(_)));
        assert_eq!(out.len(), 10);
        assert_eq!(
            u16::from_be_bytes([out[8], out[9]]),
            transmission_flags(false, true)
        );
        let mut st = HsState::default();
        let mut out = Vec::new();
        handle(
            opt::EXPORT_NAME,
            b"a",
            &mut st,
            &policy(),
            &table(),
            &mut out,
        );
        assert_eq!(out.len(), 134);
        let mut out = Vec::new();
        let step = handle(
            opt::EXPORT_NAME,
            b"nope",
            &mut st,
            &policy(),
            &table(),
            &mut out,
        );
        assert!(matches!(step, Step::Close(_)));
        assert!(out.is_empty());
    }

    #[test]
    fn unknown_options_and_abort() {
        let mut st = HsState::default();
        let (step, r) = run(11, &[1, 2, 3], &mut st, &policy());
        assert!(matches!(step, Step::Next));
        assert_eq!(r[0].1, rep::ERR_UNSUP);
        let (step, r) = run(opt::ABORT, &[1], &mut st, &policy());
        assert!(matches!(step, Step::Abort));
        assert_eq!(r[0].1, rep::ACK);
    }

    #[test]
    fn meta_contexts() {
        let mut st = HsState::default();
        // SET before structured replies is refused.
        let (_, r) = run(
            opt::SET_META_CONTEXT,
            &meta_payload("a", &["base:allocation"]),
            &mut st,
            &policy(),
        );
        assert_eq!(r[0].1, rep::ERR_INVALID);
        // LIST works and lists base:allocation with id 0.
        let (_, r) = run(
            opt::LIST_META_CONTEXT,
            &meta_payload("a", &[]),
            &mut st,
            &policy(),
        );
        assert_eq!(r[0].1, rep::META_CONTEXT);
        assert_eq!(&r[0].2[..4], &[0; 4]);
        assert_eq!(&r[0].2[4..], b"base:allocation");
        assert_eq!(r[1].1, rep::ACK);
        let (_, r) = run(opt::STRUCTURED_REPLY, &[], &mut st, &policy());
        assert_eq!(r[0].1, rep::ACK);
        assert!(st.structured);
        // SET on the default export, by its empty name.
        let (_, r) = run(
            opt::SET_META_CONTEXT,
            &meta_payload("", &["base:allocation", "qemu:x"]),
            &mut st,
            &policy(),
        );
        assert_eq!(r[0].1, rep::META_CONTEXT);
        assert_eq!(&r[0].2[..4], &proto::BASE_ALLOCATION_ID.to_be_bytes());
        assert_eq!(st.meta.as_deref(), Some("a"));
        // GO to the same export enables block status, to another not.
        let (Step::Go(e), _) = run(opt::GO, &info_payload("a", &[]), &mut st, &policy()) else {
            panic!()
        };
        assert!(session(e, &st, &policy()).view.block_status);
        let (Step::Go(e), _) = run(opt::GO, &info_payload("b", &[]), &mut st, &policy()) else {
            panic!()
        };
        assert!(!session(e, &st, &policy()).view.block_status);
        // A failing SET clears the selection.
        let (_, r) = run(
            opt::SET_META_CONTEXT,
            &meta_payload("a", &["nocolon"]),
            &mut st,
            &policy(),
        );
        assert_eq!(r[0].1, rep::ERR_INVALID);
        assert_eq!(st.meta, None);
        // Unknown export.
        let (_, r) = run(
            opt::LIST_META_CONTEXT,
            &meta_payload("zz", &[]),
            &mut st,
            &policy(),
        );
        assert_eq!(r[0].1, rep::ERR_UNKNOWN);
        // A SET selecting nothing is just an ACK.
        let (_, r) = run(
            opt::SET_META_CONTEXT,
            &meta_payload("a", &["base:"]),
            &mut st,
            &policy(),
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, rep::ACK);
    }

    #[test]
    fn tls_policies() {
        let mut st = HsState::default();
        let (_, r) = run(opt::STARTTLS, &[], &mut st, &policy());
        assert_eq!(r[0].1, rep::ERR_POLICY, "no TLS configured");
        let forced = Policy {
            tls_available: true,
            tls_required: true,
            ..policy()
        };
        for o in [opt::LIST, opt::INFO, opt::GO, opt::STRUCTURED_REPLY, 42] {
            let (step, r) = run(o, &[], &mut st, &forced);
            assert!(matches!(step, Step::Next));
            assert_eq!(r[0].1, rep::ERR_TLS_REQD, "option {o}");
        }
        let (step, _) = run(opt::EXPORT_NAME, b"a", &mut st, &forced);
        assert!(matches!(step, Step::Close(_)));
        let (_, r) = run(opt::STARTTLS, &[1], &mut st, &forced);
        assert_eq!(r[0].1, rep::ERR_INVALID);
        let (step, r) = run(opt::STARTTLS, &[], &mut st, &forced);
        assert!(matches!(step, Step::StartTls));
        assert_eq!(r[0].1, rep::ACK);
        st.tls = true;
        let (_, r) = run(opt::STARTTLS, &[], &mut st, &forced);
        assert_eq!(r[0].1, rep::ERR_INVALID, "TLS twice");
        let (_, r) = run(opt::LIST, &[], &mut st, &forced);
        assert_eq!(r.last().unwrap().1, rep::ACK);
    }

    proptest::proptest! {
        /// Whatever option and payload a client sends, in whatever state,
        /// the handler answers with well-formed replies to that option,
        /// the last of them final, unless it enters transmission through
        /// `EXPORT_NAME` or hangs up.
        #[test]
        fn arbitrary_options_get_well_formed_final_replies(
            option in proptest::prop_oneof![1u32..=12, proptest::prelude::any::<u32>()],
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            structured in proptest::prelude::any::<bool>(),
            tls in proptest::prelude::any::<bool>(),
            required in proptest::prelude::any::<bool>(),
        ) {
            let mut st = HsState { structured, tls, ..HsState::default() };
            let p = Policy { tls_available: true, tls_required: required, ..policy() };
            let mut out = Vec::new();
            let step = handle(option, &data, &mut st, &p, &table(), &mut out);
            if option == opt::EXPORT_NAME {
                let ok = matches!(step, Step::Go(_)) && (out.len() == 10 || out.len() == 134);
                proptest::prop_assert!(ok || (matches!(step, Step::Close(_)) && out.is_empty()));
                return Ok(());
            }
            let r = replies(&out);
            proptest::prop_assert!(!r.is_empty());
            proptest::prop_assert!(r.iter().all(|x| x.0 == option));
            let last = r.last().unwrap().1;
            proptest::prop_assert!(last == rep::ACK || last & (1 << 31) != 0);
            proptest::prop_assert!(r[..r.len() - 1].iter().all(|x| x.1 & (1 << 31) == 0 && x.1 != rep::ACK));
            if st.meta.is_some() {
                proptest::prop_assert!(st.structured);
            }
        }
    }

    #[test]
    fn block_size_rules() {
        assert_eq!(block_sizes(4096, 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(block_sizes(1, 32 << 20), (1, 512, 32 << 20));
        assert_eq!(block_sizes(3000, 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(block_sizes(1 << 20, 64 << 10), (1, 64 << 10, 64 << 10));
        assert_eq!(block_sizes(u32::MAX, u32::MAX), (1, 1 << 31, u32::MAX));
    }
}

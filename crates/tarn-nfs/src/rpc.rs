//! ONC RPC v2 messages (RFC 5531): call headers with their credentials,
//! and the accepted / denied reply headers.

use crate::xdr::{Reader, Writer, XdrError, XdrResult};

/// `msg_type` CALL.
const CALL: u32 = 0;
/// `msg_type` REPLY.
const REPLY: u32 = 1;
/// Largest credential or verifier body (RFC 5531: 400 bytes).
const MAX_AUTH: usize = 400;

/// Authentication flavor AUTH_NONE.
pub const AUTH_NONE: u32 = 0;
/// Authentication flavor AUTH_SYS (AUTH_UNIX).
pub const AUTH_SYS: u32 = 1;

/// `accept_stat` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptStat {
    /// The call ran; results follow.
    Success,
    /// The program is not served here.
    ProgUnavail,
    /// The program is served, in versions `low..=high`.
    ProgMismatch(u32, u32),
    /// The procedure does not exist.
    ProcUnavail,
    /// The arguments could not be decoded.
    GarbageArgs,
    /// A server-side failure.
    SystemErr,
}

/// `auth_stat` values used in AUTH_ERROR replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStat {
    /// Malformed credentials.
    BadCred = 1,
    /// Credentials refused; the client should get new ones.
    RejectedCred = 2,
    /// The flavor is not accepted for this call.
    TooWeak = 5,
}

/// The AUTH_SYS credential body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSys {
    /// Client's idea of the time (ignored).
    pub stamp: u32,
    /// Client host name (for MOUNT's DUMP list only; never trusted).
    pub machine: Vec<u8>,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Supplementary groups (at most 16).
    pub gids: Vec<u32>,
}

/// The credential of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS.
    Sys(AuthSys),
    /// Any other flavor (refused by the services here).
    Other(u32),
}

/// A decoded call header; the arguments follow at `args_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Transaction id, echoed in the reply.
    pub xid: u32,
    /// RPC version (must be 2).
    pub rpcvers: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// The credential.
    pub auth: Auth,
    /// Offset of the procedure arguments in the record.
    pub args_offset: usize,
}

/// Why a record is not a usable call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Not even a transaction id and message type: drop it silently.
    Unreadable,
    /// A REPLY message (we are no client): drop it.
    NotCall,
    /// A call whose header (credentials) cannot be decoded: AUTH_ERROR
    /// BADCRED with this xid.
    BadCred(u32),
    /// rpcvers != 2: RPC_MISMATCH with this xid.
    RpcMismatch(u32),
}

fn parse_auth_sys(body: &[u8]) -> XdrResult<AuthSys> {
    let mut r = Reader::new(body);
    let stamp = r.u32()?;
    let machine = r.string(255)?.to_vec();
    let uid = r.u32()?;
    let gid = r.u32()?;
    let n = r.u32()? as usize;
    if n > 16 {
        return Err(XdrError::Invalid);
    }
    let mut gids = Vec::with_capacity(n);
    for _ in 0..n {
        gids.push(r.u32()?);
    }
    Ok(AuthSys {
        stamp,
        machine,
        uid,
        gid,
        gids,
    })
}

/// Decodes the call header of `record`.
pub fn parse_call(record: &[u8]) -> Result<Call, HeaderError> {
    let mut r = Reader::new(record);
    let xid = r.u32().map_err(|_| HeaderError::Unreadable)?;
    let mtype = r.u32().map_err(|_| HeaderError::Unreadable)?;
    if mtype != CALL {
        return Err(HeaderError::NotCall);
    }
    let bad = |_| HeaderError::BadCred(xid);
    let rpcvers = r.u32().map_err(bad)?;
    if rpcvers != 2 {
        return Err(HeaderError::RpcMismatch(xid));
    }
    let prog = r.u32().map_err(bad)?;
    let vers = r.u32().map_err(bad)?;
    let proc_ = r.u32().map_err(bad)?;
    let flavor = r.u32().map_err(bad)?;
    let body = r.opaque(MAX_AUTH).map_err(bad)?;
    let auth = match flavor {
        AUTH_NONE => Auth::None,
        AUTH_SYS => Auth::Sys(parse_auth_sys(body).map_err(bad)?),
        f => Auth::Other(f),
    };
    // Verifier: flavor and body, ignored.
    r.u32().map_err(bad)?;
    r.opaque(MAX_AUTH).map_err(bad)?;
    Ok(Call {
        xid,
        rpcvers,
        prog,
        vers,
        proc_,
        auth,
        args_offset: record.len() - r.remaining(),
    })
}

/// Starts an accepted reply: header, null verifier and `stat` (with its
/// mismatch info). For `Success`, the caller appends the results.
pub fn accepted(xid: u32, stat: AcceptStat) -> Writer {
    let mut w = Writer::with_capacity(128);
    w.u32(xid).u32(REPLY).u32(0).u32(AUTH_NONE).u32(0);
    match stat {
        AcceptStat::Success => w.u32(0),
        AcceptStat::ProgUnavail => w.u32(1),
        AcceptStat::ProgMismatch(lo, hi) => w.u32(2).u32(lo).u32(hi),
        AcceptStat::ProcUnavail => w.u32(3),
        AcceptStat::GarbageArgs => w.u32(4),
        AcceptStat::SystemErr => w.u32(5),
    };
    w
}

/// A denied reply: AUTH_ERROR with `stat`.
pub fn auth_error(xid: u32, stat: AuthStat) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(REPLY).u32(1).u32(1).u32(stat as u32);
    w.into_bytes()
}

/// A denied reply: RPC_MISMATCH (we speak version 2 only).
pub fn rpc_mismatch(xid: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(xid).u32(REPLY).u32(1).u32(0).u32(2).u32(2);
    w.into_bytes()
}

/// Encodes a call header with AUTH_SYS or AUTH_NONE credentials (for
/// tests and tools that act as a client).
pub fn encode_call(xid: u32, prog: u32, vers: u32, proc_: u32, auth: &Auth) -> Writer {
    let mut w = Writer::with_capacity(128);
    w.u32(xid).u32(CALL).u32(2).u32(prog).u32(vers).u32(proc_);
    match auth {
        Auth::Sys(a) => {
            let mut b = Writer::new();
            b.u32(a.stamp).opaque(&a.machine).u32(a.uid).u32(a.gid);
            b.u32(a.gids.len() as u32);
            for g in &a.gids {
                b.u32(*g);
            }
            w.u32(AUTH_SYS).opaque(&b.into_bytes());
        }
        Auth::None => {
            w.u32(AUTH_NONE).u32(0);
        }
        Auth::Other(f) => {
            w.u32(*f).u32(0);
        }
    }
    w.u32(AUTH_NONE).u32(0);
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn call_round_trip() {
        let auth = Auth::Sys(AuthSys {
            stamp: 7,
            machine: b"host".to_vec(),
            uid: 1000,
            gid: 100,
            gids: vec![4, 5],
        });
        let mut w = encode_call(42, 100003, 3, 1, &auth);
        w.u32(0xdead);
        let bytes = w.into_bytes();
        let c = parse_call(&bytes).unwrap();
        assert_eq!((c.xid, c.prog, c.vers, c.proc_), (42, 100003, 3, 1));
        assert_eq!(c.auth, auth);
        assert_eq!(Reader::new(&bytes[c.args_offset..]).u32(), Ok(0xdead));
    }

    #[test]
    fn bad_headers() {
        assert_eq!(parse_call(&[1, 2]), Err(HeaderError::Unreadable));
        assert_eq!(
            parse_call(&[0, 0, 0, 1, 0, 0, 0, 1]),
            Err(HeaderError::NotCall)
        );
        assert_eq!(
            parse_call(&[0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3]),
            Err(HeaderError::RpcMismatch(9))
        );
        assert_eq!(
            parse_call(&[0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2, 0]),
            Err(HeaderError::BadCred(9))
        );
    }

    proptest! {
        #[test]
        fn random_headers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = parse_call(&bytes);
        }
    }
}

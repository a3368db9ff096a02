//! The login phase (RFC 7143 sections 6 and 13): a pure state machine
//! fed one Login Request at a time, answering each with a Login
//! Response, until the session enters the full feature phase or fails.
//!
//! # Stages
//!
//! A login goes through at most two stages before the full feature
//! phase: security negotiation (CSG 0), where `AuthMethod` is chosen and
//! CHAP runs, and operational negotiation (CSG 1), where the session's
//! parameters are agreed. The initiator asks to move on with the T bit
//! and names the next stage (NSG); the target agrees by echoing T and
//! NSG, or holds the initiator in the stage by answering T = 0 (while
//! CHAP is not finished). An initiator may skip the security stage only
//! when the target does not require CHAP.
//!
//! The first request names the initiator (`InitiatorName`, required),
//! the session type (`SessionType`, Normal unless Discovery) and, for a
//! normal session, the target (`TargetName`). A target the client's
//! address may not see is "not found", exactly as a target that does not
//! exist, so names cannot be probed; an initiator name the target does
//! not list is an authorization failure. Failures answer with a status
//! class and detail and end the connection.
//!
//! # CHAP
//!
//! Only MD5 (`CHAP_A=5`). The target sends a random one-byte identifier
//! and a 16-byte random challenge; the initiator's `CHAP_R` must be
//! MD5(identifier, secret, challenge). If the initiator also sends
//! `CHAP_I` and `CHAP_C` (mutual CHAP), the target answers with its own
//! name and response, computed with [`crate::IscsiTarget::mutual_chap`];
//! a challenge equal to the target's own is refused (a reflection
//! attack). Values are hexadecimal (`0x…`); base64 (`0b…`) is not
//! accepted.
//!
//! # Negotiation
//!
//! Keys are answered as RFC 7143 section 13 types them: lists
//! (`HeaderDigest`, `DataDigest`, `AuthMethod`) take the initiator's
//! first choice the target supports; numbers take the minimum (or the
//! maximum for `DefaultTime2Wait`) of the two offers; booleans the AND or
//! OR. Declarations (`MaxRecvDataSegmentLength`, names, aliases) are
//! recorded. The target always declares its own
//! `MaxRecvDataSegmentLength` and sends `TargetPortalGroupTag=1` in its
//! first answer to a normal session. Unknown keys are `NotUnderstood`;
//! values out of range `Reject`. The target only supports
//! `ErrorRecoveryLevel=0`, `MaxConnections=1`, in-order data, and no
//! markers, which the min/AND rules yield whatever the initiator offers.

use std::sync::Arc;

use crate::digest::md5;
use crate::pdu::{op, Pdu};
use crate::target::{Chap, IscsiTarget};
use crate::text::{self, MAX_TEXT};

/// Login status classes and details (RFC 7143 section 11.13.5).
pub mod status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error, unspecified.
    pub const INITIATOR_ERROR: u16 = 0x0200;
    /// Authentication failed.
    pub const AUTH_FAILED: u16 = 0x0201;
    /// The initiator may not use the target.
    pub const FORBIDDEN: u16 = 0x0202;
    /// No such target.
    pub const NOT_FOUND: u16 = 0x0203;
    /// No common version.
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    /// A required key is missing.
    pub const MISSING_PARAMETER: u16 = 0x0207;
    /// Adding a connection to a session is not supported.
    pub const CANT_INCLUDE: u16 = 0x0208;
    /// The session type is not supported.
    pub const SESSION_TYPE: u16 = 0x0209;
    /// The request is invalid during login.
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    /// The target is temporarily unable to serve (its volume closed for a
    /// moment): the initiator may try again later.
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
}

/// Stage numbers (CSG and NSG).
const SECURITY: u8 = 0;
const OPERATIONAL: u8 = 1;
const FULL_FEATURE: u8 = 3;

/// Flags of byte 1 of login PDUs.
const T_BIT: u8 = 0x80;
const C_BIT: u8 = 0x40;

/// What the target offers in negotiation (its side of each min/max).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offer {
    /// The target's `MaxRecvDataSegmentLength`.
    pub(crate) max_recv_data_segment: u32,
    /// The target's `MaxBurstLength`.
    pub(crate) max_burst: u32,
    /// The target's `FirstBurstLength`.
    pub(crate) first_burst: u32,
    /// `CmdSN` window advertised (MaxCmdSN - ExpCmdSN + 1).
    pub(crate) window: u32,
}

/// The operational parameters of a session, as negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// CRC32C header digests.
    pub header_digest: bool,
    /// CRC32C data digests.
    pub data_digest: bool,
    /// Largest data segment the target may send (the initiator's
    /// declaration).
    pub initiator_mrdsl: u32,
    /// Largest data segment the initiator may send (the target's).
    pub target_mrdsl: u32,
    /// Largest solicited burst of Data-Out (and of one Data-In sequence).
    pub max_burst: u32,
    /// Largest unsolicited data (immediate and Data-Out) per command.
    pub first_burst: u32,
    /// Immediate data in the SCSI Command PDU allowed.
    pub immediate_data: bool,
    /// Writes must wait for an R2T (no unsolicited Data-Out).
    pub initial_r2t: bool,
}

impl Params {
    fn defaults(target_mrdsl: u32) -> Params {
        Params {
            header_digest: false,
            data_digest: false,
            initiator_mrdsl: 8192,
            target_mrdsl,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data: true,
            initial_r2t: true,
        }
    }
}

/// The kind of session a login made.
#[derive(Clone, Debug)]
pub enum SessionKind {
    /// A discovery session: only `SendTargets`, NOP and logout.
    Discovery,
    /// A normal session with one target.
    Normal(Arc<IscsiTarget>),
}

/// A session that reached the full feature phase.
#[derive(Clone, Debug)]
pub struct Session {
    /// Discovery or normal.
    pub kind: SessionKind,
    /// The initiator's name.
    pub initiator: String,
    /// The initiator's session identifier (with the name, it names the
    /// initiator port).
    pub isid: [u8; 6],
    /// Negotiated parameters.
    pub params: Params,
    /// The next StatSN to send.
    pub stat_sn: u32,
    /// The CmdSN the target expects next.
    pub exp_cmd_sn: u32,
}

/// What to do after a request.
#[derive(Debug)]
pub(crate) enum Step {
    /// Send the response and read the next request.
    Continue(Pdu),
    /// Send the response and close the connection (a failed login).
    Fail(Pdu, String),
    /// Send the response; the session is in the full feature phase.
    Done(Pdu, Box<Session>),
}

enum ChapState {
    /// `AuthMethod=CHAP` agreed; waiting for `CHAP_A`.
    Start,
    /// Challenge sent.
    Challenged { id: u8, challenge: [u8; 16] },
}

/// One connection's login.
pub(crate) struct Login {
    offer: Offer,
    /// Targets the client may see.
    visible: Vec<Arc<IscsiTarget>>,
    /// Credentials a discovery session must present, if any.
    discovery_chap: Option<Chap>,
    /// Set by the first request.
    started: bool,
    isid: [u8; 6],
    tsih: u16,
    itt: u32,
    initiator: Option<String>,
    kind: Option<SessionKind>,
    /// The CHAP credentials the initiator must present.
    required: Option<Chap>,
    mutual: Option<Chap>,
    chap: Option<ChapState>,
    authenticated: bool,
    stage: u8,
    params: Params,
    stat_sn: u32,
    sent_portal_tag: bool,
    declared_mrdsl: bool,
    /// Text of requests with the continue bit, awaiting the last part.
    pending: Vec<u8>,
}

/// Random bytes for CHAP challenges: the kernel's, or (should
/// `/dev/urandom` be unreadable) a hash of a randomly keyed hasher, the
/// time and a counter.
pub(crate) fn random_bytes(buf: &mut [u8]) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(buf).is_ok() {
            return;
        }
    }
    use std::hash::{BuildHasher, Hasher};
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for chunk in buf.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        let v = h.finish().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Constant-time comparison (the CHAP response is a secret's digest).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn yes_no(v: bool) -> String {
    if v { "Yes" } else { "No" }.to_string()
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn parse_num(v: &str, lo: u32, hi: u32) -> Option<u32> {
    let n: u32 = v.parse().ok()?;
    (lo..=hi).contains(&n).then_some(n)
}

impl Login {
    pub(crate) fn new(
        offer: Offer,
        visible: Vec<Arc<IscsiTarget>>,
        discovery_chap: Option<Chap>,
        tsih: u16,
    ) -> Login {
        Login {
            offer,
            visible,
            discovery_chap,
            started: false,
            isid: [0; 6],
            tsih,
            itt: 0,
            initiator: None,
            kind: None,
            required: None,
            mutual: None,
            chap: None,
            authenticated: false,
            stage: SECURITY,
            params: Params::defaults(offer.max_recv_data_segment),
            stat_sn: 1,
            sent_portal_tag: false,
            declared_mrdsl: false,
            pending: Vec::new(),
        }
    }

    /// A Login Response to `req` with `flags`, `status` and `data`.
    fn response(&mut self, req: &Pdu, flags: u8, status: u16, data: Vec<u8>) -> Pdu {
        let mut p = Pdu::new(op::LOGIN_RSP);
        p.set_flags(flags);
        p.bhs[2] = 0; // Version-max
        p.bhs[3] = 0; // Version-active
        p.bhs[8..14].copy_from_slice(&req.bhs[8..14]);
        let tsih = if flags & T_BIT != 0 && flags & 0x03 == FULL_FEATURE {
            self.tsih
        } else {
            0
        };
        p.set_u16(14, tsih);
        p.set_itt(req.itt());
        p.set_u32(24, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let cmd_sn = req.u32_at(24);
        p.set_u32(28, cmd_sn);
        p.set_u32(32, cmd_sn.wrapping_add(self.offer.window.saturating_sub(1)));
        p.set_u16(36, status);
        p.data = data;
        p
    }

    fn fail(&mut self, req: &Pdu, status: u16, why: impl Into<String>) -> Step {
        let csg = (req.flags() >> 2) & 3;
        let p = self.response(req, csg << 2, status, Vec::new());
        Step::Fail(p, why.into())
    }

    /// Handles one request of the login phase.
    pub(crate) fn step(&mut self, req: &Pdu) -> Step {
        if req.opcode() != op::LOGIN {
            return self.fail(
                req,
                status::INVALID_DURING_LOGIN,
                format!("opcode {:#04x} during login", req.opcode()),
            );
        }
        let flags = req.flags();
        let transit = flags & T_BIT != 0;
        let cont = flags & C_BIT != 0;
        let csg = (flags >> 2) & 3;
        let nsg = flags & 3;
        if transit && cont {
            return self.fail(req, status::INITIATOR_ERROR, "T and C both set");
        }
        if !self.started {
            if req.bhs[3] > 0 {
                return self.fail(req, status::UNSUPPORTED_VERSION, "version-min above 0");
            }
            if req.u16_at(14) != 0 {
                return self.fail(
                    req,
                    status::CANT_INCLUDE,
                    "a connection for an existing session (MaxConnections=1)",
                );
            }
            self.isid.copy_from_slice(&req.bhs[8..14]);
            self.itt = req.itt();
            self.started = true;
        } else if req.bhs[8..14] != self.isid || req.itt() != self.itt {
            return self.fail(req, status::INITIATOR_ERROR, "ISID or ITT changed");
        }
        if csg != self.stage || csg == 2 || csg == FULL_FEATURE {
            // A jump to the operational stage is allowed while no CHAP
            // exchange is under way; the rule "CHAP required" is checked
            // below.
            if !(csg == OPERATIONAL && self.stage == SECURITY && self.chap.is_none()) {
                return self.fail(
                    req,
                    status::INITIATOR_ERROR,
                    format!("CSG {csg} out of order"),
                );
            }
        }
        if transit && (nsg <= csg || nsg == 2) {
            return self.fail(
                req,
                status::INITIATOR_ERROR,
                format!("NSG {nsg} after CSG {csg}"),
            );
        }
        if self.pending.len() + req.data.len() > MAX_TEXT {
            return self.fail(req, status::INITIATOR_ERROR, "login text too long");
        }
        self.pending.extend_from_slice(&req.data);
        if cont {
            // More text follows: acknowledge with an empty response.
            let f = csg << 2;
            return Step::Continue(self.response(req, f, status::SUCCESS, Vec::new()));
        }
        let data = std::mem::take(&mut self.pending);
        let pairs = match text::parse(&data) {
            Ok(p) => p,
            Err(e) => return self.fail(req, status::INITIATOR_ERROR, e.to_string()),
        };
        let mut out: Vec<(String, String)> = Vec::new();
        if self.kind.is_none() {
            if let Err(s) = self.identify(&pairs, &mut out) {
                return self.fail(req, s.0, s.1);
            }
        }
        if csg == OPERATIONAL && self.stage == SECURITY {
            if self.required.is_some() {
                return self.fail(req, status::AUTH_FAILED, "CHAP is required");
            }
            self.authenticated = true;
            self.stage = OPERATIONAL;
        }
        let mut chap_keys: Vec<(String, String)> = Vec::new();
        for (k, v) in &pairs {
            match k.as_str() {
                "InitiatorName" | "TargetName" | "SessionType" | "InitiatorAlias" => {}
                "AuthMethod" => {
                    if csg != SECURITY {
                        out.push((k.clone(), "Reject".into()));
                        continue;
                    }
                    let offered: Vec<&str> = v.split(',').collect();
                    let pick = if self.required.is_some() {
                        offered.contains(&"CHAP").then_some("CHAP")
                    } else {
                        offered.contains(&"None").then_some("None")
                    };
                    match pick {
                        Some("CHAP") => {
                            self.chap = Some(ChapState::Start);
                            out.push((k.clone(), "CHAP".into()));
                        }
                        Some(_) => {
                            self.authenticated = true;
                            out.push((k.clone(), "None".into()));
                        }
                        None => {
                            return self.fail(
                                req,
                                status::AUTH_FAILED,
                                format!("no acceptable AuthMethod in {v:?}"),
                            )
                        }
                    }
                }
                k2 if k2.starts_with("CHAP_") => chap_keys.push((k.clone(), v.clone())),
                _ => {
                    if let Some(a) = self.negotiate(k, v) {
                        out.push((k.clone(), a));
                    }
                }
            }
        }
        if !chap_keys.is_empty() {
            if csg != SECURITY {
                return self.fail(req, status::INITIATOR_ERROR, "CHAP keys outside security");
            }
            match self.chap_step(&chap_keys, &mut out) {
                Ok(()) => {}
                Err(why) => return self.fail(req, status::AUTH_FAILED, why),
            }
        }
        if csg == SECURITY && self.required.is_none() && self.chap.is_none() {
            // No CHAP: being in the security stage with AuthMethod=None
            // (or none sent) is enough.
            self.authenticated = true;
        }
        if csg == OPERATIONAL && !self.declared_mrdsl {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".into(),
                self.offer.max_recv_data_segment.to_string(),
            ));
        }
        let may_transit = transit && self.authenticated;
        let mut rflags = csg << 2;
        if may_transit {
            rflags |= T_BIT | nsg;
        }
        if may_transit && nsg == FULL_FEATURE && !self.declared_mrdsl {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".into(),
                self.offer.max_recv_data_segment.to_string(),
            ));
        }
        let rsp = self.response(req, rflags, status::SUCCESS, text::encode(&out));
        if may_transit {
            self.stage = nsg;
            if nsg == FULL_FEATURE {
                let mut params = self.params;
                params.first_burst = params.first_burst.min(params.max_burst);
                let Some(kind) = self.kind.clone() else {
                    return self.fail(req, status::MISSING_PARAMETER, "no session type");
                };
                let session = Session {
                    kind,
                    initiator: self.initiator.clone().unwrap_or_default(),
                    isid: self.isid,
                    params,
                    stat_sn: self.stat_sn,
                    exp_cmd_sn: req.u32_at(24),
                };
                return Step::Done(rsp, Box::new(session));
            }
        }
        Step::Continue(rsp)
    }

    /// Reads the names from the first request's keys and picks the
    /// target; Err((status, why)) on failure.
    fn identify(
        &mut self,
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), (u16, String)> {
        let get = |k: &str| pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let Some(init) = get("InitiatorName") else {
            return Err((status::MISSING_PARAMETER, "no InitiatorName".into()));
        };
        if init.is_empty() || init.len() > 223 {
            return Err((status::INITIATOR_ERROR, "bad InitiatorName".into()));
        }
        self.initiator = Some(init.to_string());
        match get("SessionType").unwrap_or("Normal") {
            "Discovery" => {
                self.required = self.discovery_chap.clone();
                self.kind = Some(SessionKind::Discovery);
            }
            "Normal" => {
                let Some(name) = get("TargetName") else {
                    return Err((status::MISSING_PARAMETER, "no TargetName".into()));
                };
                let Some(t) = self
                    .visible
                    .iter()
                    .find(|t| t.name.eq_ignore_ascii_case(name))
                    .cloned()
                else {
                    return Err((status::NOT_FOUND, format!("no target {name:?}")));
                };
                if !t.admits(init) {
                    return Err((
                        status::FORBIDDEN,
                        format!("initiator {init:?} may not use {name:?}"),
                    ));
                }
                // Its volume closed for a rollback, destroy or key unload:
                // Service Unavailable (the initiator may retry) rather than
                // a login to an empty disk. Told only to admitted initiators.
                if !t.device.is_open() {
                    return Err((
                        status::SERVICE_UNAVAILABLE,
                        format!("target {name:?} is being changed; try again"),
                    ));
                }
                self.required = t.chap.clone();
                self.mutual = t.mutual_chap.clone();
                out.push(("TargetPortalGroupTag".into(), "1".into()));
                self.sent_portal_tag = true;
                if let Some(a) = &t.alias {
                    out.push(("TargetAlias".into(), a.clone()));
                }
                self.kind = Some(SessionKind::Normal(t));
            }
            other => return Err((status::SESSION_TYPE, format!("session type {other:?}"))),
        }
        Ok(())
    }

    /// One round of CHAP.
    fn chap_step(
        &mut self,
        keys: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), String> {
        let get = |k: &str| keys.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let Some(required) = self.required.clone() else {
            return Err("CHAP keys, but CHAP was not agreed".into());
        };
        match self.chap.take() {
            Some(ChapState::Start) => {
                let Some(algs) = get("CHAP_A") else {
                    return Err("CHAP without CHAP_A".into());
                };
                if !algs.split(',').any(|a| a == "5") {
                    return Err(format!("CHAP_A={algs}: only MD5 (5) is supported"));
                }
                let mut r = [0u8; 17];
                random_bytes(&mut r);
                let id = r[0];
                let mut challenge = [0u8; 16];
                challenge.copy_from_slice(&r[1..]);
                out.push(("CHAP_A".into(), "5".into()));
                out.push(("CHAP_I".into(), id.to_string()));
                out.push(("CHAP_C".into(), text::hex(&challenge)));
                self.chap = Some(ChapState::Challenged { id, challenge });
                Ok(())
            }
            Some(ChapState::Challenged { id, challenge }) => {
                let (Some(n), Some(r)) = (get("CHAP_N"), get("CHAP_R")) else {
                    return Err("CHAP answer without CHAP_N and CHAP_R".into());
                };
                let Some(r) = text::parse_hex(r) else {
                    return Err("CHAP_R is not hexadecimal".into());
                };
                let want = md5(&[&[id], required.secret.as_bytes(), &challenge]);
                if n != required.user || !same(&r, &want) {
                    return Err(format!("CHAP failed for user {n:?}"));
                }
                match (get("CHAP_I"), get("CHAP_C")) {
                    (None, None) => {}
                    (Some(i), Some(c)) => {
                        let Some(mutual) = self.mutual.clone() else {
                            return Err(
                                "mutual CHAP asked, but the target has no credentials".into()
                            );
                        };
                        let Some(id) = i.parse::<u8>().ok() else {
                            return Err("bad CHAP_I".into());
                        };
                        let Some(c) = text::parse_hex(c) else {
                            return Err("CHAP_C is not hexadecimal".into());
                        };
                        if c.len() > 1024 || same(&c, &challenge) {
                            return Err("unacceptable mutual CHAP challenge".into());
                        }
                        let resp = md5(&[&[id], mutual.secret.as_bytes(), &c]);
                        out.push(("CHAP_N".into(), mutual.user.clone()));
                        out.push(("CHAP_R".into(), text::hex(&resp)));
                    }
                    _ => return Err("CHAP_I without CHAP_C or the reverse".into()),
                }
                self.authenticated = true;
                Ok(())
            }
            None => Err("CHAP keys out of order".into()),
        }
    }

    /// The answer to an operational key, or None for a declaration that
    /// needs none.
    fn negotiate(&mut self, k: &str, v: &str) -> Option<String> {
        const MAX_LEN: u32 = 0x00ff_ffff;
        let p = &mut self.params;
        let reject = || Some("Reject".to_string());
        match k {
            "HeaderDigest" | "DataDigest" => {
                let pick = v.split(',').find(|x| *x == "None" || *x == "CRC32C");
                let Some(pick) = pick else {
                    return reject();
                };
                let on = pick == "CRC32C";
                if k == "HeaderDigest" {
                    p.header_digest = on;
                } else {
                    p.data_digest = on;
                }
                Some(pick.to_string())
            }
            "MaxRecvDataSegmentLength" => {
                match parse_num(v, 512, MAX_LEN) {
                    Some(n) => p.initiator_mrdsl = n,
                    None => return reject(),
                }
                if self.declared_mrdsl {
                    return None;
                }
                self.declared_mrdsl = true;
                Some(self.offer.max_recv_data_segment.to_string())
            }
            "MaxBurstLength" => {
                let Some(n) = parse_num(v, 512, MAX_LEN) else {
                    return reject();
                };
                let n = n.min(self.offer.max_burst);
                p.max_burst = n;
                Some(n.to_string())
            }
            "FirstBurstLength" => {
                let Some(n) = parse_num(v, 512, MAX_LEN) else {
                    return reject();
                };
                let n = n.min(self.offer.first_burst);
                p.first_burst = n;
                Some(n.to_string())
            }
            "ImmediateData" => match parse_bool(v) {
                Some(b) => {
                    p.immediate_data = b;
                    Some(yes_no(b))
                }
                None => reject(),
            },
            "InitialR2T" => match parse_bool(v) {
                Some(b) => {
                    p.initial_r2t = b;
                    Some(yes_no(b))
                }
                None => reject(),
            },
            "DataPDUInOrder" | "DataSequenceInOrder" => match parse_bool(v) {
                Some(_) => Some("Yes".into()),
                None => reject(),
            },
            "IFMarker" | "OFMarker" => match parse_bool(v) {
                Some(_) => Some("No".into()),
                None => reject(),
            },
            "IFMarkInt" | "OFMarkInt" => Some("Irrelevant".into()),
            "MaxConnections" => parse_num(v, 1, 65535).map(|_| "1".into()).or_else(reject),
            "MaxOutstandingR2T" => parse_num(v, 1, 65535).map(|_| "1".into()).or_else(reject),
            "ErrorRecoveryLevel" => parse_num(v, 0, 2).map(|_| "0".into()).or_else(reject),
            "DefaultTime2Wait" => parse_num(v, 0, 3600)
                .map(|n| n.max(2).to_string())
                .or_else(reject),
            "DefaultTime2Retain" => parse_num(v, 0, 3600).map(|_| "0".into()).or_else(reject),
            _ => Some("NotUnderstood".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    const NAME: &str = "iqn.2024-01.org.example:disk";

    fn offer() -> Offer {
        Offer {
            max_recv_data_segment: 262_144,
            max_burst: 1 << 20,
            first_burst: 262_144,
            window: 32,
        }
    }

    fn target(chap: Option<Chap>, mutual: Option<Chap>) -> Arc<IscsiTarget> {
        let mut t = IscsiTarget::new(NAME, Arc::new(MemDevice::new(1 << 20, 512)));
        t.chap = chap;
        t.mutual_chap = mutual;
        Arc::new(t)
    }

    fn req(csg: u8, nsg: Option<u8>, keys: &[(&str, &str)]) -> Pdu {
        let mut p = Pdu::new(op::LOGIN);
        p.set_immediate(true);
        let mut f = csg << 2;
        if let Some(n) = nsg {
            f |= T_BIT | n;
        }
        p.set_flags(f);
        p.bhs[8..14].copy_from_slice(&[0x80, 1, 2, 3, 4, 5]);
        p.set_itt(9);
        p.set_u32(24, 100);
        let pairs: Vec<(String, String)> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p.data = text::encode(&pairs);
        p
    }

    fn keys(p: &Pdu) -> Vec<(String, String)> {
        text::parse(&p.data).unwrap()
    }

    fn get(p: &Pdu, k: &str) -> Option<String> {
        keys(p).into_iter().find(|(a, _)| a == k).map(|(_, v)| v)
    }

    /// A normal session's security stage without CHAP, moving on to the
    /// operational stage.
    fn plain_security() -> Pdu {
        req(
            SECURITY,
            Some(OPERATIONAL),
            &[
                ("InitiatorName", "iqn.x:init"),
                ("TargetName", NAME),
                ("SessionType", "Normal"),
                ("AuthMethod", "None"),
            ],
        )
    }

    #[test]
    fn plain_login_negotiates_and_enters_full_feature() {
        let mut l = Login::new(offer(), vec![target(None, None)], None, 7);
        let r = match l.step(&plain_security()) {
            Step::Continue(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.flags(), T_BIT | OPERATIONAL);
        assert_eq!(get(&r, "AuthMethod").as_deref(), Some("None"));
        assert_eq!(get(&r, "TargetPortalGroupTag").as_deref(), Some("1"));
        assert_eq!(r.u16_at(36), 0);
        assert_eq!(r.u16_at(14), 0, "no TSIH before the full feature phase");
        let step = l.step(&req(
            OPERATIONAL,
            Some(FULL_FEATURE),
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("MaxBurstLength", "16776192"),
                ("FirstBurstLength", "16776192"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "No"),
                ("MaxConnections", "4"),
                ("ErrorRecoveryLevel", "2"),
                ("X-com.example.Foo", "1"),
            ],
        ));
        let Step::Done(r, s) = step else {
            panic!("{step:?}")
        };
        assert_eq!(r.flags(), T_BIT | (OPERATIONAL << 2) | FULL_FEATURE);
        assert_eq!(r.u16_at(14), 7);
        assert_eq!(get(&r, "HeaderDigest").as_deref(), Some("CRC32C"));
        assert_eq!(get(&r, "MaxBurstLength").as_deref(), Some("1048576"));
        assert_eq!(get(&r, "FirstBurstLength").as_deref(), Some("262144"));
        assert_eq!(get(&r, "MaxConnections").as_deref(), Some("1"));
        assert_eq!(get(&r, "ErrorRecoveryLevel").as_deref(), Some("0"));
        assert_eq!(
            get(&r, "X-com.example.Foo").as_deref(),
            Some("NotUnderstood")
        );
        assert_eq!(
            get(&r, "MaxRecvDataSegmentLength").as_deref(),
            Some("262144")
        );
        assert!(s.params.header_digest && !s.params.data_digest);
        assert_eq!(s.params.initiator_mrdsl, 65536);
        assert!(!s.params.initial_r2t && s.params.immediate_data);
        assert_eq!(s.exp_cmd_sn, 100);
        assert!(matches!(s.kind, SessionKind::Normal(_)));
    }

    /// Every key offered gets an answer: a burst length out of range or
    /// not a number is answered `Reject` (and the setting stays at its
    /// default), not left unanswered for the initiator to wait on.
    #[test]
    fn bad_burst_lengths_are_rejected_not_ignored() {
        let mut l = Login::new(offer(), vec![target(None, None)], None, 7);
        let first = l.step(&plain_security());
        assert!(matches!(first, Step::Continue(_)), "{first:?}");
        let step = l.step(&req(
            OPERATIONAL,
            Some(FULL_FEATURE),
            &[("MaxBurstLength", "0"), ("FirstBurstLength", "lots")],
        ));
        let r = match step {
            Step::Done(r, _) | Step::Continue(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(get(&r, "MaxBurstLength").as_deref(), Some("Reject"));
        assert_eq!(get(&r, "FirstBurstLength").as_deref(), Some("Reject"));
    }

    #[test]
    fn unknown_targets_and_missing_names_fail() {
        let mut l = Login::new(offer(), vec![target(None, None)], None, 1);
        let s = l.step(&req(
            SECURITY,
            Some(OPERATIONAL),
            &[
                ("InitiatorName", "iqn.x"),
                ("TargetName", "iqn.2024-01.nope:x"),
            ],
        ));
        let Step::Fail(r, _) = s else { panic!() };
        assert_eq!(r.u16_at(36), status::NOT_FOUND);
        let mut l = Login::new(offer(), vec![target(None, None)], None, 1);
        let Step::Fail(r, _) = l.step(&req(SECURITY, None, &[("TargetName", NAME)])) else {
            panic!()
        };
        assert_eq!(r.u16_at(36), status::MISSING_PARAMETER);
        let mut l = Login::new(offer(), vec![], None, 1);
        let Step::Fail(r, _) = l.step(&Pdu::new(op::SCSI_CMD)) else {
            panic!()
        };
        assert_eq!(r.u16_at(36), status::INVALID_DURING_LOGIN);
    }

    fn chap_login(
        secret: &str,
        mutual: Option<(&str, [u8; 16])>,
    ) -> (Step, Option<Vec<(String, String)>>) {
        let t = target(
            Some(Chap::new("alice", "alice's secret")),
            Some(Chap::new("tgt", "the target's secret")),
        );
        let mut l = Login::new(offer(), vec![t], None, 3);
        let Step::Continue(r) = l.step(&req(
            SECURITY,
            Some(OPERATIONAL),
            &[
                ("InitiatorName", "iqn.x"),
                ("TargetName", NAME),
                ("AuthMethod", "None,CHAP"),
            ],
        )) else {
            panic!()
        };
        assert_eq!(get(&r, "AuthMethod").as_deref(), Some("CHAP"));
        assert_eq!(r.flags() & T_BIT, 0, "no transit before CHAP");
        let Step::Continue(r) = l.step(&req(SECURITY, None, &[("CHAP_A", "7,5")])) else {
            panic!()
        };
        let id: u8 = get(&r, "CHAP_I").unwrap().parse().unwrap();
        let c = text::parse_hex(&get(&r, "CHAP_C").unwrap()).unwrap();
        let resp = text::hex(&md5(&[&[id], secret.as_bytes(), &c]));
        let mut k: Vec<(&str, String)> = vec![("CHAP_N", "alice".into()), ("CHAP_R", resp)];
        if let Some((i, ch)) = mutual {
            k.push(("CHAP_I", i.into()));
            k.push(("CHAP_C", text::hex(&ch)));
        }
        let kk: Vec<(&str, &str)> = k.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let s = l.step(&req(SECURITY, Some(OPERATIONAL), &kk));
        let ks = match &s {
            Step::Continue(r) => Some(keys(r)),
            _ => None,
        };
        (s, ks)
    }

    #[test]
    fn chap_one_way_and_mutual() {
        let (s, _) = chap_login("alice's secret", None);
        let Step::Continue(r) = s else {
            panic!("{s:?}")
        };
        assert_eq!(r.flags(), T_BIT | OPERATIONAL);
        let (s, _) = chap_login("wrong secret!!", None);
        let Step::Fail(r, _) = s else { panic!() };
        assert_eq!(r.u16_at(36), status::AUTH_FAILED);
        let ch = [7u8; 16];
        let (s, k) = chap_login("alice's secret", Some(("42", ch)));
        assert!(matches!(s, Step::Continue(_)));
        let k = k.unwrap();
        let r = &k.iter().find(|(a, _)| a == "CHAP_R").unwrap().1;
        let want = md5(&[&[42], b"the target's secret", &ch]);
        assert_eq!(text::parse_hex(r).unwrap(), want);
        assert!(k.contains(&("CHAP_N".into(), "tgt".into())));
    }

    #[test]
    fn chap_cannot_be_skipped() {
        let t = target(Some(Chap::new("alice", "alice's secret")), None);
        let mut l = Login::new(offer(), vec![t.clone()], None, 3);
        let Step::Fail(r, _) = l.step(&req(
            OPERATIONAL,
            Some(FULL_FEATURE),
            &[("InitiatorName", "iqn.x"), ("TargetName", NAME)],
        )) else {
            panic!()
        };
        assert_eq!(r.u16_at(36), status::AUTH_FAILED);
        let mut l = Login::new(offer(), vec![t], None, 3);
        let Step::Fail(r, _) = l.step(&req(
            SECURITY,
            Some(OPERATIONAL),
            &[
                ("InitiatorName", "iqn.x"),
                ("TargetName", NAME),
                ("AuthMethod", "None"),
            ],
        )) else {
            panic!()
        };
        assert_eq!(r.u16_at(36), status::AUTH_FAILED);
    }

    #[test]
    fn discovery_sessions_need_no_target() {
        let mut l = Login::new(offer(), vec![], None, 5);
        let s = l.step(&req(
            OPERATIONAL,
            Some(FULL_FEATURE),
            &[("InitiatorName", "iqn.x"), ("SessionType", "Discovery")],
        ));
        let Step::Done(_, s) = s else { panic!("{s:?}") };
        assert!(matches!(s.kind, SessionKind::Discovery));
    }

    #[test]
    fn continued_text_is_gathered() {
        let mut l = Login::new(offer(), vec![target(None, None)], None, 5);
        let mut a = req(SECURITY, None, &[("InitiatorName", "iqn.x")]);
        a.set_flags(C_BIT);
        let mut b = req(SECURITY, Some(OPERATIONAL), &[("TargetName", NAME)]);
        b.data.splice(0..0, std::mem::take(&mut a.data));
        let half = b.data.split_off(10);
        a.data = b.data.clone();
        b.data = half;
        let Step::Continue(r) = l.step(&a) else {
            panic!()
        };
        assert!(r.data.is_empty());
        let Step::Continue(r) = l.step(&b) else {
            panic!()
        };
        assert_eq!(r.flags() & T_BIT, T_BIT);
    }
}

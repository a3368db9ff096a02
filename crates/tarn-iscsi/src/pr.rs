//! Persistent reservations (SPC-4 PERSISTENT RESERVE IN and OUT), as
//! clustered hypervisors and fencing agents use them.
//!
//! # Model
//!
//! The state belongs to a logical unit ([`crate::lu::LuState`]) and is
//! shared by every session of every target serving its device. An I_T
//! nexus ([`Nexus`]) is the initiator port (initiator name, compared
//! without regard to case, and ISID) with the target port (the target's
//! name; the server has one portal group, tag 1). Each nexus holds at
//! most one registration (a non-zero 8-byte key); one reservation may
//! exist, of type Write Exclusive, Exclusive Access, or their Registrants
//! Only and All Registrants variants, always of the whole logical unit
//! (scope 0). For the All Registrants types every registrant holds the
//! reservation; for the others the nexus that reserved (or preempted).
//!
//! Invariants, kept by every service action (a property test runs
//! random sequences against them): keys are non-zero and nexuses appear
//! once; a reservation exists only while its holder is registered (for
//! the All Registrants types: while anyone is); the generation counts
//! the REGISTER, REGISTER AND IGNORE EXISTING KEY, CLEAR, PREEMPT and
//! PREEMPT AND ABORT actions that succeeded, not RESERVE or RELEASE.
//!
//! # Access
//!
//! [`Reservations::conflicts`] says whether a command of a nexus meets
//! RESERVATION CONFLICT, per SPC-4's table: commands that only describe
//! the unit (INQUIRY, REPORT LUNS, READ CAPACITY, MODE SENSE, TEST UNIT
//! READY, REQUEST SENSE, REPORT SUPPORTED OPERATION CODES, PERSISTENT
//! RESERVE IN/OUT) run whatever the persistent reservation (an SPC-2
//! one is stricter, below); the holder runs anything; under a
//! Registrants Only or All Registrants type every registrant does too;
//! otherwise Write Exclusive refuses writes (and SYNCHRONIZE CACHE) and
//! Exclusive Access refuses reads as well.
//!
//! # Reservations of SPC-2 (RESERVE and RELEASE)
//!
//! The older, non-persistent reservation: RESERVE(6) or RESERVE(10)
//! gives the whole unit to one nexus, and every other nexus's commands
//! then meet RESERVATION CONFLICT, apart from INQUIRY, REPORT LUNS,
//! REQUEST SENSE and RELEASE ([`Access::Free`]), as SPC-2 lists them.
//! Older cluster software and hypervisors that cannot use COMPARE AND
//! WRITE or persistent reservations lock a shared disk this way. The
//! holder may reserve again; anyone else's RESERVE conflicts; a RELEASE
//! from a nexus that does not hold it does nothing and succeeds. It
//! ends with the holder's RELEASE, a LUN RESET or TARGET RESET
//! ([`Reservations::reset`]), and the loss of the holder's I_T nexus
//! ([`Reservations::nexus_lost`]): its last session ending (logout, a
//! dropped connection, or TCP keepalive giving up on a host that
//! crashed), or a new login with the same ISID reinstating it. The two
//! kinds never coexist (REPORT CAPABILITIES says CRH=0, so SPC-2's rules
//! apply): while any nexus is registered for persistent reservations,
//! RESERVE and RELEASE conflict; while an SPC-2 reservation exists,
//! every PERSISTENT RESERVE IN and OUT conflicts, the holder's too
//! ([`Access::Persistent`]).
//!
//! # Not supported
//!
//! APTPL (persist through power loss: reservations live in memory and do
//! not survive a restart of the server, so APTPL=1 is refused and
//! REPORT CAPABILITIES says PTPL_C=0), SPEC_I_PT and ALL_TG_PT (refused,
//! SIP_C=0, ATP_C=0), REGISTER AND MOVE and element scope. The unit
//! attentions SPC-4 posts when a reservation is preempted, cleared or
//! released ([`Reservations::out_telling`]) reach the nexuses that have a
//! session at the time (see [`crate::lu`]); a registrant with no session
//! then learns nothing. PREEMPT AND ABORT removes the registrations like
//! PREEMPT;
//! it does not abort the preempted nexuses' commands already queued, but
//! those meet RESERVATION CONFLICT when they run, and a write that
//! passed its check before is finished before the PREEMPT AND ABORT
//! completes (the server runs every PERSISTENT RESERVE OUT with the
//! device's writes held off).

use crate::scsi::Sense;

/// Most registrations one logical unit keeps. Registrations outlive the
/// sessions that made them, and an initiator may log in with a new ISID
/// (a new nexus) as often as it likes: without a bound, one admitted
/// initiator could grow the unit's state, and the scan every command
/// makes of it while a reservation is held, without end. A cluster
/// registers a few nexuses per host; a REGISTER beyond this many is
/// refused with INSUFFICIENT REGISTRATION RESOURCES, as SPC-4 provides.
pub const MAX_REGISTRATIONS: usize = 1024;

/// An I_T nexus (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// The initiator's iSCSI name, in lower case.
    pub initiator: String,
    /// The initiator's session identifier.
    pub isid: [u8; 6],
    /// The target's iSCSI name.
    pub target: String,
}

impl Nexus {
    /// The nexus of `initiator` (name, any case) with session `isid` at
    /// `target`.
    pub fn new(initiator: &str, isid: [u8; 6], target: &str) -> Nexus {
        Nexus {
            initiator: initiator.to_ascii_lowercase(),
            isid,
            target: target.to_string(),
        }
    }

    /// The iSCSI TransportID of the initiator port (format 01b:
    /// `NAME,i,0xISID`, NUL-terminated, padded to 4 bytes).
    pub fn transport_id(&self) -> Vec<u8> {
        let isid: String = self.isid.iter().map(|b| format!("{b:02x}")).collect();
        let mut name = format!("{},i,0x{isid}", self.initiator).into_bytes();
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        let mut v = vec![0x40 | 0x05, 0];
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(&name);
        v
    }
}

/// Reservation types (SPC-4 table "persistent reservation type codes").
pub mod kind {
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: u8 = 1;
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    /// Write Exclusive, Registrants Only.
    pub const WRITE_EXCLUSIVE_RO: u8 = 5;
    /// Exclusive Access, Registrants Only.
    pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
    /// Write Exclusive, All Registrants.
    pub const WRITE_EXCLUSIVE_AR: u8 = 7;
    /// Exclusive Access, All Registrants.
    pub const EXCLUSIVE_ACCESS_AR: u8 = 8;

    pub(crate) fn valid(t: u8) -> bool {
        matches!(t, 1 | 3 | 5..=8)
    }
    pub(crate) fn all_registrants(t: u8) -> bool {
        matches!(t, 7 | 8)
    }
    pub(crate) fn registrants_allowed(t: u8) -> bool {
        matches!(t, 5..=8)
    }
    pub(crate) fn write_exclusive(t: u8) -> bool {
        matches!(t, 1 | 5 | 7)
    }
}

/// How a command touches the medium, for reservation checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Allowed under any reservation, SPC-2 ones included: INQUIRY,
    /// REPORT LUNS, REQUEST SENSE and RELEASE.
    Free,
    /// Allowed under any persistent reservation, refused to others
    /// than the holder of an SPC-2 one.
    Any,
    /// PERSISTENT RESERVE IN and OUT: allowed under any persistent
    /// reservation, refused to everyone while an SPC-2 one exists.
    Persistent,
    /// Reads the medium.
    Read,
    /// Changes the medium (or its cache).
    Write,
}

/// Why a PERSISTENT RESERVE command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrError {
    /// RESERVATION CONFLICT status.
    #[error("reservation conflict")]
    Conflict,
    /// CHECK CONDITION with this sense.
    #[error("check condition {0:?}")]
    Check(Sense),
}

impl From<Sense> for PrError {
    fn from(s: Sense) -> PrError {
        PrError::Check(s)
    }
}

/// PERSISTENT RESERVE OUT service actions.
pub mod action {
    /// REGISTER.
    pub const REGISTER: u8 = 0;
    /// RESERVE.
    pub const RESERVE: u8 = 1;
    /// RELEASE.
    pub const RELEASE: u8 = 2;
    /// CLEAR.
    pub const CLEAR: u8 = 3;
    /// PREEMPT.
    pub const PREEMPT: u8 = 4;
    /// PREEMPT AND ABORT.
    pub const PREEMPT_AND_ABORT: u8 = 5;
    /// REGISTER AND IGNORE EXISTING KEY.
    pub const REGISTER_AND_IGNORE: u8 = 6;
}

/// The parameter list of PERSISTENT RESERVE OUT (the basic 24-byte
/// form).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutParams {
    /// RESERVATION KEY: the sender's current key.
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY: the new key, or the key to
    /// preempt.
    pub sa_key: u64,
}

impl OutParams {
    /// Reads a parameter list of `len` bytes (the CDB's length) from
    /// `data`.
    pub fn parse(len: u32, data: &[u8]) -> Result<OutParams, Sense> {
        if len != 24 || data.len() < 24 {
            return Err(Sense::PARAMETER_LIST_LENGTH);
        }
        // SPEC_I_PT, ALL_TG_PT and APTPL are not supported.
        if data[20] & 0x0d != 0 {
            return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
        }
        let k = |b: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[..8]);
            u64::from_be_bytes(a)
        };
        Ok(OutParams {
            key: k(&data[0..]),
            sa_key: k(&data[8..]),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Reservation {
    /// The nexus that reserved (meaningless for the All Registrants
    /// types, where every registrant holds it).
    holder: Nexus,
    kind: u8,
}

/// The persistent reservation state of one logical unit.
#[derive(Clone, Debug, Default)]
pub struct Reservations {
    generation: u32,
    regs: Vec<(Nexus, u64)>,
    res: Option<Reservation>,
    /// The holder of the SPC-2 reservation (RESERVE(6) or (10)), if
    /// any, and the unit's reset epoch its RESERVE was admitted in.
    unit: Option<(Nexus, u64)>,
}

impl Reservations {
    /// The PRGENERATION counter.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The key `n` registered, if any.
    pub fn key_of(&self, n: &Nexus) -> Option<u64> {
        self.regs.iter().find(|(r, _)| r == n).map(|&(_, k)| k)
    }

    /// The reservation type, if the unit is reserved.
    pub fn reserved(&self) -> Option<u8> {
        self.res.as_ref().map(|r| r.kind)
    }

    /// True if `n` holds the reservation.
    pub fn holds(&self, n: &Nexus) -> bool {
        match &self.res {
            Some(r) if kind::all_registrants(r.kind) => self.key_of(n).is_some(),
            Some(r) => r.holder == *n,
            None => false,
        }
    }

    /// True if a command of `n` with `access` meets RESERVATION
    /// CONFLICT.
    pub fn conflicts(&self, n: &Nexus, access: Access) -> bool {
        match self.unit_holder() {
            Some(_) if access == Access::Persistent => return true,
            Some(h) if h != n && access != Access::Free => return true,
            _ => {}
        }
        let Some(r) = &self.res else {
            return false;
        };
        if matches!(access, Access::Any | Access::Free | Access::Persistent) || self.holds(n) {
            return false;
        }
        if kind::registrants_allowed(r.kind) && self.key_of(n).is_some() {
            return false;
        }
        !(kind::write_exclusive(r.kind) && access == Access::Read)
    }

    /// The holder of the SPC-2 reservation, if the unit has one.
    pub fn unit_holder(&self) -> Option<&Nexus> {
        self.unit.as_ref().map(|(h, _)| h)
    }

    /// RESERVE(6) or RESERVE(10) from `n`, admitted in reset epoch
    /// `epoch` (see the module docs).
    pub fn reserve_unit(&mut self, n: &Nexus, epoch: u64) -> Result<(), PrError> {
        if !self.regs.is_empty() || self.unit_holder().is_some_and(|h| h != n) {
            return Err(PrError::Conflict);
        }
        self.unit = Some((n.clone(), epoch));
        Ok(())
    }

    /// RELEASE(6) or RELEASE(10) from `n`: ends its SPC-2 reservation;
    /// from another nexus, nothing.
    pub fn release_unit(&mut self, n: &Nexus) -> Result<(), PrError> {
        if !self.regs.is_empty() {
            return Err(PrError::Conflict);
        }
        if self.unit_holder() == Some(n) {
            self.unit = None;
        }
        Ok(())
    }

    /// A LUN RESET or TARGET RESET that moved the unit to reset epoch
    /// `epoch`: an SPC-2 reservation taken before it ends (persistent
    /// reservations stay, as SPC-4 says). One a command admitted after
    /// the reset took stays: the reset does not reach back over it.
    pub fn reset(&mut self, epoch: u64) {
        if self.unit.as_ref().is_some_and(|&(_, e)| e < epoch) {
            self.unit = None;
        }
    }

    /// The last session of `n` ended: an SPC-2 reservation it held ends
    /// (its registrations, being persistent, stay).
    pub fn nexus_lost(&mut self, n: &Nexus) {
        if self.unit_holder() == Some(n) {
            self.unit = None;
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Drops `n`'s registration, and the reservation if that leaves it
    /// without a holder.
    fn unregister(&mut self, n: &Nexus) {
        let held = self.holds(n);
        self.regs.retain(|(r, _)| r != n);
        if let Some(r) = &self.res {
            let gone = if kind::all_registrants(r.kind) {
                self.regs.is_empty()
            } else {
                held
            };
            if gone {
                self.res = None;
            }
        }
    }

    /// [`Reservations::out`], and the unit attentions SPC-4 has it post:
    /// CLEAR tells every other nexus that was registered RESERVATIONS
    /// PREEMPTED; PREEMPT (and PREEMPT AND ABORT) tells each nexus whose
    /// registration it removed REGISTRATIONS PREEMPTED; RELEASE of a
    /// Registrants Only or All Registrants reservation, and the holder
    /// of a Registrants Only one unregistering, tell every other
    /// registered nexus RESERVATIONS RELEASED.
    pub fn out_telling(
        &mut self,
        n: &Nexus,
        sa: u8,
        scope_type: u8,
        p: OutParams,
    ) -> Result<Vec<(Nexus, Sense)>, PrError> {
        let before: Vec<Nexus> = self.regs.iter().map(|(r, _)| r.clone()).collect();
        let reserved = self.reserved();
        self.out(n, sa, scope_type, p)?;
        let others = before.into_iter().filter(|r| r != n);
        let told = match sa {
            action::CLEAR => others.map(|r| (r, Sense::RESERVATIONS_PREEMPTED)).collect(),
            action::PREEMPT | action::PREEMPT_AND_ABORT => others
                .filter(|r| self.key_of(r).is_none())
                .map(|r| (r, Sense::REGISTRATIONS_PREEMPTED))
                .collect(),
            // A registrants' reservation went: released, or (Registrants
            // Only) with its holder's registration.
            action::RELEASE | action::REGISTER | action::REGISTER_AND_IGNORE
                if self.res.is_none()
                    && reserved.is_some_and(|t| {
                        kind::registrants_allowed(t)
                            && (sa == action::RELEASE || !kind::all_registrants(t))
                    }) =>
            {
                others
                    .filter(|r| self.key_of(r).is_some())
                    .map(|r| (r, Sense::RESERVATIONS_RELEASED))
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(told)
    }

    /// PERSISTENT RESERVE OUT `sa` from `n` with `scope_type` (CDB byte
    /// 2) and parameters `p`.
    pub fn out(&mut self, n: &Nexus, sa: u8, scope_type: u8, p: OutParams) -> Result<(), PrError> {
        let mine = self.key_of(n);
        match sa {
            action::REGISTER | action::REGISTER_AND_IGNORE => {
                if sa == action::REGISTER && p.key != mine.unwrap_or(0) {
                    return Err(PrError::Conflict);
                }
                match (mine, p.sa_key) {
                    (None, 0) => return Ok(()),
                    (None, _) if self.regs.len() >= MAX_REGISTRATIONS => {
                        return Err(Sense::INSUFFICIENT_REGISTRATIONS.into())
                    }
                    (None, k) => self.regs.push((n.clone(), k)),
                    (Some(_), 0) => self.unregister(n),
                    (Some(_), k) => {
                        for r in self.regs.iter_mut().filter(|(r, _)| r == n) {
                            r.1 = k;
                        }
                    }
                }
                self.bump();
                return Ok(());
            }
            action::RESERVE..=action::PREEMPT_AND_ABORT => {}
            _ => return Err(Sense::INVALID_FIELD_IN_CDB.into()),
        }
        // Every other action needs the sender registered, with its key.
        if mine.is_none() || mine != Some(p.key) {
            return Err(PrError::Conflict);
        }
        let (scope, t) = (scope_type >> 4, scope_type & 0x0f);
        let typed = matches!(
            sa,
            action::RESERVE | action::RELEASE | action::PREEMPT | action::PREEMPT_AND_ABORT
        );
        if typed && (scope != 0 || !kind::valid(t)) {
            return Err(Sense::INVALID_FIELD_IN_CDB.into());
        }
        match sa {
            action::RESERVE => match &self.res {
                None => {
                    self.res = Some(Reservation {
                        holder: n.clone(),
                        kind: t,
                    })
                }
                Some(r) if self.holds(n) && r.kind == t => {}
                Some(_) => return Err(PrError::Conflict),
            },
            action::RELEASE => match &self.res {
                Some(r) if self.holds(n) => {
                    if r.kind != t {
                        return Err(Sense::INVALID_RELEASE.into());
                    }
                    self.res = None;
                }
                _ => {}
            },
            action::CLEAR => {
                self.res = None;
                self.regs.clear();
                self.bump();
            }
            _ => self.preempt(n, t, p.sa_key)?,
        }
        Ok(())
    }

    fn preempt(&mut self, n: &Nexus, t: u8, victim: u64) -> Result<(), PrError> {
        let others_with = |s: &Self, k: u64| s.regs.iter().any(|(r, rk)| *rk == k && r != n);
        let drop_key = |s: &mut Self, k: u64| s.regs.retain(|(r, rk)| *rk != k || r == n);
        match self.res.clone() {
            Some(r) if kind::all_registrants(r.kind) && victim == 0 => {
                // Everyone else goes; the sender now holds a reservation
                // of the type it names.
                self.regs.retain(|(r, _)| r == n);
                self.res = Some(Reservation {
                    holder: n.clone(),
                    kind: t,
                });
            }
            Some(r) if !kind::all_registrants(r.kind) && self.key_of(&r.holder) == Some(victim) => {
                // The holder is preempted: its key's registrations go
                // (the sender's stays) and the sender holds the new one.
                drop_key(self, victim);
                self.res = Some(Reservation {
                    holder: n.clone(),
                    kind: t,
                });
            }
            _ => {
                if victim == 0 {
                    return Err(Sense::INVALID_FIELD_IN_PARAMETERS.into());
                }
                if !others_with(self, victim) {
                    return Err(PrError::Conflict);
                }
                drop_key(self, victim);
            }
        }
        self.bump();
        Ok(())
    }

    /// PERSISTENT RESERVE IN `sa`: READ KEYS (0), READ RESERVATION (1),
    /// REPORT CAPABILITIES (2), READ FULL STATUS (3). The whole parameter
    /// data; the caller cuts it to the allocation length.
    pub fn read(&self, sa: u8) -> Result<Vec<u8>, Sense> {
        let mut v = self.generation.to_be_bytes().to_vec();
        match sa {
            0 => {
                let keys: Vec<u8> = self
                    .regs
                    .iter()
                    .flat_map(|(_, k)| k.to_be_bytes())
                    .collect();
                v.extend_from_slice(&(keys.len() as u32).to_be_bytes());
                v.extend_from_slice(&keys);
            }
            1 => match &self.res {
                Some(r) => {
                    v.extend_from_slice(&16u32.to_be_bytes());
                    let key = if kind::all_registrants(r.kind) {
                        0
                    } else {
                        self.key_of(&r.holder).unwrap_or(0)
                    };
                    v.extend_from_slice(&key.to_be_bytes());
                    v.extend_from_slice(&[0, 0, 0, 0, 0, r.kind, 0, 0]);
                }
                None => v.extend_from_slice(&0u32.to_be_bytes()),
            },
            2 => {
                // Length 8; no CRH, SIP_C, ATP_C or PTPL_C; TMV with the
                // six types.
                v = vec![0x00, 0x08, 0x00, 0x80, 0xea, 0x01, 0, 0];
            }
            3 => {
                let mut d = Vec::new();
                for (nx, k) in &self.regs {
                    let tid = nx.transport_id();
                    let mut e = k.to_be_bytes().to_vec();
                    e.extend_from_slice(&[0; 4]);
                    let holder = self.holds(nx);
                    e.push(u8::from(holder));
                    e.push(match (&self.res, holder) {
                        (Some(r), true) => r.kind,
                        _ => 0,
                    });
                    e.extend_from_slice(&[0; 4]);
                    e.extend_from_slice(&1u16.to_be_bytes()); // relative target port
                    e.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    e.extend_from_slice(&tid);
                    d.extend_from_slice(&e);
                }
                v.extend_from_slice(&(d.len() as u32).to_be_bytes());
                v.extend_from_slice(&d);
            }
            _ => return Err(Sense::INVALID_FIELD_IN_CDB),
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nx(i: u8) -> Nexus {
        Nexus::new(
            &format!("iqn.2024-01.x:host{}", i / 2),
            [0, 0, 0, 0, 0, i % 2],
            "iqn.t",
        )
    }
    fn p(key: u64, sa_key: u64) -> OutParams {
        OutParams { key, sa_key }
    }

    #[test]
    fn register_reserve_and_access() {
        let mut r = Reservations::default();
        let (a, b, c) = (nx(0), nx(1), nx(2));
        // Registering needs key 0 from an unregistered nexus.
        assert_eq!(
            r.out(&a, action::REGISTER, 0, p(5, 0xa)),
            Err(PrError::Conflict)
        );
        r.out(&a, action::REGISTER, 0, p(0, 0xa)).unwrap();
        r.out(&b, action::REGISTER_AND_IGNORE, 0, p(99, 0xb))
            .unwrap();
        assert_eq!(r.generation(), 2);
        // RESERVE needs the right key.
        assert_eq!(
            r.out(&a, action::RESERVE, 1, p(0xb, 0)),
            Err(PrError::Conflict)
        );
        assert_eq!(
            r.out(&c, action::RESERVE, 1, p(0, 0)),
            Err(PrError::Conflict)
        );
        r.out(&a, action::RESERVE, kind::WRITE_EXCLUSIVE, p(0xa, 0))
            .unwrap();
        assert_eq!(r.generation(), 2, "RESERVE does not count");
        r.out(&a, action::RESERVE, kind::WRITE_EXCLUSIVE, p(0xa, 0))
            .unwrap();
        assert_eq!(
            r.out(&a, action::RESERVE, kind::EXCLUSIVE_ACCESS, p(0xa, 0)),
            Err(PrError::Conflict)
        );
        assert_eq!(
            r.out(&b, action::RESERVE, 1, p(0xb, 0)),
            Err(PrError::Conflict)
        );
        // Write Exclusive: others read, only the holder writes.
        assert!(!r.conflicts(&a, Access::Write));
        assert!(!r.conflicts(&b, Access::Read));
        assert!(r.conflicts(&b, Access::Write));
        assert!(r.conflicts(&c, Access::Write));
        assert!(!r.conflicts(&c, Access::Any));
        // RELEASE of another type is an error; of the right one frees.
        assert_eq!(
            r.out(&a, action::RELEASE, kind::EXCLUSIVE_ACCESS, p(0xa, 0)),
            Err(PrError::Check(Sense::INVALID_RELEASE))
        );
        r.out(&b, action::RELEASE, 1, p(0xb, 0)).unwrap();
        assert_eq!(r.reserved(), Some(1), "a non-holder's RELEASE does nothing");
        r.out(&a, action::RELEASE, 1, p(0xa, 0)).unwrap();
        assert_eq!(r.reserved(), None);
        // Exclusive Access, Registrants Only: registrants do anything,
        // others nothing.
        r.out(&a, action::RESERVE, kind::EXCLUSIVE_ACCESS_RO, p(0xa, 0))
            .unwrap();
        assert!(!r.conflicts(&b, Access::Write));
        assert!(r.conflicts(&c, Access::Read));
        // Unregistering the holder drops the reservation.
        r.out(&a, action::REGISTER, 0, p(0xa, 0)).unwrap();
        assert_eq!(r.reserved(), None);
        assert_eq!(r.key_of(&a), None);
        // Bad scope or type; APTPL and short lists are refused.
        assert_eq!(
            r.out(&b, action::RESERVE, 0x11, p(0xb, 0)),
            Err(PrError::Check(Sense::INVALID_FIELD_IN_CDB))
        );
        assert_eq!(
            r.out(&b, action::RESERVE, 2, p(0xb, 0)),
            Err(PrError::Check(Sense::INVALID_FIELD_IN_CDB))
        );
        let mut list = [0u8; 24];
        list[20] = 1;
        assert_eq!(
            OutParams::parse(24, &list),
            Err(Sense::INVALID_FIELD_IN_PARAMETERS)
        );
        assert_eq!(
            OutParams::parse(20, &list),
            Err(Sense::PARAMETER_LIST_LENGTH)
        );
    }

    #[test]
    fn all_registrants_and_preempt() {
        let mut r = Reservations::default();
        let (a, b, c) = (nx(0), nx(1), nx(2));
        for (n, k) in [(&a, 0xa), (&b, 0xb), (&c, 0xc)] {
            r.out(n, action::REGISTER, 0, p(0, k)).unwrap();
        }
        r.out(&a, action::RESERVE, kind::WRITE_EXCLUSIVE_AR, p(0xa, 0))
            .unwrap();
        assert!(r.holds(&b) && r.holds(&c));
        let rr = r.read(1).unwrap();
        assert_eq!(&rr[8..16], &[0; 8], "All Registrants report key 0");
        // The reservation stays while anyone is registered.
        r.out(&a, action::REGISTER, 0, p(0xa, 0)).unwrap();
        assert_eq!(r.reserved(), Some(kind::WRITE_EXCLUSIVE_AR));
        // PREEMPT with key 0 under All Registrants: the sender alone.
        r.out(&b, action::PREEMPT, kind::EXCLUSIVE_ACCESS, p(0xb, 0))
            .unwrap();
        assert_eq!(r.key_of(&c), None);
        assert!(r.holds(&b));
        assert!(r.conflicts(&c, Access::Read));
        // Preempting the holder's key moves the reservation.
        r.out(&a, action::REGISTER, 0, p(0, 0xa)).unwrap();
        r.out(
            &a,
            action::PREEMPT_AND_ABORT,
            kind::WRITE_EXCLUSIVE,
            p(0xa, 0xb),
        )
        .unwrap();
        assert!(r.holds(&a));
        assert_eq!(r.key_of(&b), None);
        // Preempting a key nobody has: conflict; key 0 without an All
        // Registrants reservation: invalid.
        assert_eq!(
            r.out(&a, action::PREEMPT, 1, p(0xa, 0x77)),
            Err(PrError::Conflict)
        );
        assert_eq!(
            r.out(&a, action::PREEMPT, 1, p(0xa, 0)),
            Err(PrError::Check(Sense::INVALID_FIELD_IN_PARAMETERS))
        );
        // CLEAR empties everything and counts.
        let g = r.generation();
        r.out(&a, action::CLEAR, 0, p(0xa, 0)).unwrap();
        assert_eq!(
            (r.reserved(), r.regs.len(), r.generation()),
            (None, 0, g + 1)
        );
    }

    #[test]
    fn clear_preempt_and_release_say_whom_they_took_from() {
        let mut r = Reservations::default();
        let (a, b, c, d) = (nx(0), nx(1), nx(2), nx(3));
        for (n, k) in [(&a, 0xa), (&b, 0xb), (&c, 0xc), (&d, 0xc)] {
            r.out(n, action::REGISTER, 0, p(0, k)).unwrap();
        }
        let told = |v: Vec<(Nexus, Sense)>| -> Vec<(Nexus, Sense)> {
            let mut v = v;
            v.sort_by(|x, y| (&x.0.initiator, x.0.isid).cmp(&(&y.0.initiator, y.0.isid)));
            v
        };
        // Registering and reserving tell nobody.
        assert!(r
            .out_telling(&a, action::RESERVE, kind::WRITE_EXCLUSIVE_RO, p(0xa, 0))
            .unwrap()
            .is_empty());
        // Releasing a Registrants Only reservation tells the registrants.
        assert_eq!(
            told(
                r.out_telling(&a, action::RELEASE, kind::WRITE_EXCLUSIVE_RO, p(0xa, 0))
                    .unwrap()
            ),
            vec![
                (b.clone(), Sense::RESERVATIONS_RELEASED),
                (c.clone(), Sense::RESERVATIONS_RELEASED),
                (d.clone(), Sense::RESERVATIONS_RELEASED),
            ]
        );
        // Releasing a plain one does not; a failed action tells nobody.
        r.out(&a, action::RESERVE, kind::WRITE_EXCLUSIVE, p(0xa, 0))
            .unwrap();
        assert!(r
            .out_telling(&b, action::RELEASE, kind::WRITE_EXCLUSIVE, p(0x99, 0))
            .is_err());
        assert!(r
            .out_telling(&a, action::RELEASE, kind::WRITE_EXCLUSIVE, p(0xa, 0))
            .unwrap()
            .is_empty());
        // PREEMPT of key 0xc: both nexuses registered with it are told.
        assert_eq!(
            told(
                r.out_telling(&b, action::PREEMPT, kind::WRITE_EXCLUSIVE, p(0xb, 0xc))
                    .unwrap()
            ),
            vec![
                (c.clone(), Sense::REGISTRATIONS_PREEMPTED),
                (d.clone(), Sense::REGISTRATIONS_PREEMPTED),
            ]
        );
        // The holder of a Registrants Only reservation unregisters: the
        // reservation goes, and the others are told.
        r.out(&b, action::RESERVE, kind::EXCLUSIVE_ACCESS_RO, p(0xb, 0))
            .unwrap();
        r.out(&a, action::REGISTER, 0, p(0xa, 0xa)).unwrap();
        assert_eq!(
            r.out_telling(&b, action::REGISTER, 0, p(0xb, 0)).unwrap(),
            vec![(a.clone(), Sense::RESERVATIONS_RELEASED)]
        );
        assert_eq!(r.reserved(), None);
        r.out(&b, action::REGISTER, 0, p(0, 0xb)).unwrap();
        // CLEAR tells every other registrant.
        assert_eq!(
            r.out_telling(&b, action::CLEAR, 0, p(0xb, 0)).unwrap(),
            vec![(a.clone(), Sense::RESERVATIONS_PREEMPTED)]
        );
    }

    #[test]
    fn read_keys_full_status_and_capabilities() {
        let mut r = Reservations::default();
        r.out(&nx(0), action::REGISTER, 0, p(0, 0x1122)).unwrap();
        r.out(
            &nx(0),
            action::RESERVE,
            kind::EXCLUSIVE_ACCESS,
            p(0x1122, 0),
        )
        .unwrap();
        let k = r.read(0).unwrap();
        assert_eq!(&k[..8], &[0, 0, 0, 1, 0, 0, 0, 8]);
        assert_eq!(&k[8..], &0x1122u64.to_be_bytes());
        let f = r.read(3).unwrap();
        assert_eq!(f[8 + 12], 1, "R_HOLDER");
        assert_eq!(f[8 + 13], kind::EXCLUSIVE_ACCESS);
        let tid = &f[8 + 24..];
        assert_eq!(tid[0], 0x45, "iSCSI, initiator port format");
        assert!(String::from_utf8_lossy(tid).contains("iqn.2024-01.x:host0,i,0x000000000000"));
        assert_eq!(tid.len() % 4, 0);
        let c = r.read(2).unwrap();
        assert_eq!(c[2] & 0x01, 0, "PTPL_C clear");
        assert_eq!(r.read(4), Err(Sense::INVALID_FIELD_IN_CDB));
        assert_eq!(
            Nexus::new("IQN.X", [0; 6], "t"),
            Nexus::new("iqn.x", [0; 6], "t")
        );
    }

    #[test]
    fn registrations_are_bounded() {
        let mut r = Reservations::default();
        let nexus = |i: usize| {
            Nexus::new(
                "iqn.x",
                (i as u64).to_be_bytes()[2..].try_into().unwrap(),
                "t",
            )
        };
        for i in 0..MAX_REGISTRATIONS {
            r.out(&nexus(i), action::REGISTER, 0, p(0, 1)).unwrap();
        }
        let gen = r.generation();
        let extra = nexus(MAX_REGISTRATIONS);
        for sa in [action::REGISTER, action::REGISTER_AND_IGNORE] {
            assert_eq!(
                r.out(&extra, sa, 0, p(0, 1)),
                Err(PrError::Check(Sense::INSUFFICIENT_REGISTRATIONS))
            );
        }
        assert_eq!(r.generation(), gen, "a refused REGISTER counts nothing");
        assert_eq!(r.key_of(&extra), None);
        // A registered nexus still changes or drops its key; a dropped
        // one leaves room for another.
        r.out(&nexus(0), action::REGISTER, 0, p(1, 2)).unwrap();
        assert_eq!(r.key_of(&nexus(0)), Some(2));
        r.out(&nexus(0), action::REGISTER, 0, p(2, 0)).unwrap();
        r.out(&extra, action::REGISTER, 0, p(0, 1)).unwrap();
        assert_eq!(r.key_of(&extra), Some(1));
    }

    fn check_invariants(r: &Reservations) {
        let mut seen = std::collections::HashSet::new();
        for (n, k) in &r.regs {
            assert_ne!(*k, 0, "keys are non-zero");
            assert!(seen.insert(n.clone()), "one registration per nexus");
        }
        if let Some(res) = &r.res {
            assert!(kind::valid(res.kind));
            if kind::all_registrants(res.kind) {
                assert!(!r.regs.is_empty());
            } else {
                assert!(r.key_of(&res.holder).is_some(), "the holder is registered");
            }
        }
        // The two kinds never coexist.
        assert!(r.unit_holder().is_none() || r.regs.is_empty());
        // Nobody conflicts without a reservation; the holder never does.
        // Another nexus than an SPC-2 holder conflicts in everything but
        // the free commands.
        for i in 0..6 {
            let n = nx(i);
            match r.unit_holder() {
                Some(h) if *h != n => {
                    assert!(r.conflicts(&n, Access::Any));
                    assert!(!r.conflicts(&n, Access::Free));
                }
                _ => {
                    if r.res.is_none() || r.holds(&n) {
                        assert!(!r.conflicts(&n, Access::Write));
                    }
                }
            }
        }
    }

    #[test]
    fn spc2_reserve_and_release() {
        let mut r = Reservations::default();
        let (a, b) = (nx(0), nx(2));
        r.reserve_unit(&a, 0).unwrap();
        r.reserve_unit(&a, 0).unwrap(); // the holder again
        assert_eq!(r.reserve_unit(&b, 0), Err(PrError::Conflict));
        for access in [Access::Any, Access::Read, Access::Write] {
            assert!(r.conflicts(&b, access), "{access:?}");
            assert!(!r.conflicts(&a, access), "{access:?}");
        }
        assert!(!r.conflicts(&b, Access::Free));
        // Another's RELEASE does nothing.
        r.release_unit(&b).unwrap();
        assert_eq!(r.unit_holder(), Some(&a));
        r.release_unit(&a).unwrap();
        assert!(!r.conflicts(&b, Access::Write));
        r.reserve_unit(&b, 0).unwrap();
        // A reset ends a reservation taken before it, not one after.
        r.reset(1);
        assert_eq!(r.unit_holder(), None);
        r.reserve_unit(&b, 1).unwrap();
        r.reset(1);
        assert_eq!(r.unit_holder(), Some(&b));
        // So does the loss of the holder's nexus, not of another's.
        r.nexus_lost(&a);
        assert_eq!(r.unit_holder(), Some(&b));
        r.nexus_lost(&b);
        assert_eq!(r.unit_holder(), None);
        // An SPC-2 reservation refuses every persistent reservation
        // command, the holder's too (CRH=0: SPC-2's rules).
        r.reserve_unit(&a, 1).unwrap();
        assert!(r.conflicts(&a, Access::Persistent));
        assert!(r.conflicts(&b, Access::Persistent));
        r.release_unit(&a).unwrap();
        assert!(!r.conflicts(&a, Access::Persistent));
        // Registrations shut RESERVE and RELEASE out, whoever sends them.
        r.out(&a, action::REGISTER, 0, p(0, 7)).unwrap();
        for n in [&a, &b] {
            assert_eq!(r.reserve_unit(n, 1), Err(PrError::Conflict));
            assert_eq!(r.release_unit(n), Err(PrError::Conflict));
        }
        r.out(&a, action::RESERVE, kind::WRITE_EXCLUSIVE, p(7, 0))
            .unwrap();
        assert!(!r.conflicts(&b, Access::Persistent), "SPC-4's table");
        assert_eq!(r.reserve_unit(&a, 1), Err(PrError::Conflict));
        assert_eq!(r.unit_holder(), None);
    }

    proptest! {
        #[test]
        fn random_sequences_keep_the_invariants(
            ops in proptest::collection::vec(
                (0u8..6, 0u8..13, 0u8..10, 0u64..4, 0u64..4),
                1..60,
            )
        ) {
            let mut r = Reservations::default();
            for (who, sa, t, key, sa_key) in ops {
                let n = nx(who);
                let before = r.generation();
                // Past the persistent service actions: the SPC-2 ones,
                // and the events that end them.
                let free = r.regs.is_empty() && r.unit_holder().is_none_or(|h| *h == n);
                let res = match sa {
                    9 => r.reserve_unit(&n, key),
                    10 => r.release_unit(&n),
                    11 => {
                        r.nexus_lost(&n);
                        Ok(())
                    }
                    12 => {
                        r.reset(key);
                        Ok(())
                    }
                    // PERSISTENT RESERVE OUT, as the caller runs it.
                    _ if r.conflicts(&n, Access::Persistent) => Err(PrError::Conflict),
                    _ => r.out(&n, sa, t, p(key, sa_key)),
                };
                if sa == 9 {
                    prop_assert_eq!(res.is_ok(), free, "RESERVE only on a free unit");
                    if res.is_ok() {
                        prop_assert_eq!(r.unit_holder(), Some(&n));
                    }
                }
                if sa == 10 || sa == 11 {
                    prop_assert!(r.unit_holder() != Some(&n), "released");
                }
                if res.is_err() {
                    prop_assert_eq!(r.generation(), before, "a failed action counts nothing");
                }
                check_invariants(&r);
                for sa in 0..5 {
                    let _ = r.read(sa);
                }
            }
        }
    }
}

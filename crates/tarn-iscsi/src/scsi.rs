//! SCSI block commands (SPC-4, SBC-3) over a [`Device`].
//!
//! A command goes through two steps. [`parse`] reads the CDB and decides,
//! without touching the device's data, what the command is and how many
//! bytes of Data-Out it needs; the connection gathers those (immediate
//! data, unsolicited Data-Out, R2Ts). [`execute`] then runs it on a
//! blocking thread and yields the Data-In bytes or a sense.
//!
//! The logical block size is always 512 bytes; the device's own block
//! size is reported as the physical block (READ CAPACITY 16's exponent)
//! and as the optimal granularity in the Block Limits page, so an
//! initiator aligns its I/O to it. Every range is checked against the
//! capacity before the device is called; data-in is cut to the CDB's
//! allocation length.
//!
//! Thin provisioning is advertised (LBPME, LBPU, LBPWS, LBPWS10, LBPRZ):
//! UNMAP and WRITE SAME with the UNMAP bit call [`Device::trim`], WRITE
//! SAME of a zero block calls [`Device::write_zeroes`], and unmapped
//! blocks read as zeros. GET LBA STATUS reports [`Device::extents`].
//!
//! The write cache is reported enabled (WCE=1) because a write without
//! FUA is durable only at the next [`Device::flush`]: SYNCHRONIZE CACHE
//! calls it, and FUA on WRITE is passed down as `fua`.

use tarn_vol::{Device, ReadData, VolError};

use crate::digest::md5;
use crate::lu::LuState;
use crate::pr::{Access, Nexus, OutParams, PrError};

/// Logical block size reported to initiators.
pub const BLOCK: u64 = 512;

/// SCSI status codes.
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION (sense data follows).
    pub const CHECK_CONDITION: u8 = 0x02;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// A sense: key, additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// The INFORMATION field, when it is valid (for MISCOMPARE: the
    /// offset of the first byte that differs).
    pub info: Option<u32>,
    /// For INVALID FIELD IN CDB: the byte of the CDB at fault
    /// (sense-key specific field pointer).
    pub field: Option<u16>,
}

impl Sense {
    const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            field: None,
        }
    }

    /// INVALID FIELD IN CDB, pointing at CDB byte `byte`.
    pub fn invalid_cdb_byte(byte: u16) -> Sense {
        Sense {
            field: Some(byte),
            ..Sense::INVALID_FIELD_IN_CDB
        }
    }

    /// MISCOMPARE DURING VERIFY OPERATION at byte `offset` of the
    /// compared data.
    pub fn miscompare_at(offset: usize) -> Sense {
        Sense {
            info: Some(offset.min(u32::MAX as usize) as u32),
            ..Sense::MISCOMPARE
        }
    }

    /// NOT READY, LOGICAL UNIT NOT READY (cause not reportable): the
    /// volume is closed for the moment (a rollback or destroy under way).
    pub const NOT_READY: Sense = Sense::new(0x02, 0x04, 0x00);
    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: Sense = Sense::new(0x05, 0x20, 0x00);
    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(0x05, 0x21, 0x00);
    /// ILLEGAL REQUEST, INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(0x05, 0x24, 0x00);
    /// ILLEGAL REQUEST, INVALID FIELD IN INFORMATION UNIT: the transport's
    /// expected length does not fit the command (FCP-4's answer to a
    /// length the device server will not carry out).
    pub const INVALID_FIELD_IN_IU: Sense = Sense::new(0x05, 0x0e, 0x03);
    /// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED.
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(0x05, 0x25, 0x00);
    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH: Sense = Sense::new(0x05, 0x1a, 0x00);
    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAMETERS: Sense = Sense::new(0x05, 0x26, 0x00);
    /// ILLEGAL REQUEST, SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_NOT_SUPPORTED: Sense = Sense::new(0x05, 0x39, 0x00);
    /// DATA PROTECT, WRITE PROTECTED.
    pub const WRITE_PROTECTED: Sense = Sense::new(0x07, 0x27, 0x00);
    /// DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT.
    pub const NO_SPACE: Sense = Sense::new(0x07, 0x27, 0x07);
    /// MEDIUM ERROR, UNRECOVERED READ ERROR.
    pub const READ_ERROR: Sense = Sense::new(0x03, 0x11, 0x00);
    /// MEDIUM ERROR, WRITE ERROR.
    pub const WRITE_ERROR: Sense = Sense::new(0x03, 0x0c, 0x00);
    /// HARDWARE ERROR, INTERNAL TARGET FAILURE.
    pub const INTERNAL: Sense = Sense::new(0x04, 0x44, 0x00);
    /// ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR (iSCSI: data lost
    /// or damaged in transit).
    pub const PROTOCOL_CRC: Sense = Sense::new(0x0b, 0x47, 0x05);
    /// ILLEGAL REQUEST, INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE: Sense = Sense::new(0x05, 0x26, 0x04);
    /// ILLEGAL REQUEST, INSUFFICIENT REGISTRATION RESOURCES.
    pub const INSUFFICIENT_REGISTRATIONS: Sense = Sense::new(0x05, 0x55, 0x04);
    /// MISCOMPARE, MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE: Sense = Sense::new(0x0e, 0x1d, 0x00);
    /// UNIT ATTENTION, BUS DEVICE RESET FUNCTION OCCURRED: another
    /// nexus reset the unit (or the target), ending this nexus's tasks.
    pub const RESET_OCCURRED: Sense = Sense::new(0x06, 0x29, 0x03);
    /// UNIT ATTENTION, COMMANDS CLEARED BY ANOTHER INITIATOR (CLEAR TASK
    /// SET from another nexus).
    pub const COMMANDS_CLEARED: Sense = Sense::new(0x06, 0x2f, 0x00);
    /// UNIT ATTENTION, CAPACITY DATA HAS CHANGED (the volume was resized).
    pub const CAPACITY_CHANGED: Sense = Sense::new(0x06, 0x2a, 0x09);
    /// UNIT ATTENTION, RESERVATIONS PREEMPTED (another nexus cleared them).
    pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(0x06, 0x2a, 0x03);
    /// UNIT ATTENTION, RESERVATIONS RELEASED (a Registrants Only or All
    /// Registrants reservation was released).
    pub const RESERVATIONS_RELEASED: Sense = Sense::new(0x06, 0x2a, 0x04);
    /// UNIT ATTENTION, REGISTRATIONS PREEMPTED (this nexus's registration
    /// was removed by a PREEMPT).
    pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(0x06, 0x2a, 0x05);

    /// Fixed-format sense data (18 bytes).
    pub fn fixed(&self) -> Vec<u8> {
        let mut s = vec![0u8; 18];
        s[0] = 0x70;
        if let Some(i) = self.info {
            s[0] |= 0x80; // VALID
            s[3..7].copy_from_slice(&i.to_be_bytes());
        }
        s[2] = self.key;
        s[7] = 10;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(f) = self.field {
            s[15] = 0x80 | 0x40; // SKSV, C/D: a CDB field
            s[16..18].copy_from_slice(&f.to_be_bytes());
        }
        s
    }
}

/// Limits a logical unit advertises and enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest READ or WRITE, in bytes (a multiple of 512).
    pub max_transfer: u32,
}

/// A parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// Allocation length.
        alloc: u32,
        /// Descriptor format asked.
        desc: bool,
    },
    /// INQUIRY.
    Inquiry {
        /// Vital product data page asked (None: standard data).
        page: Option<u8>,
        /// Allocation length.
        alloc: u32,
    },
    /// READ CAPACITY (10).
    ReadCapacity10,
    /// READ CAPACITY (16).
    ReadCapacity16 {
        /// Allocation length.
        alloc: u32,
    },
    /// READ (6, 10, 12, 16).
    Read {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
    },
    /// WRITE (6, 10, 12, 16).
    Write {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
        /// Force unit access.
        fua: bool,
    },
    /// VERIFY (10, 12, 16).
    Verify {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
        /// Compare with the Data-Out bytes.
        bytchk: bool,
    },
    /// SYNCHRONIZE CACHE (10, 16).
    Sync {
        /// First block.
        lba: u64,
        /// Blocks (0: to the end).
        blocks: u32,
    },
    /// WRITE SAME (10, 16).
    WriteSame {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
        /// Deallocate if possible.
        unmap: bool,
        /// No data-out buffer: the block is zeros.
        ndob: bool,
    },
    /// UNMAP.
    Unmap {
        /// Parameter list length.
        len: u32,
    },
    /// GET LBA STATUS.
    GetLbaStatus {
        /// First block.
        lba: u64,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SENSE (6, 10).
    ModeSense {
        /// The 10-byte form.
        ten: bool,
        /// No block descriptors.
        dbd: bool,
        /// Page control (0 current, 1 changeable, 2 default).
        pc: u8,
        /// Page code.
        page: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// Allocation length.
        alloc: u32,
    },
    /// WRITE AND VERIFY (10, 12, 16): written durably, then read back.
    WriteVerify {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
        /// Compare what was read back with the Data-Out bytes.
        bytchk: bool,
    },
    /// PRE-FETCH (10, 16): checked, then nothing to do (no cache to
    /// fill).
    Prefetch {
        /// First block.
        lba: u64,
        /// Blocks.
        blocks: u32,
    },
    /// COMPARE AND WRITE: Data-Out is `blocks` blocks to compare with the
    /// medium, then `blocks` blocks to write if they match.
    CompareAndWrite {
        /// First block.
        lba: u64,
        /// Blocks (at most [`MAX_COMPARE_AND_WRITE`]).
        blocks: u32,
        /// Force unit access for the write.
        fua: bool,
    },
    /// PERSISTENT RESERVE IN.
    PrIn {
        /// Service action (0 to 3).
        sa: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE OUT.
    PrOut {
        /// Service action.
        sa: u8,
        /// Scope (high nibble) and type (low nibble).
        scope_type: u8,
        /// Parameter list length.
        len: u32,
    },
    /// RESERVE (6, 10): the SPC-2 reservation of the whole unit (see
    /// [`crate::pr`]).
    Reserve,
    /// RELEASE (6, 10): ends the sender's SPC-2 reservation.
    Release,
    /// REPORT SUPPORTED OPERATION CODES.
    ReportOpcodes {
        /// Command timeouts descriptors asked (RCTD).
        rctd: bool,
        /// Reporting options: 0 all commands, 1 one opcode, 2 one opcode
        /// and service action, 3 either.
        options: u8,
        /// The requested operation code.
        opcode: u8,
        /// The requested service action.
        sa: u16,
        /// Allocation length.
        alloc: u32,
    },
}

/// The LUN a 8-byte LUN field addresses (single-level peripheral or
/// flat addressing; anything else is reported as not LUN 0).
pub fn lun_of(f: [u8; 8]) -> u64 {
    if f[2..].iter().any(|&b| b != 0) {
        return u64::MAX;
    }
    match f[0] >> 6 {
        0 | 1 => ((f[0] as u64 & 0x3f) << 8) | f[1] as u64,
        _ => u64::MAX,
    }
}

fn be16(b: &[u8]) -> u32 {
    u16::from_be_bytes([b[0], b[1]]) as u32
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Reads a CDB addressed to `lun` (of 16 bytes; shorter CDBs are
/// zero-padded by the PDU).
pub fn parse(cdb: &[u8], lun: u64, lim: Limits) -> Result<Cmd, Sense> {
    let opc = cdb[0];
    // Commands every LUN answers.
    match opc {
        0x12 => {
            let evpd = cdb[1] & 1 != 0;
            if cdb[1] & 0xfe != 0 || (!evpd && cdb[2] != 0) {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            return Ok(Cmd::Inquiry {
                page: evpd.then_some(cdb[2]),
                alloc: be16(&cdb[3..]),
            });
        }
        0xa0 => {
            let alloc = be32(&cdb[6..]);
            if alloc < 16 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            return Ok(Cmd::ReportLuns { alloc });
        }
        0x03 => {
            return Ok(Cmd::RequestSense {
                alloc: cdb[4] as u32,
                desc: cdb[1] & 1 != 0,
            })
        }
        _ => {}
    }
    if lun != 0 {
        return Err(Sense::LUN_NOT_SUPPORTED);
    }
    let max_blocks = lim.max_transfer / BLOCK as u32;
    let rw = |lba: u64, blocks: u32, protect: u8| -> Result<(u64, u32), Sense> {
        if protect != 0 || blocks > max_blocks {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        Ok((lba, blocks))
    };
    // VERIFY and WRITE AND VERIFY 10/12/16 (`ops`): the range and BYTCHK
    // (0 or 1; 2 and 3 are not supported).
    let checked = |ops: [u8; 3]| -> Result<(u64, u32, bool), Sense> {
        let (lba, blocks) = if opc == ops[0] {
            (be32(&cdb[2..]) as u64, be16(&cdb[7..]))
        } else if opc == ops[1] {
            (be32(&cdb[2..]) as u64, be32(&cdb[6..]))
        } else {
            (be64(&cdb[2..]), be32(&cdb[10..]))
        };
        let bytchk = (cdb[1] >> 1) & 3;
        if bytchk > 1 {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        let (lba, blocks) = rw(lba, blocks, cdb[1] >> 5)?;
        Ok((lba, blocks, bytchk == 1))
    };
    let cmd = match opc {
        0x00 => Cmd::TestUnitReady,
        0x25 => Cmd::ReadCapacity10,
        0x9e if cdb[1] & 0x1f == 0x10 => Cmd::ReadCapacity16 {
            alloc: be32(&cdb[10..]),
        },
        0x9e if cdb[1] & 0x1f == 0x12 => Cmd::GetLbaStatus {
            lba: be64(&cdb[2..]),
            alloc: be32(&cdb[10..]),
        },
        0x08 | 0x0a => {
            let lba = (((cdb[1] & 0x1f) as u64) << 16) | be16(&cdb[2..]) as u64;
            let blocks = if cdb[4] == 0 { 256 } else { cdb[4] as u32 };
            let (lba, blocks) = rw(lba, blocks, 0)?;
            if opc == 0x08 {
                Cmd::Read { lba, blocks }
            } else {
                Cmd::Write {
                    lba,
                    blocks,
                    fua: false,
                }
            }
        }
        0x28 | 0x2a | 0xa8 | 0xaa | 0x88 | 0x8a => {
            let (lba, blocks) = match opc {
                0x28 | 0x2a => (be32(&cdb[2..]) as u64, be16(&cdb[7..])),
                0xa8 | 0xaa => (be32(&cdb[2..]) as u64, be32(&cdb[6..])),
                _ => (be64(&cdb[2..]), be32(&cdb[10..])),
            };
            let (lba, blocks) = rw(lba, blocks, cdb[1] >> 5)?;
            if matches!(opc, 0x28 | 0xa8 | 0x88) {
                Cmd::Read { lba, blocks }
            } else {
                Cmd::Write {
                    lba,
                    blocks,
                    fua: cdb[1] & 0x08 != 0,
                }
            }
        }
        0x2f | 0xaf | 0x8f => {
            let (lba, blocks, bytchk) = checked([0x2f, 0xaf, 0x8f])?;
            Cmd::Verify {
                lba,
                blocks,
                bytchk,
            }
        }
        0x35 => Cmd::Sync {
            lba: be32(&cdb[2..]) as u64,
            blocks: be16(&cdb[7..]),
        },
        0x91 => Cmd::Sync {
            lba: be64(&cdb[2..]),
            blocks: be32(&cdb[10..]),
        },
        0x41 | 0x93 => {
            let (lba, blocks) = if opc == 0x41 {
                (be32(&cdb[2..]) as u64, be16(&cdb[7..]))
            } else {
                (be64(&cdb[2..]), be32(&cdb[10..]))
            };
            let ndob = opc == 0x93 && cdb[1] & 1 != 0;
            // ANCHOR, PBDATA, LBDATA and protection are not supported;
            // zero blocks is refused (WSNZ is set in the block limits).
            if cdb[1] & 0xf6 != 0 || blocks == 0 || blocks > MAX_WRITE_SAME {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Cmd::WriteSame {
                lba,
                blocks,
                unmap: cdb[1] & 0x08 != 0,
                ndob,
            }
        }
        0x2e | 0xae | 0x8e => {
            let (lba, blocks, bytchk) = checked([0x2e, 0xae, 0x8e])?;
            Cmd::WriteVerify {
                lba,
                blocks,
                bytchk,
            }
        }
        0x34 => Cmd::Prefetch {
            lba: be32(&cdb[2..]) as u64,
            blocks: be16(&cdb[7..]),
        },
        0x90 => Cmd::Prefetch {
            lba: be64(&cdb[2..]),
            blocks: be32(&cdb[10..]),
        },
        0x89 => {
            let blocks = cdb[13] as u32;
            if cdb[1] >> 5 != 0 || blocks > MAX_COMPARE_AND_WRITE {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Cmd::CompareAndWrite {
                lba: be64(&cdb[2..]),
                blocks,
                fua: cdb[1] & 0x08 != 0,
            }
        }
        0x5e => {
            let sa = cdb[1] & 0x1f;
            if sa > 3 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Cmd::PrIn {
                sa,
                alloc: be16(&cdb[7..]),
            }
        }
        0x5f => {
            let sa = cdb[1] & 0x1f;
            // REGISTER AND MOVE (7) and anything above are not supported.
            if sa > 6 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Cmd::PrOut {
                sa,
                scope_type: cdb[2],
                len: be32(&cdb[5..]),
            }
        }
        // RESERVE and RELEASE: third-party and extent reservations
        // (SCSI-2's 3RDPTY, device ID and EXTENT bits of the 6-byte
        // forms, 3RDPTY and LONGID of the 10-byte ones) are not
        // supported, rather than taken as a reservation of the whole unit
        // for the sender.
        0x16 | 0x17 | 0x56 | 0x57 => {
            let unsupported = if opc & 0x40 == 0 { 0x1f } else { 0x12 };
            if cdb[1] & unsupported != 0 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            if opc & 1 == 0 {
                Cmd::Reserve
            } else {
                Cmd::Release
            }
        }
        0xa3 if cdb[1] & 0x1f == 0x0c => {
            let options = cdb[2] & 0x07;
            if options > 3 {
                return Err(Sense::invalid_cdb_byte(2));
            }
            Cmd::ReportOpcodes {
                rctd: cdb[2] & 0x80 != 0,
                options,
                opcode: cdb[3],
                sa: be16(&cdb[4..]) as u16,
                alloc: be32(&cdb[6..]),
            }
        }
        0x42 => {
            if cdb[1] & 1 != 0 {
                return Err(Sense::INVALID_FIELD_IN_CDB); // ANCHOR
            }
            Cmd::Unmap {
                len: be16(&cdb[7..]),
            }
        }
        0x1a | 0x5a => {
            let ten = opc == 0x5a;
            let subpage = cdb[3];
            let page = cdb[2] & 0x3f;
            if subpage != 0 && !(page == 0x3f && subpage == 0xff) {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            let pc = cdb[2] >> 6;
            if pc == 3 {
                return Err(Sense::SAVING_NOT_SUPPORTED);
            }
            Cmd::ModeSense {
                ten,
                dbd: cdb[1] & 0x08 != 0,
                pc,
                page,
                alloc: if ten { be16(&cdb[7..]) } else { cdb[4] as u32 },
            }
        }
        _ => return Err(Sense::INVALID_OPCODE),
    };
    Ok(cmd)
}

/// Most blocks one COMPARE AND WRITE may cover (advertised in the block
/// limits). Each holds every other write to the device off while it
/// runs (see [`crate::lu`]), so it is kept small; VMware's ATS uses one.
pub const MAX_COMPARE_AND_WRITE: u32 = 64;
/// Most blocks one WRITE SAME may cover (advertised in the block
/// limits): 2 GiB.
pub const MAX_WRITE_SAME: u32 = 1 << 22;
/// Most blocks one UNMAP may cover (advertised): 512 MiB.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// Most block descriptors in one UNMAP.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Largest PERSISTENT RESERVE OUT parameter list read (only the
/// 24-byte form is accepted).
const MAX_PR_PARAMS: u32 = 256;
/// Largest UNMAP parameter list accepted.
const MAX_UNMAP_PARAMS: u32 = 8 + 16 * MAX_UNMAP_DESCRIPTORS;

impl Cmd {
    /// Bytes of Data-Out the command takes.
    pub fn data_out_len(&self) -> u32 {
        match *self {
            Cmd::Write { blocks, .. } | Cmd::WriteVerify { blocks, .. } => blocks * BLOCK as u32,
            Cmd::CompareAndWrite { blocks, .. } => 2 * blocks * BLOCK as u32,
            Cmd::Verify {
                blocks,
                bytchk: true,
                ..
            } => blocks * BLOCK as u32,
            Cmd::WriteSame { ndob: false, .. } => BLOCK as u32,
            Cmd::Unmap { len } => len.min(MAX_UNMAP_PARAMS),
            Cmd::PrOut { len, .. } => len.min(MAX_PR_PARAMS),
            _ => 0,
        }
    }

    /// How the command touches the medium, for reservation checks
    /// (SPC-4 and SBC-3's tables of commands allowed under reservations).
    pub fn access(&self) -> Access {
        match self {
            Cmd::Read { .. }
            | Cmd::Verify { .. }
            | Cmd::GetLbaStatus { .. }
            | Cmd::Prefetch { .. } => Access::Read,
            Cmd::Write { .. }
            | Cmd::WriteSame { .. }
            | Cmd::Unmap { .. }
            | Cmd::WriteVerify { .. }
            | Cmd::CompareAndWrite { .. }
            | Cmd::Sync { .. } => Access::Write,
            Cmd::Inquiry { .. }
            | Cmd::ReportLuns { .. }
            | Cmd::RequestSense { .. }
            | Cmd::Release => Access::Free,
            Cmd::PrIn { .. } | Cmd::PrOut { .. } => Access::Persistent,
            _ => Access::Any,
        }
    }

    /// True for commands that change the medium (refused on a read-only
    /// target).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Cmd::Write { .. }
                | Cmd::WriteSame { .. }
                | Cmd::Unmap { .. }
                | Cmd::WriteVerify { .. }
                | Cmd::CompareAndWrite { .. }
        )
    }
}

/// What a logical unit needs to know of its target.
pub struct Unit<'a> {
    /// The device.
    pub dev: &'a dyn Device,
    /// Refuse writes.
    pub read_only: bool,
    /// The target's name (the SCSI name designator; the serial number and
    /// NAA too when the device has no identity of its own).
    pub name: &'a str,
    /// Advertised limits.
    pub limits: Limits,
    /// LUN addressed.
    pub lun: u64,
    /// The logical unit's shared state (the COMPARE AND WRITE lock,
    /// the reservations).
    pub lu: &'a LuState,
    /// The I_T nexus the command came from.
    pub nexus: &'a Nexus,
    /// The unit's reset epoch when the command was admitted
    /// ([`LuState::admit`]).
    pub epoch: u64,
}

impl Unit<'_> {
    fn blocks(&self) -> u64 {
        self.dev.size() / BLOCK
    }

    fn check(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(Sense::LBA_OUT_OF_RANGE),
        }
    }

    /// Physical block exponent: log2(device block / 512).
    fn phys_exp(&self) -> u8 {
        let bs = self.dev.block_size() as u64;
        if bs >= BLOCK && bs.is_power_of_two() {
            (bs / BLOCK).trailing_zeros().min(15) as u8
        } else {
            0
        }
    }

    /// What the logical unit's serial number and NAA derive from: the
    /// device's identity (a volume's guid), so that an initiator (ESXi
    /// keys datastores on the NAA) sees the same disk after the share is
    /// renamed and never takes another volume, shared later under this
    /// target's name, for the disk it knew; the target's name otherwise.
    fn identity(&self) -> Vec<u8> {
        match self.dev.identity() {
            Some(g) => [&b"guid"[..], &g.to_be_bytes()].concat(),
            None => self.name.as_bytes().to_vec(),
        }
    }

    fn serial(&self) -> String {
        md5(&[self.identity().as_slice()])[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

fn map_err(e: VolError, writing: bool) -> Sense {
    match e {
        VolError::OutOfRange(_) => Sense::LBA_OUT_OF_RANGE,
        VolError::ReadOnly(_) => Sense::WRITE_PROTECTED,
        VolError::NoSpace(_) | VolError::Quota(_) => Sense::NO_SPACE,
        VolError::Damaged(_) if writing => Sense::WRITE_ERROR,
        VolError::Damaged(_) => Sense::READ_ERROR,
        VolError::Invalid(_) => Sense::INVALID_FIELD_IN_CDB,
        VolError::Other(_) => Sense::INTERNAL,
    }
}

/// REQUEST SENSE's data for `s`: fixed format, or with `desc` the
/// descriptor format's header (no descriptors), cut to `alloc`.
pub fn sense_data(s: Sense, desc: bool, alloc: u32) -> Vec<u8> {
    let v = if desc {
        vec![0x72, s.key, s.asc, s.ascq, 0, 0, 0, 0]
    } else {
        s.fixed()
    };
    cut(v, alloc)
}

fn cut(mut v: Vec<u8>, alloc: u32) -> Vec<u8> {
    v.truncate(alloc as usize);
    v
}

/// Why a command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// CHECK CONDITION with this sense.
    #[error("check condition {0:?}")]
    Check(Sense),
    /// RESERVATION CONFLICT status.
    #[error("reservation conflict")]
    ReservationConflict,
    /// A reset ended the task before it changed the medium: it gets no
    /// response (its initiator learns of the reset from a unit
    /// attention).
    #[error("aborted by a reset")]
    Aborted,
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Failure {
        Failure::Check(s)
    }
}

impl From<PrError> for Failure {
    fn from(e: PrError) -> Failure {
        match e {
            PrError::Conflict => Failure::ReservationConflict,
            PrError::Check(s) => Failure::Check(s),
        }
    }
}

/// Runs a command with its Data-Out bytes for the I_T nexus `u.nexus`;
/// the Data-In bytes, or why it failed.
///
/// Commands that change the medium run with the logical unit's lock
/// held shared; COMPARE AND WRITE, PERSISTENT RESERVE OUT, RESERVE and
/// RELEASE with it held exclusively (see [`crate::lu`]). The
/// reservation check happens under that lock, so a write that passed it
/// finishes before any reservation change that would refuse it takes
/// effect.
///
/// The data a command returns comes as a [`ReadData`]: a READ's is the
/// ranges of the blocks that hold it (shared with the block cache), so
/// its Data-In PDUs are built from them with no copy of their own.
pub fn execute(u: &Unit<'_>, cmd: &Cmd, out: &[u8]) -> Result<ReadData, Failure> {
    let access = cmd.access();
    let _shared;
    let _exclusive;
    let reserving = matches!(cmd, Cmd::PrOut { .. } | Cmd::Reserve | Cmd::Release);
    if reserving || matches!(cmd, Cmd::CompareAndWrite { .. }) {
        _exclusive = u.lu.atomic();
    } else if access == Access::Write {
        _shared = u.lu.writing();
    }
    // A reset that came after this command was admitted ended it; under
    // the lock, a medium-changing command either saw no such reset or
    // does nothing (see the module docs of `crate::lu`). A reservation
    // change is held to the same rule: a RESERVE the reset ended must
    // not take the unit after the reset released it.
    if (access == Access::Write || reserving) && u.lu.stale(u.epoch) {
        return Err(Failure::Aborted);
    }
    // How an initiator learns that the volume grew: the first command
    // that finds a new size posts CAPACITY DATA HAS CHANGED to every
    // nexus (it is carried out itself; the attention comes with each
    // nexus's next command). Asked without waiting: during a resize a
    // later command notices.
    u.lu.saw_capacity(|| u.dev.try_size());
    // Checked before the reservation commands themselves: another
    // nexus's SPC-2 reservation refuses PERSISTENT RESERVE IN and OUT.
    if u.lu.reservations().conflicts(u.nexus, access) {
        return Err(Failure::ReservationConflict);
    }
    match *cmd {
        Cmd::Reserve => {
            u.lu.reservations().reserve_unit(u.nexus, u.epoch)?;
            return Ok(ReadData::default());
        }
        Cmd::Release => {
            u.lu.reservations().release_unit(u.nexus)?;
            return Ok(ReadData::default());
        }
        Cmd::PrIn { sa, alloc } => {
            return Ok(cut(u.lu.reservations().read(sa)?, alloc).into());
        }
        Cmd::PrOut {
            sa,
            scope_type,
            len,
        } => {
            let params = OutParams::parse(len, out)?;
            let told =
                u.lu.reservations()
                    .out_telling(u.nexus, sa, scope_type, params)?;
            u.lu.tell(told);
            return Ok(ReadData::default());
        }
        _ => {}
    }
    if let Cmd::Read { lba, blocks } = *cmd {
        u.check(lba, blocks as u64)?;
        if blocks == 0 {
            return Ok(ReadData::default());
        }
        return u
            .dev
            .read_data(lba * BLOCK, blocks * BLOCK as u32)
            .map_err(|e| map_err(e, false).into());
    }
    Ok(medium(u, cmd, out)?.into())
}

/// [`execute`] of a READ the device answers from memory
/// ([`Device::read_cached`]), on the connection's own thread: the same
/// checks in the same order, and None, at once, for any other command or
/// where answering would wait (the reservations held, a block not in
/// memory); the command then runs on a blocking thread.
pub fn execute_cached(u: &Unit<'_>, cmd: &Cmd) -> Option<Result<ReadData, Failure>> {
    let Cmd::Read { lba, blocks } = *cmd else {
        return None;
    };
    if blocks == 0 {
        return None;
    }
    // A reader that only ever hits the cache learns of a resize too.
    u.lu.saw_capacity(|| u.dev.try_size());
    if u.lu.try_reservations()?.conflicts(u.nexus, cmd.access()) {
        return Some(Err(Failure::ReservationConflict));
    }
    // The range is checked by the device's read, against its size under a
    // lock it only tries (`Unit::check` asks the size, which can wait for
    // a resize), and fails with the same sense.
    let Some(off) = lba.checked_mul(BLOCK) else {
        return Some(Err(Sense::LBA_OUT_OF_RANGE.into()));
    };
    let len = blocks.checked_mul(BLOCK as u32)?;
    let read = u.dev.read_cached(off, len)?;
    Some(read.map_err(|e| map_err(e, false).into()))
}

/// Carries out a command that is not a PERSISTENT RESERVE one, once
/// [`execute`] has taken the locks and checked the reservations.
fn medium(u: &Unit<'_>, cmd: &Cmd, out: &[u8]) -> Result<Vec<u8>, Sense> {
    if cmd.writes() && u.read_only {
        return Err(Sense::WRITE_PROTECTED);
    }
    let dev = u.dev;
    // A closed volume (rolled back, destroyed, its key unloaded) has no
    // size to report: a READ CAPACITY answered from it would tell an
    // initiator rescanning in that moment that the disk has one block.
    if matches!(
        cmd,
        Cmd::TestUnitReady | Cmd::ReadCapacity10 | Cmd::ReadCapacity16 { .. }
    ) && !dev.is_open()
    {
        return Err(Sense::NOT_READY);
    }
    match *cmd {
        Cmd::PrIn { .. } | Cmd::PrOut { .. } | Cmd::Reserve | Cmd::Release => {
            Err(Sense::INVALID_OPCODE)
        }
        Cmd::TestUnitReady => Ok(Vec::new()),
        Cmd::RequestSense { alloc, desc } => Ok(sense_data(Sense::new(0, 0, 0), desc, alloc)),
        Cmd::Inquiry { page, alloc } => Ok(cut(inquiry(u, page)?, alloc)),
        Cmd::ReportLuns { alloc } => {
            let mut v = vec![0u8; 16];
            v[3] = 8;
            Ok(cut(v, alloc))
        }
        Cmd::ReadCapacity10 => {
            let last = u.blocks().saturating_sub(1).min(u32::MAX as u64) as u32;
            let mut v = last.to_be_bytes().to_vec();
            v.extend_from_slice(&(BLOCK as u32).to_be_bytes());
            Ok(v)
        }
        Cmd::ReadCapacity16 { alloc } => {
            let mut v = vec![0u8; 32];
            v[..8].copy_from_slice(&u.blocks().saturating_sub(1).to_be_bytes());
            v[8..12].copy_from_slice(&(BLOCK as u32).to_be_bytes());
            v[13] = u.phys_exp();
            v[14] = 0x80 | 0x40; // LBPME, LBPRZ
            Ok(cut(v, alloc))
        }
        // Read by `execute`, as shared blocks.
        Cmd::Read { .. } => Err(Sense::INTERNAL),
        Cmd::Write { lba, blocks, fua } => {
            u.check(lba, blocks as u64)?;
            if blocks == 0 {
                return Ok(Vec::new());
            }
            let n = blocks as usize * BLOCK as usize;
            let Some(data) = out.get(..n) else {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            };
            dev.write(lba * BLOCK, data, fua)
                .map_err(|e| map_err(e, true))?;
            Ok(Vec::new())
        }
        Cmd::WriteVerify {
            lba,
            blocks,
            bytchk,
        } => {
            u.check(lba, blocks as u64)?;
            if blocks == 0 {
                return Ok(Vec::new());
            }
            let n = blocks as usize * BLOCK as usize;
            let Some(data) = out.get(..n) else {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            };
            // Written durably (on the medium, not just acknowledged),
            // then read back: the device checks its checksums on the way,
            // so a read that succeeds verifies the medium.
            dev.write(lba * BLOCK, data, true)
                .map_err(|e| map_err(e, true))?;
            let back = dev
                .read(lba * BLOCK, n as u32)
                .map_err(|e| map_err(e, false))?;
            if bytchk {
                if let Some(i) = first_difference(data, &back) {
                    return Err(Sense::miscompare_at(i));
                }
            }
            Ok(Vec::new())
        }
        Cmd::CompareAndWrite { lba, blocks, fua } => {
            u.check(lba, blocks as u64)?;
            if blocks == 0 {
                return Ok(Vec::new());
            }
            let n = blocks as usize * BLOCK as usize;
            let (Some(want), Some(new)) = (out.get(..n), out.get(n..2 * n)) else {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            };
            // The caller (execute) holds every other write to the
            // device off from here to the end of the write.
            let have = dev
                .read(lba * BLOCK, n as u32)
                .map_err(|e| map_err(e, false))?;
            if let Some(i) = first_difference(want, &have) {
                return Err(Sense::miscompare_at(i));
            }
            dev.write(lba * BLOCK, new, fua)
                .map_err(|e| map_err(e, true))?;
            Ok(Vec::new())
        }
        Cmd::Prefetch { lba, blocks } => {
            u.check(lba, blocks as u64)?;
            Ok(Vec::new())
        }
        Cmd::ReportOpcodes {
            rctd,
            options,
            opcode,
            sa,
            alloc,
        } => Ok(cut(report_opcodes(rctd, options, opcode, sa)?, alloc)),
        Cmd::Verify {
            lba,
            blocks,
            bytchk,
        } => {
            u.check(lba, blocks as u64)?;
            if blocks == 0 {
                return Ok(Vec::new());
            }
            let have = dev
                .read(lba * BLOCK, blocks * BLOCK as u32)
                .map_err(|e| map_err(e, false))?;
            if bytchk && out.get(..have.len()) != Some(&have[..]) {
                return Err(Sense::MISCOMPARE);
            }
            Ok(Vec::new())
        }
        Cmd::Sync { lba, blocks } => {
            let n = if blocks == 0 {
                u.blocks().saturating_sub(lba)
            } else {
                blocks as u64
            };
            u.check(lba, n)?;
            dev.flush().map_err(|e| map_err(e, true))?;
            Ok(Vec::new())
        }
        Cmd::WriteSame {
            lba,
            blocks,
            unmap,
            ndob,
        } => {
            u.check(lba, blocks as u64)?;
            let zero = [0u8; BLOCK as usize];
            let block = if ndob {
                &zero[..]
            } else {
                match out.get(..BLOCK as usize) {
                    Some(b) => b,
                    None => return Err(Sense::INVALID_FIELD_IN_CDB),
                }
            };
            let (off, len) = (lba * BLOCK, blocks as u64 * BLOCK);
            let r = if block.iter().all(|&b| b == 0) {
                if unmap {
                    dev.trim(off, len)
                } else {
                    dev.write_zeroes(off, len, false)
                }
            } else {
                write_pattern(dev, off, len, block)
            };
            r.map_err(|e| map_err(e, true))?;
            Ok(Vec::new())
        }
        Cmd::Unmap { len } => {
            unmap(u, len, out)?;
            Ok(Vec::new())
        }
        Cmd::GetLbaStatus { lba, alloc } => {
            // The size read once: a resize may change it meanwhile.
            let total = u.blocks();
            if lba >= total {
                return Err(Sense::LBA_OUT_OF_RANGE);
            }
            if alloc < 24 {
                return Ok(cut(vec![0, 0, 0, 4, 0, 0, 0, 0], alloc));
            }
            // One look at up to 1 GiB; the initiator asks again past it.
            let len = ((total - lba) * BLOCK).min(1 << 30);
            let ext = dev
                .extents(lba * BLOCK, len)
                .map_err(|e| map_err(e, false))?;
            let room = ((alloc - 8) / 16).max(1) as usize;
            let mut v = vec![0u8; 8];
            let mut at = lba;
            for e in ext.iter().take(room) {
                let n = e.len / BLOCK;
                let mut d = [0u8; 16];
                d[..8].copy_from_slice(&at.to_be_bytes());
                d[8..12].copy_from_slice(&(n.min(u32::MAX as u64) as u32).to_be_bytes());
                d[12] = if e.hole { 1 } else { 0 };
                v.extend_from_slice(&d);
                at += n;
            }
            let n = (v.len() - 4) as u32;
            v[..4].copy_from_slice(&n.to_be_bytes());
            Ok(cut(v, alloc))
        }
        Cmd::ModeSense {
            ten,
            dbd,
            pc,
            page,
            alloc,
        } => Ok(cut(mode_sense(u, ten, dbd, pc, page)?, alloc)),
    }
}

/// WRITE SAME of a non-zero block: the block repeated, 1 MiB at a time.
fn write_pattern(dev: &dyn Device, off: u64, len: u64, block: &[u8]) -> Result<(), VolError> {
    let chunk = len.min(1 << 20) as usize;
    let buf: Vec<u8> = block.iter().copied().cycle().take(chunk).collect();
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk as u64) as usize;
        dev.write(off + done, &buf[..n], false)?;
        done += n as u64;
    }
    Ok(())
}

/// Index of the first byte where `a` and `b` differ (None if equal).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

fn unmap(u: &Unit<'_>, len: u32, p: &[u8]) -> Result<(), Sense> {
    if len == 0 {
        return Ok(());
    }
    if len < 8 || p.len() < 8 {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let bd_len = be16(&p[2..]) as usize;
    let avail = p.len().min(len as usize) - 8;
    if bd_len > avail {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let descs: Vec<(u64, u64)> = p[8..8 + bd_len]
        .chunks_exact(16)
        .map(|d| (be64(d), be32(&d[8..]) as u64))
        .collect();
    if descs.len() > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
    }
    for &(lba, n) in &descs {
        u.check(lba, n)?;
        if n > MAX_UNMAP_BLOCKS as u64 {
            return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
        }
    }
    for (lba, n) in descs {
        if n > 0 {
            u.dev
                .trim(lba * BLOCK, n * BLOCK)
                .map_err(|e| map_err(e, true))?;
        }
    }
    Ok(())
}

/// The commands the device server carries out, as REPORT SUPPORTED
/// OPERATION CODES lists them: operation code, service action (for
/// commands that have one) and the CDB usage data (the CDB's bytes with
/// a one for every bit the device server looks at; its first byte is the
/// operation code and, for commands with a service action, the second
/// carries it). A unit test checks this list against [`parse`]: every
/// entry parses, every other operation code (and service action) is
/// INVALID COMMAND OPERATION CODE.
pub const COMMANDS: &[(u8, Option<u16>, &[u8])] = &[
    (0x00, None, &[0x00, 0, 0, 0, 0, 0]),
    (0x03, None, &[0x03, 0x01, 0, 0, 0xff, 0]),
    (0x08, None, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0]),
    (0x0a, None, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0]),
    (0x12, None, &[0x12, 0x01, 0xff, 0xff, 0xff, 0]),
    (0x16, None, &[0x16, 0x1f, 0, 0, 0, 0]),
    (0x17, None, &[0x17, 0x1f, 0, 0, 0, 0]),
    (0x1a, None, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0]),
    (0x25, None, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    (
        0x28,
        None,
        &[0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x2a,
        None,
        &[0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x2e,
        None,
        &[0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x2f,
        None,
        &[0x2f, 0x12, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x34,
        None,
        &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x35,
        None,
        &[0x35, 0, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (
        0x41,
        None,
        &[0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    ),
    (0x42, None, &[0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0]),
    (0x56, None, &[0x56, 0x12, 0, 0, 0, 0, 0, 0, 0, 0]),
    (0x57, None, &[0x57, 0x12, 0, 0, 0, 0, 0, 0, 0, 0]),
    (
        0x5a,
        None,
        &[0x5a, 0x08, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
    ),
    (0x5e, Some(0x00), PR_IN_USAGE[0]),
    (0x5e, Some(0x01), PR_IN_USAGE[1]),
    (0x5e, Some(0x02), PR_IN_USAGE[2]),
    (0x5e, Some(0x03), PR_IN_USAGE[3]),
    (0x5f, Some(0x00), PR_OUT_USAGE[0]),
    (0x5f, Some(0x01), PR_OUT_USAGE[1]),
    (0x5f, Some(0x02), PR_OUT_USAGE[2]),
    (0x5f, Some(0x03), PR_OUT_USAGE[3]),
    (0x5f, Some(0x04), PR_OUT_USAGE[4]),
    (0x5f, Some(0x05), PR_OUT_USAGE[5]),
    (0x5f, Some(0x06), PR_OUT_USAGE[6]),
    (0x88, None, &RW16[0]),
    (
        0x89,
        None,
        &[
            0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0, 0,
        ],
    ),
    (0x8a, None, &RW16[0x8a - 0x88]),
    (0x8e, None, &RW16[0x8e - 0x88]),
    (0x8f, None, &RW16[0x8f - 0x88]),
    (0x90, None, &RW16[0x90 - 0x88]),
    (0x91, None, &RW16[0x91 - 0x88]),
    (0x93, None, &RW16[0x93 - 0x88]),
    (
        0x9e,
        Some(0x10),
        &[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    (
        0x9e,
        Some(0x12),
        &[
            0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0,
        ],
    ),
    (
        0xa0,
        None,
        &[0xa0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    (
        0xa3,
        Some(0x0c),
        &[
            0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    (0xa8, None, &RW12[0]),
    (0xaa, None, &RW12[1]),
    (0xae, None, &RW12[2]),
    (0xaf, None, &RW12[3]),
];

/// CDB usage data of the 16-byte block commands, by operation code -
/// 0x88 (READ, WRITE, WRITE AND VERIFY, VERIFY, PRE-FETCH, SYNCHRONIZE
/// CACHE, WRITE SAME).
const RW16: [[u8; 16]; 12] = {
    let mut t = [[0u8; 16]; 12];
    let mut i = 0;
    while i < 12 {
        let mut c = [0xffu8; 16];
        c[0] = 0x88 + i as u8;
        c[1] = match i {
            0 | 2 => 0x18, // READ, WRITE: DPO, FUA
            6 | 7 => 0x12, // WRITE AND VERIFY, VERIFY: DPO, BYTCHK
            8 => 0x02,     // PRE-FETCH: IMMED
            11 => 0x09,    // WRITE SAME: UNMAP, NDOB
            _ => 0,
        };
        c[14] = 0;
        c[15] = 0;
        t[i] = c;
        i += 1;
    }
    t
};

/// CDB usage data of READ, WRITE, WRITE AND VERIFY and VERIFY (12).
const RW12: [[u8; 12]; 4] = {
    let ops = [0xa8u8, 0xaa, 0xae, 0xaf];
    let flags = [0x18u8, 0x18, 0x12, 0x12];
    let mut t = [[0u8; 12]; 4];
    let mut i = 0;
    while i < 4 {
        t[i] = [
            ops[i], flags[i], 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ];
        i += 1;
    }
    t
};

/// CDB usage data of PERSISTENT RESERVE IN, by service action.
const PR_IN_USAGE: [&[u8]; 4] = [
    &[0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    &[0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    &[0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    &[0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
];

/// CDB usage data of PERSISTENT RESERVE OUT, by service action.
const PR_OUT_USAGE: [&[u8]; 7] = [
    &[0x5f, 0x00, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x03, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x05, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    &[0x5f, 0x06, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
];

/// A command timeouts descriptor: length 0Ah, no timeouts given.
const TIMEOUTS: [u8; 12] = [0x00, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// REPORT SUPPORTED OPERATION CODES' parameter data.
fn report_opcodes(rctd: bool, options: u8, opcode: u8, sa: u16) -> Result<Vec<u8>, Sense> {
    if options == 0 {
        let mut v = vec![0u8; 4];
        for &(op, csa, usage) in COMMANDS {
            let mut d = [0u8; 8];
            d[0] = op;
            d[2..4].copy_from_slice(&csa.unwrap_or(0).to_be_bytes());
            d[5] = if csa.is_some() { 0x01 } else { 0 } | if rctd { 0x02 } else { 0 };
            d[6..8].copy_from_slice(&(usage.len() as u16).to_be_bytes());
            v.extend_from_slice(&d);
            if rctd {
                v.extend_from_slice(&TIMEOUTS);
            }
        }
        let n = (v.len() - 4) as u32;
        v[..4].copy_from_slice(&n.to_be_bytes());
        return Ok(v);
    }
    let has_sa = COMMANDS
        .iter()
        .any(|&(op, csa, _)| op == opcode && csa.is_some());
    // Option 1 names an operation code without service actions, option
    // 2 one with; option 3 either (the service action then counts only
    // for a command that has them, and must be zero otherwise).
    // The sense points at the REPORTING OPTIONS byte: without a pointer,
    // initiators take INVALID FIELD IN CDB from a MAINTENANCE IN command
    // for "REPORT SUPPORTED OPERATION CODES is not supported".
    let found = match options {
        1 if has_sa => return Err(Sense::invalid_cdb_byte(2)),
        2 if !has_sa => return Err(Sense::invalid_cdb_byte(2)),
        _ => COMMANDS.iter().find(|&&(op, csa, _)| {
            op == opcode
                && match csa {
                    Some(c) => c == sa,
                    None => options == 1 || sa == 0,
                }
        }),
    };
    let mut v = vec![0u8; 4];
    match found {
        Some(&(_, _, usage)) => {
            v[1] = 0x03 | if rctd { 0x80 } else { 0 }; // supported
            v[2..4].copy_from_slice(&(usage.len() as u16).to_be_bytes());
            v.extend_from_slice(usage);
            if rctd {
                v.extend_from_slice(&TIMEOUTS);
            }
        }
        None => v[1] = 0x01, // not supported
    }
    Ok(v)
}

fn inquiry(u: &Unit<'_>, page: Option<u8>) -> Result<Vec<u8>, Sense> {
    let periph: u8 = if u.lun == 0 { 0x00 } else { 0x7f };
    let Some(page) = page else {
        let mut v = vec![0u8; 66];
        v[0] = periph;
        v[2] = 0x06; // SPC-4
        v[3] = 0x12; // HISUP, response data format 2
        v[4] = (v.len() - 5) as u8;
        v[7] = 0x02; // CMDQUE
        v[8..16].copy_from_slice(b"TARN    ");
        v[16..32].copy_from_slice(b"tarn volume     ");
        v[32..36].copy_from_slice(b"0001");
        // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, d) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            v[58 + 2 * i..60 + 2 * i].copy_from_slice(&d.to_be_bytes());
        }
        return Ok(v);
    };
    if u.lun != 0 {
        return Err(Sense::LUN_NOT_SUPPORTED);
    }
    let body: Vec<u8> = match page {
        0x00 => vec![0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2],
        0x80 => u.serial().into_bytes(),
        0x83 => {
            let mut b = Vec::new();
            // NAA locally assigned (3), from the unit's identity.
            let h = md5(&[b"naa", u.identity().as_slice()]);
            let mut naa = [0u8; 8];
            naa.copy_from_slice(&h[..8]);
            naa[0] = 0x30 | (naa[0] & 0x0f);
            b.extend_from_slice(&[0x01, 0x03, 0x00, 8]);
            b.extend_from_slice(&naa);
            // T10 vendor identification.
            let t10 = format!("TARN    {}", u.serial());
            b.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
            b.extend_from_slice(t10.as_bytes());
            // SCSI name string of the target device (iSCSI).
            let mut name = u.name.as_bytes().to_vec();
            name.push(0);
            while !name.len().is_multiple_of(4) {
                name.push(0);
            }
            let name_len = name.len().min(252);
            b.extend_from_slice(&[0x53, 0xa8, 0x00, name_len as u8]);
            b.extend_from_slice(&name[..name_len]);
            b
        }
        0xb0 => {
            let mut b = vec![0u8; 0x3c];
            let gran = (u.dev.block_size() as u64 / BLOCK).clamp(1, 0xffff) as u16;
            let max = u.limits.max_transfer / BLOCK as u32;
            b[0] = 0x01; // WSNZ
            b[1] = MAX_COMPARE_AND_WRITE as u8;
            b[2..4].copy_from_slice(&gran.to_be_bytes());
            b[4..8].copy_from_slice(&max.to_be_bytes());
            b[8..12].copy_from_slice(&max.to_be_bytes());
            b[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
            b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
            b[24..28].copy_from_slice(&(gran as u32).to_be_bytes());
            b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes());
            b[32..40].copy_from_slice(&(MAX_WRITE_SAME as u64).to_be_bytes());
            b
        }
        0xb1 => {
            let mut b = vec![0u8; 0x3c];
            b[1] = 1; // non-rotating medium
            b
        }
        0xb2 => vec![0x00, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0x00],
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let mut v = vec![periph, page, 0, 0];
    v[2..4].copy_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(&body);
    Ok(v)
}

fn mode_sense(u: &Unit<'_>, ten: bool, dbd: bool, pc: u8, page: u8) -> Result<Vec<u8>, Sense> {
    let changeable = pc == 1;
    let caching = || {
        let mut p = vec![0u8; 20];
        p[0] = 0x08;
        p[1] = 0x12;
        if !changeable {
            p[2] = 0x04; // WCE
        }
        p
    };
    let control = || {
        let mut p = vec![0u8; 12];
        p[0] = 0x0a;
        p[1] = 0x0a;
        if !changeable {
            p[3] = 0x10; // unrestricted reordering
            p[8] = 0xff; // busy timeout: unlimited
            p[9] = 0xff;
        }
        p
    };
    let exceptions = || {
        let mut p = vec![0u8; 12];
        p[0] = 0x1c;
        p[1] = 0x0a;
        p
    };
    let pages = match page {
        0x08 => caching(),
        0x0a => control(),
        0x1c => exceptions(),
        0x3f => [caching(), control(), exceptions()].concat(),
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let mut bd = Vec::new();
    if !dbd {
        bd = vec![0u8; 8];
        let n = u.blocks().min(u32::MAX as u64) as u32;
        bd[..4].copy_from_slice(&n.to_be_bytes());
        bd[5..8].copy_from_slice(&(BLOCK as u32).to_be_bytes()[1..]);
    }
    let dsp = if u.read_only { 0x80 } else { 0 } | 0x10; // WP, DPOFUA
    let mut v = if ten {
        let mut h = vec![0u8; 8];
        h[3] = dsp;
        h[6..8].copy_from_slice(&(bd.len() as u16).to_be_bytes());
        h
    } else {
        vec![0, 0, dsp, bd.len() as u8]
    };
    v.extend_from_slice(&bd);
    v.extend_from_slice(&pages);
    if ten {
        let n = (v.len() - 2) as u16;
        v[..2].copy_from_slice(&n.to_be_bytes());
    } else {
        v[0] = (v.len() - 1) as u8;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    const LIM: Limits = Limits {
        max_transfer: 1 << 20,
    };

    fn cdb(b: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..b.len()].copy_from_slice(b);
        c
    }

    proptest::proptest! {
        /// A READ answered from memory gives what the usual path gives:
        /// the same bytes, or the same sense (past the end, an LBA whose
        /// byte offset overflows).
        #[test]
        fn a_read_from_memory_is_the_usual_read(
            lba in proptest::prop_oneof![0u64..2100, proptest::strategy::Just(u64::MAX / 512 + 1), proptest::strategy::Just(u64::MAX - 3)],
            blocks in 0u32..80,
        ) {
            let dev = MemDevice::new(1 << 20, 4096);
            let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
            dev.write(0, &data, false).unwrap();
            let nexus = Nexus::new("iqn.2024-01.x:i", [0; 6], "iqn.2024-01.x:d");
            let lu = LuState::default();
            let u = unit_of(&dev, &lu, &nexus, 0);
            let cmd = Cmd::Read { lba, blocks };
            let usual = execute(&u, &cmd, &[]).map(|d| d.to_vec());
            match execute_cached(&u, &cmd) {
                Some(r) => proptest::prop_assert_eq!(r.map(|d| d.to_vec()), usual),
                None => proptest::prop_assert_eq!(blocks, 0, "MemDevice answers every read"),
            }
        }
    }

    /// A writable unit of `dev` at LUN 0 for `nexus`, admitted in `epoch`.
    fn unit_of<'a>(dev: &'a MemDevice, lu: &'a LuState, nexus: &'a Nexus, epoch: u64) -> Unit<'a> {
        Unit {
            dev,
            read_only: false,
            name: "iqn.2024-01.x:d",
            limits: LIM,
            lun: 0,
            lu,
            nexus,
            epoch,
        }
    }

    /// A WRITE of block 0, and its data.
    fn block_zero_write() -> (Cmd, Vec<u8>) {
        let write = Cmd::Write {
            lba: 0,
            blocks: 1,
            fua: false,
        };
        (write, vec![0xab; BLOCK as usize])
    }

    #[test]
    fn a_write_admitted_before_a_reset_does_nothing() {
        let dev = MemDevice::new(1 << 20, 4096);
        let nexus = Nexus::new("iqn.2024-01.x:i", [0; 6], "iqn.2024-01.x:d");
        let lu = LuState::default();
        lu.attach(&nexus);
        let crate::lu::Admission::Run(before) = lu.admit(&nexus, true) else {
            panic!("nothing waits");
        };
        lu.reset(None, Sense::RESET_OCCURRED);
        let unit = |epoch| unit_of(&dev, &lu, &nexus, epoch);
        let (write, data) = block_zero_write();
        assert_eq!(
            execute(&unit(before), &write, &data).map(|_| ()),
            Err(Failure::Aborted)
        );
        assert_eq!(dev.contents()[..BLOCK as usize], [0u8; BLOCK as usize]);
        // Reads still run; a write admitted after the reset writes.
        let read = Cmd::Read { lba: 0, blocks: 1 };
        assert!(execute(&unit(before), &read, &[]).is_ok());
        let crate::lu::Admission::Attention(_) = lu.admit(&nexus, true) else {
            panic!("the reset is reported first");
        };
        let crate::lu::Admission::Run(after) = lu.admit(&nexus, true) else {
            panic!("then commands run");
        };
        execute(&unit(after), &write, &data).unwrap();
        assert_eq!(dev.contents()[..BLOCK as usize], data[..]);
    }

    #[test]
    fn an_spc2_reservation_shuts_other_nexuses_out() {
        let dev = MemDevice::new(1 << 20, 4096);
        let lu = LuState::default();
        let a = Nexus::new("iqn.2024-01.x:a", [0; 6], "iqn.2024-01.x:d");
        let b = Nexus::new("iqn.2024-01.x:b", [0; 6], "iqn.2024-01.x:d");
        let run = |n: &Nexus, epoch: u64, c: &[u8]| {
            let cmd = parse(&cdb(c), 0, LIM).map_err(Failure::Check)?;
            execute(&unit_of(&dev, &lu, n, epoch), &cmd, &[]).map(|_| ())
        };
        let conflict = Err(Failure::ReservationConflict);
        let (reserve6, release6) = ([0x16u8, 0, 0, 0, 0, 0], [0x17u8, 0, 0, 0, 0, 0]);
        let reserve10 = [0x56u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let release10 = [0x57u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mode_sense = [0x1a, 0, 0x3f, 0, 255, 0];
        let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let pr_in = [0x5e, 0, 0, 0, 0, 0, 0, 0, 255, 0];
        run(&a, 0, &reserve6).unwrap();
        run(&a, 0, &reserve10).unwrap();
        assert_eq!(run(&b, 0, &reserve6), conflict);
        assert_eq!(run(&b, 0, &reserve10), conflict);
        assert_eq!(run(&b, 0, &mode_sense), conflict);
        assert_eq!(run(&b, 0, &read), conflict);
        assert_eq!(run(&b, 0, &[0]), conflict, "TEST UNIT READY");
        assert_eq!(run(&b, 0, &pr_in), conflict);
        // What SPC-2 lets through: INQUIRY, REPORT LUNS, REQUEST SENSE
        // and a RELEASE (which does nothing).
        run(&b, 0, &[0x12, 0, 0, 0, 36, 0]).unwrap();
        run(&b, 0, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0]).unwrap();
        run(&b, 0, &[0x03, 0, 0, 0, 18, 0]).unwrap();
        run(&b, 0, &release6).unwrap();
        assert_eq!(run(&b, 0, &read), conflict, "still reserved");
        run(&a, 0, &mode_sense).unwrap();
        run(&a, 0, &read).unwrap();
        // So do writes, and the cached path.
        let (write, data) = block_zero_write();
        assert_eq!(
            execute(&unit_of(&dev, &lu, &b, 0), &write, &data).map(|_| ()),
            conflict
        );
        let read_cmd = Cmd::Read { lba: 0, blocks: 1 };
        assert_eq!(
            execute_cached(&unit_of(&dev, &lu, &b, 0), &read_cmd).map(|r| r.map(|_| ())),
            Some(conflict)
        );
        // Persistent reservation commands conflict for the holder too.
        assert_eq!(run(&a, 0, &pr_in), conflict);
        run(&a, 0, &release10).unwrap();
        run(&b, 0, &read).unwrap();
        run(&b, 0, &reserve6).unwrap();
        assert_eq!(run(&a, 0, &read), conflict);
        // A RESERVE admitted before a reset does nothing after it.
        run(&b, 0, &release6).unwrap();
        lu.reset(None, Sense::RESET_OCCURRED);
        assert_eq!(run(&a, 0, &reserve6), Err(Failure::Aborted));
        assert_eq!(lu.reservations().unit_holder(), None);
        // Third-party and extent reservations are not supported.
        for c in [
            &[0x56u8, 0x10, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[0x16, 0x10, 0, 0, 0, 0],
            &[0x16, 0x01, 0, 0, 0, 0],
        ] {
            assert_eq!(
                run(&a, 1, c),
                Err(Failure::Check(Sense::INVALID_FIELD_IN_CDB))
            );
        }
        assert_eq!(lu.reservations().unit_holder(), None);
        // With a registration, RESERVE and RELEASE conflict.
        let register = [0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0];
        let mut key = vec![0u8; 24];
        key[15] = 9;
        let cmd = parse(&cdb(&register), 0, LIM).unwrap();
        execute(&unit_of(&dev, &lu, &b, 1), &cmd, &key).unwrap();
        assert_eq!(run(&a, 1, &reserve6), conflict);
        assert_eq!(run(&b, 1, &release10), conflict);
    }

    fn run(dev: &MemDevice, ro: bool, c: &[u8], out: &[u8]) -> Result<Vec<u8>, Sense> {
        let (lu, nexus) = (
            LuState::default(),
            Nexus::new("iqn.2024-01.x:i", [0; 6], "iqn.2024-01.x:d"),
        );
        let u = Unit {
            read_only: ro,
            ..unit_of(dev, &lu, &nexus, 0)
        };
        let cmd = parse(&cdb(c), 0, LIM)?;
        execute(&u, &cmd, out)
            .map(|d| d.to_vec())
            .map_err(|f| match f {
                Failure::Check(s) => s,
                Failure::ReservationConflict => panic!("no reservations here"),
                Failure::Aborted => panic!("no resets here"),
            })
    }

    #[test]
    fn capacity_inquiry_and_mode_pages() {
        let dev = MemDevice::new(1 << 20, 4096);
        let v = run(&dev, false, &[0x25], &[]).unwrap();
        assert_eq!(be32(&v), 2047);
        assert_eq!(be32(&v[4..]), 512);
        let v = run(
            &dev,
            false,
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32],
            &[],
        )
        .unwrap();
        assert_eq!(be64(&v), 2047);
        assert_eq!(v[13], 3, "4096 = 8 x 512");
        assert_eq!(v[14] & 0x80, 0x80, "LBPME");
        let v = run(&dev, false, &[0x12, 0, 0, 0, 255], &[]).unwrap();
        assert_eq!(v.len(), 66);
        assert_eq!(&v[8..12], b"TARN");
        let v = run(&dev, false, &[0x12, 1, 0, 0, 255], &[]).unwrap();
        assert_eq!(&v[4..], &[0, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
        let v = run(&dev, false, &[0x12, 1, 0xb2, 0, 255], &[]).unwrap();
        assert_eq!(v[5] & 0xc0, 0xc0, "LBPU and LBPWS");
        assert_eq!(
            run(&dev, false, &[0x12, 1, 0x99, 0, 255], &[]),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        let v = run(&dev, false, &[0x1a, 0, 0x08, 0, 255], &[]).unwrap();
        assert_eq!(v[0] as usize, v.len() - 1);
        assert_eq!(v[3], 8);
        assert_eq!(v[4 + 8], 0x08);
        assert_eq!(v[4 + 8 + 2] & 0x04, 0x04, "WCE");
        let v = run(&dev, true, &[0x5a, 0x08, 0x3f, 0, 0, 0, 0, 1, 0], &[]).unwrap();
        assert_eq!(v[3] & 0x80, 0x80, "WP");
        assert_eq!(be16(&v) as usize, v.len() - 2);
        assert_eq!(run(&dev, false, &[0xff], &[]), Err(Sense::INVALID_OPCODE));
    }

    #[test]
    fn reads_writes_and_ranges() {
        let dev = MemDevice::new(1 << 20, 4096);
        let data: Vec<u8> = (0..1024).map(|i| i as u8).collect();
        run(&dev, false, &[0x2a, 0x08, 0, 0, 0, 4, 0, 0, 2], &data).unwrap();
        let v = run(&dev, false, &[0x28, 0, 0, 0, 0, 4, 0, 0, 2], &[]).unwrap();
        assert_eq!(v, data);
        let v = run(
            &dev,
            false,
            &[0x88, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 2],
            &[],
        )
        .unwrap();
        assert_eq!(v, data);
        assert_eq!(
            run(&dev, false, &[0x28, 0, 0, 0, 0x07, 0xff, 0, 0, 2], &[]),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            run(
                &dev,
                false,
                &[0x88, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1],
                &[]
            ),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            run(&dev, true, &[0x2a, 0, 0, 0, 0, 4, 0, 0, 2], &data),
            Err(Sense::WRITE_PROTECTED)
        );
        assert_eq!(
            run(&dev, false, &[0x28, 0x20, 0, 0, 0, 4, 0, 0, 2], &[]),
            Err(Sense::INVALID_FIELD_IN_CDB),
            "RDPROTECT"
        );
        let before = dev.flushes();
        run(&dev, false, &[0x35], &[]).unwrap();
        assert_eq!(dev.flushes(), before + 1);
    }

    #[test]
    fn write_same_and_unmap() {
        let dev = MemDevice::new(1 << 20, 4096);
        let pat = vec![0xabu8; 512];
        run(
            &dev,
            false,
            &[0x93, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16],
            &pat,
        )
        .unwrap();
        assert!(dev.contents()[..8192].iter().all(|&b| b == 0xab));
        let mut unmap = vec![0u8; 24];
        unmap[1] = 22;
        unmap[3] = 16;
        unmap[15] = 8;
        unmap[8..16].copy_from_slice(&0u64.to_be_bytes());
        unmap[16..20].copy_from_slice(&8u32.to_be_bytes());
        run(&dev, false, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24], &unmap).unwrap();
        assert!(dev.contents()[..4096].iter().all(|&b| b == 0));
        assert!(dev.contents()[4096..8192].iter().all(|&b| b == 0xab));
        let zero = vec![0u8; 512];
        run(
            &dev,
            false,
            &[0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 8],
            &zero,
        )
        .unwrap();
        assert!(dev.contents()[4096..8192].iter().all(|&b| b == 0));
        assert_eq!(
            run(
                &dev,
                false,
                &[0x93, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                &pat
            ),
            Err(Sense::INVALID_FIELD_IN_CDB),
            "zero blocks"
        );
    }

    #[test]
    fn lba_status_starts_at_the_requested_block() {
        // 4 KiB device blocks: 8 logical blocks each. Unmap the first
        // device block; a request at LBA 9 (inside the second, mapped
        // one) is answered with a first descriptor at LBA 9, as SBC
        // asks, not at the device block's start.
        let dev = MemDevice::new(1 << 20, 4096);
        let data = vec![0x41u8; 64 * 512];
        run(&dev, false, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 64], &data).unwrap();
        let mut unmap = vec![0u8; 24];
        unmap[1] = 22;
        unmap[3] = 16;
        unmap[16..20].copy_from_slice(&8u32.to_be_bytes());
        run(&dev, false, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24], &unmap).unwrap();
        let gls = |lba: u8| {
            run(
                &dev,
                false,
                &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, lba, 0, 0, 0, 255],
                &[],
            )
            .unwrap()
        };
        let v = gls(9);
        assert_eq!(be64(&v[8..]), 9);
        assert_eq!(v[8 + 12], 0, "mapped");
        assert_eq!(be32(&v[16..]), 64 - 9);
        let v = gls(3);
        assert_eq!(be64(&v[8..]), 3);
        assert_eq!((be32(&v[16..]), v[8 + 12]), (5, 1), "5 deallocated");
        assert_eq!(be64(&v[24..]), 8, "then mapped from LBA 8");
    }

    #[test]
    fn the_reported_commands_are_exactly_the_parsed_ones() {
        let parse_as = |op: u8, sa: Option<u16>| {
            let mut c = [0u8; 16];
            c[0] = op;
            if let Some(sa) = sa {
                c[1] = sa as u8;
            }
            // Lengths that make a valid command of every listed kind.
            c[4] = 36;
            c[8] = 1;
            c[9] = 16;
            c[13] = 1;
            parse(&c, 0, LIM)
        };
        for &(op, sa, usage) in COMMANDS {
            assert!(
                parse_as(op, sa).is_ok(),
                "{op:#04x}/{sa:?} is listed but not parsed: {:?}",
                parse_as(op, sa)
            );
            assert_eq!(usage[0], op);
            if let Some(sa) = sa {
                assert_eq!(usage[1] & 0x1f, sa as u8);
            }
        }
        for op in 0..=255u8 {
            let listed: Vec<Option<u16>> =
                COMMANDS.iter().filter(|c| c.0 == op).map(|c| c.1).collect();
            if listed.is_empty() {
                assert_eq!(
                    parse_as(op, None),
                    Err(Sense::INVALID_OPCODE),
                    "{op:#04x} parses but is not listed"
                );
            } else if listed.iter().any(|s| s.is_some()) {
                for sa in 0..32u16 {
                    if !listed.contains(&Some(sa)) {
                        assert!(parse_as(op, Some(sa)).is_err(), "{op:#04x}/{sa:#x}");
                    }
                }
            }
        }
    }

    #[test]
    fn report_supported_operation_codes() {
        let dev = MemDevice::new(1 << 20, 4096);
        let rsoc = |opts: u8, op: u8, sa: u16| {
            let s = sa.to_be_bytes();
            run(
                &dev,
                false,
                &[0xa3, 0x0c, opts, op, s[0], s[1], 0, 0, 0xff, 0xff, 0, 0],
                &[],
            )
        };
        let all = rsoc(0, 0, 0).unwrap();
        assert_eq!(be32(&all) as usize, all.len() - 4);
        assert_eq!(all.len(), 4 + 8 * COMMANDS.len());
        let with_timeouts = rsoc(0x80, 0, 0).unwrap();
        assert_eq!(with_timeouts.len(), 4 + 20 * COMMANDS.len());
        assert_eq!(with_timeouts[4 + 5] & 0x02, 0x02, "CTDP");
        // READ(10), one command.
        let one = rsoc(1, 0x28, 0).unwrap();
        assert_eq!(one[1] & 0x07, 0x03, "supported");
        assert_eq!(be16(&one[2..]), 10);
        assert_eq!(one[4], 0x28);
        // READ CAPACITY(16) has a service action: option 1 is refused,
        // option 2 answers.
        assert_eq!(rsoc(1, 0x9e, 0x10), Err(Sense::invalid_cdb_byte(2)));
        assert_eq!(rsoc(2, 0x28, 0), Err(Sense::invalid_cdb_byte(2)));
        let f = Sense::invalid_cdb_byte(2).fixed();
        assert_eq!((f[15], f[16], f[17]), (0xc0, 0, 2), "SKSV, CDB, byte 2");
        let one = rsoc(2, 0x9e, 0x10).unwrap();
        assert_eq!((one[1] & 7, one[4], one[5]), (3, 0x9e, 0x10));
        // Unsupported: SUPPORT 001b.
        assert_eq!(rsoc(1, 0xd9, 0).unwrap()[1] & 7, 1);
        assert_eq!(rsoc(2, 0x9e, 0x11).unwrap()[1] & 7, 1);
        assert_eq!(rsoc(7, 0, 0), Err(Sense::invalid_cdb_byte(2)));
    }

    #[test]
    fn compare_and_write_compares_then_writes() {
        let dev = MemDevice::new(1 << 20, 4096);
        let old = vec![b'A'; 1024];
        run(&dev, false, &[0x2a, 0, 0, 0, 0, 4, 0, 0, 2], &old).unwrap();
        let caw = |n: u8, out: &[u8]| {
            run(
                &dev,
                false,
                &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, n],
                out,
            )
        };
        let mut out = old.clone();
        out.extend_from_slice(&[b'B'; 1024]);
        caw(2, &out).unwrap();
        assert_eq!(dev.read(4 * 512, 1024).unwrap(), vec![b'B'; 1024]);
        // Now the medium holds B: comparing with A fails at byte 0, and
        // with a single difference at byte 700 reports that offset.
        let e = caw(2, &out).unwrap_err();
        assert_eq!((e.key, e.asc, e.info), (0x0e, 0x1d, Some(0)));
        let mut out = vec![b'B'; 1024];
        out[700] = b'x';
        out.extend_from_slice(&[b'C'; 1024]);
        let e = caw(2, &out).unwrap_err();
        assert_eq!(e.info, Some(700));
        let f = e.fixed();
        assert_eq!(f[0], 0xf0, "VALID, current, fixed");
        assert_eq!(be32(&f[3..]), 700);
        assert_eq!(
            dev.read(4 * 512, 1024).unwrap(),
            vec![b'B'; 1024],
            "unchanged"
        );
        assert_eq!(
            caw(MAX_COMPARE_AND_WRITE as u8 + 1, &[]),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(
            run(
                &dev,
                true,
                &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1],
                &out
            ),
            Err(Sense::WRITE_PROTECTED)
        );
        let v = run(&dev, false, &[0x12, 1, 0xb0, 0, 255], &[]).unwrap();
        assert_eq!(v[5] as u32, MAX_COMPARE_AND_WRITE);
    }

    #[test]
    fn write_and_verify_and_prefetch() {
        let dev = MemDevice::new(1 << 20, 4096);
        let data: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        for c in [
            &[0x2e, 0x02, 0, 0, 0, 8, 0, 0, 2, 0][..],
            &[0xae, 0x00, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0],
            &[0x8e, 0x02, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0],
        ] {
            dev.trim(0, 1 << 20).unwrap();
            run(&dev, false, c, &data).unwrap();
            assert_eq!(dev.read(8 * 512, 1024).unwrap(), data);
        }
        assert_eq!(
            run(&dev, false, &[0x2e, 0x04, 0, 0, 0, 8, 0, 0, 2, 0], &data),
            Err(Sense::INVALID_FIELD_IN_CDB),
            "BYTCHK 2"
        );
        assert_eq!(
            run(&dev, false, &[0x2e, 0, 0, 0, 0x07, 0xff, 0, 0, 2, 0], &data),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            run(&dev, true, &[0x2e, 0, 0, 0, 0, 8, 0, 0, 2, 0], &data),
            Err(Sense::WRITE_PROTECTED)
        );
        run(&dev, false, &[0x34, 0x02, 0, 0, 0, 0, 0, 0, 8, 0], &[]).unwrap();
        run(
            &dev,
            false,
            &[0x90, 0, 0, 0, 0, 0, 0, 0, 0x07, 0xff, 0, 0, 0, 1, 0, 0],
            &[],
        )
        .unwrap();
        assert_eq!(
            run(
                &dev,
                false,
                &[0x90, 0, 0, 0, 0, 0, 0, 0, 0x07, 0xff, 0, 0, 0, 2, 0, 0],
                &[]
            ),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
    }

    #[test]
    fn other_luns_are_not_supported() {
        let c = cdb(&[0x00]);
        assert_eq!(parse(&c, 1, LIM), Err(Sense::LUN_NOT_SUPPORTED));
        assert!(parse(&cdb(&[0x12, 0, 0, 0, 36]), 1, LIM).is_ok());
        assert_eq!(lun_of([0, 0, 0, 0, 0, 0, 0, 0]), 0);
        assert_eq!(lun_of([0, 1, 0, 0, 0, 0, 0, 0]), 1);
        assert_eq!(lun_of([0x40, 0, 0, 0, 0, 0, 0, 0]), 0);
        assert_eq!(lun_of([0, 0, 1, 0, 0, 0, 0, 0]), u64::MAX);
    }
}

//! A small blocking iSCSI initiator (no CHAP, 512-byte logical blocks)
//! for tests that must write through the daemon command by command and
//! see each acknowledgement, as the NBD client in `nbd.rs` does; writes
//! and flushes can also be pipelined (`start_write`, `start_flush`,
//! `next_done`). libiscsi's programs test the protocol; this one only
//! needs to be simple enough to trust.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use tarn_iscsi::pdu::{self, op, Digests, Pdu};
use tarn_iscsi::text;

const SECTOR: u64 = 512;
const OUR_MAX_SEGMENT: u32 = 256 << 10;

/// One session with a target's LUN 0.
pub struct Iscsi {
    s: TcpStream,
    cmd_sn: u32,
    itt: u32,
    /// Largest data segment the target takes.
    max_segment: usize,
    /// Bytes a write may carry as immediate data.
    first_burst: usize,
    immediate: bool,
    /// The LUN's size in bytes.
    pub size: u64,
    /// Commands sent and not finished: their write data (for R2Ts) and
    /// the data read so far.
    open: std::collections::HashMap<u32, (Vec<u8>, Vec<u8>)>,
}

fn io_err(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::other(msg.into())
}

impl Iscsi {
    /// Logs in to target `iqn` at `addr` and reads the LUN's capacity.
    pub fn open(addr: &str, iqn: &str) -> std::io::Result<Iscsi> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut c = Iscsi {
            s,
            cmd_sn: 1,
            itt: 1,
            max_segment: 8192,
            first_burst: 0,
            immediate: false,
            size: 0,
            open: Default::default(),
        };
        let keys: Vec<(String, String)> = [
            ("InitiatorName", "iqn.2026-11.org.tarn:test-initiator"),
            ("TargetName", iqn),
            ("SessionType", "Normal"),
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "Yes"),
            ("FirstBurstLength", "262144"),
            ("MaxBurstLength", "1048576"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut login = Pdu::new(op::LOGIN);
        login.set_immediate(true);
        // Transit from the operational stage (1) to the full feature
        // phase (3).
        login.set_flags(0x80 | (1 << 2) | 3);
        // An ISID of its own per session, as an initiator gives each: a
        // login with the ISID of a session still in would reinstate
        // (close) that one.
        static NEXT_ISID: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
        let n = NEXT_ISID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let [hi, lo] = n.to_be_bytes();
        login.bhs[8..14].copy_from_slice(&[0x80, 0, 0, 0x7a, hi, lo]);
        login.set_itt(0);
        login.set_u32(24, c.cmd_sn);
        login.data = text::encode(&keys);
        c.send(&login)?;
        let rsp = c.recv()?;
        if rsp.opcode() != op::LOGIN_RSP || rsp.u16_at(36) != 0 {
            return Err(io_err(format!(
                "login refused: status {:#06x}",
                rsp.u16_at(36)
            )));
        }
        if rsp.flags() & 0x83 != 0x83 {
            return Err(io_err("login did not reach the full feature phase"));
        }
        let answer = text::parse(&rsp.data).map_err(|e| io_err(e.0))?;
        let get = |k: &str| answer.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if let Some(v) = get("MaxRecvDataSegmentLength") {
            c.max_segment = v
                .parse()
                .map_err(|_| io_err("bad MaxRecvDataSegmentLength"))?;
        }
        c.immediate = get("ImmediateData").as_deref() != Some("No");
        c.first_burst = get("FirstBurstLength")
            .and_then(|v| v.parse().ok())
            .unwrap_or(65536);
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let cap = c.command(&cdb, 32, None)?;
        if cap.len() < 12 {
            return Err(io_err("short READ CAPACITY data"));
        }
        let last = u64::from_be_bytes(cap[..8].try_into().unwrap_or_default());
        let block = u32::from_be_bytes(cap[8..12].try_into().unwrap_or_default());
        if u64::from(block) != SECTOR {
            return Err(io_err(format!("logical block of {block} bytes")));
        }
        c.size = (last + 1) * SECTOR;
        Ok(c)
    }

    fn send(&mut self, p: &Pdu) -> std::io::Result<()> {
        self.s.write_all(&p.encode(Digests::default()))
    }

    fn recv(&mut self) -> std::io::Result<Pdu> {
        let mut bhs = [0u8; pdu::BHS_LEN];
        self.s.read_exact(&mut bhs)?;
        let f = pdu::framing(&bhs, 1 << 24).map_err(|e| io_err(e.to_string()))?;
        let mut all = bhs.to_vec();
        all.resize(pdu::BHS_LEN + f.ahs_len + pdu::padded(f.data_len), 0);
        self.s.read_exact(&mut all[pdu::BHS_LEN..])?;
        match pdu::decode(&all, Digests::default(), 1 << 24) {
            Ok(Some((p, _))) => Ok(p),
            Ok(None) => Err(io_err("incomplete PDU")),
            Err(e) => Err(io_err(e.to_string())),
        }
    }

    /// Sends a command without waiting for it: `out` is its write data
    /// (kept for the target's R2Ts), `expect` the bytes it reads; returns
    /// its ITT.
    fn send_cmd(
        &mut self,
        cdb: &[u8; 16],
        expect: u32,
        out: Option<Vec<u8>>,
    ) -> std::io::Result<u32> {
        let itt = self.itt;
        self.itt = self.itt.wrapping_add(1);
        let mut cmd = Pdu::new(op::SCSI_CMD);
        let mut flags = 0x01; // simple task attribute
        let edtl = match &out {
            Some(d) => {
                flags |= 0x20;
                d.len() as u32
            }
            None => {
                if expect > 0 {
                    flags |= 0x40;
                }
                expect
            }
        };
        let data = out.unwrap_or_default();
        let immediate = if self.immediate {
            data.len().min(self.first_burst).min(self.max_segment)
        } else {
            0
        };
        // F: no unsolicited Data-Out follows (InitialR2T=Yes).
        cmd.set_flags(flags | 0x80);
        cmd.set_itt(itt);
        cmd.set_u32(20, edtl);
        cmd.set_u32(24, self.cmd_sn);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        cmd.bhs[32..48].copy_from_slice(cdb);
        cmd.data = data[..immediate].to_vec();
        self.send(&cmd)?;
        self.open.insert(itt, (data, Vec::new()));
        Ok(itt)
    }

    /// Waits for the next command to finish, answering R2Ts meanwhile;
    /// returns its ITT and the data it read (or why it failed).
    pub fn next_done(&mut self) -> std::io::Result<(u32, std::io::Result<Vec<u8>>)> {
        loop {
            let p = self.recv()?;
            let itt = p.itt();
            match p.opcode() {
                op::R2T => {
                    let ttt = p.u32_at(20);
                    let offset = p.u32_at(40) as usize;
                    let want = p.u32_at(44) as usize;
                    let data = self
                        .open
                        .get(&itt)
                        .map(|(d, _)| d.clone())
                        .ok_or_else(|| io_err("R2T for no command"))?;
                    let end = offset
                        .checked_add(want)
                        .filter(|&e| e <= data.len())
                        .ok_or_else(|| io_err("R2T past the data"))?;
                    let mut at = offset;
                    let mut sn = 0;
                    while at < end {
                        let n = (end - at).min(self.max_segment);
                        let mut d = Pdu::new(op::DATA_OUT);
                        d.set_flags(if at + n == end { 0x80 } else { 0 });
                        d.set_itt(itt);
                        d.set_u32(20, ttt);
                        d.set_u32(36, sn);
                        d.set_u32(40, at as u32);
                        d.data = data[at..at + n].to_vec();
                        self.send(&d)?;
                        at += n;
                        sn += 1;
                    }
                }
                op::DATA_IN => {
                    let (_, read) = self
                        .open
                        .get_mut(&itt)
                        .ok_or_else(|| io_err("Data-In for no command"))?;
                    let offset = p.u32_at(40) as usize;
                    if read.len() < offset + p.data.len() {
                        read.resize(offset + p.data.len(), 0);
                    }
                    read[offset..offset + p.data.len()].copy_from_slice(&p.data);
                    // S: the status comes with the last Data-In.
                    if p.flags() & 0x01 != 0 {
                        let (_, read) = self.open.remove(&itt).unwrap_or_default();
                        return Ok((itt, status(p.bhs[3]).map(|()| read)));
                    }
                }
                op::SCSI_RSP => {
                    let (_, read) = self.open.remove(&itt).unwrap_or_default();
                    if p.bhs[2] != 0 {
                        return Ok((itt, Err(io_err(format!("response {:#04x}", p.bhs[2])))));
                    }
                    return Ok((itt, sensed(p.bhs[3], &p.data).map(|()| read)));
                }
                op::NOP_IN | op::ASYNC => {}
                other => return Err(io_err(format!("unexpected opcode {other:#04x}"))),
            }
        }
    }

    /// Runs one command alone; returns the data read. Anything but GOOD
    /// is an error.
    fn command(
        &mut self,
        cdb: &[u8; 16],
        expect: u32,
        out: Option<&[u8]>,
    ) -> std::io::Result<Vec<u8>> {
        let itt = self.send_cmd(cdb, expect, out.map(<[u8]>::to_vec))?;
        loop {
            let (done, r) = self.next_done()?;
            if done == itt {
                return r;
            }
        }
    }

    /// Sends a WRITE(16) of `data` (whole sectors) at byte `off` without
    /// waiting; returns its ITT (see [`Iscsi::next_done`]).
    pub fn start_write(&mut self, off: u64, data: Vec<u8>, fua: bool) -> std::io::Result<u32> {
        let cdb = write16(off, data.len(), fua);
        self.send_cmd(&cdb, 0, Some(data))
    }

    /// Sends a SYNCHRONIZE CACHE (16) without waiting; returns its ITT.
    pub fn start_flush(&mut self) -> std::io::Result<u32> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x91;
        self.send_cmd(&cdb, 0, None)
    }

    /// Writes `data` (whole sectors) at byte `off`, with FUA if asked.
    pub fn write(&mut self, off: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        self.command(&write16(off, data.len(), fua), 0, Some(data))
            .map(|_| ())
    }

    /// Reads `len` bytes (whole sectors) at byte `off`.
    pub fn read(&mut self, off: u64, len: u32) -> std::io::Result<Vec<u8>> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        let mut out = Vec::with_capacity(len as usize);
        // In pieces the target's transfer limit allows.
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(1 << 20);
            cdb[2..10].copy_from_slice(&((off + u64::from(at)) / SECTOR).to_be_bytes());
            cdb[10..14].copy_from_slice(&(n / SECTOR as u32).to_be_bytes());
            let got = self.command(&cdb, n, None)?;
            if got.len() != n as usize {
                return Err(io_err(format!("read {} of {n} bytes", got.len())));
            }
            out.extend_from_slice(&got);
            at += n;
        }
        Ok(out)
    }

    /// SYNCHRONIZE CACHE (16) of the whole LUN.
    pub fn flush(&mut self) -> std::io::Result<()> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x91;
        self.command(&cdb, 0, None).map(|_| ())
    }

    /// Logs out.
    pub fn close(mut self) {
        let mut p = Pdu::new(op::LOGOUT);
        p.set_immediate(true);
        p.set_flags(0x80);
        p.set_itt(self.itt);
        p.set_u32(24, self.cmd_sn);
        let _ = self.send(&p);
        let _ = self.recv();
    }
}

/// The CDB of a WRITE(16) of `len` bytes at byte `off`.
fn write16(off: u64, len: usize, fua: bool) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    if fua {
        cdb[1] = 0x08;
    }
    cdb[2..10].copy_from_slice(&(off / SECTOR).to_be_bytes());
    cdb[10..14].copy_from_slice(&((len as u64 / SECTOR) as u32).to_be_bytes());
    cdb
}

/// [`status`], with a CHECK CONDITION's sense key, ASC and ASCQ (from
/// the response's fixed-format sense) in the error, as `sense 06/2a/09`.
fn sensed(s: u8, data: &[u8]) -> std::io::Result<()> {
    match data.get(2..2 + 14) {
        Some(f) if s == 2 => Err(io_err(format!(
            "SCSI status {s:#04x}, sense {:02x}/{:02x}/{:02x}",
            f[2] & 0x0f,
            f[12],
            f[13]
        ))),
        _ => status(s),
    }
}

fn status(s: u8) -> std::io::Result<()> {
    if s == 0 {
        Ok(())
    } else {
        Err(io_err(format!("SCSI status {s:#04x}")))
    }
}

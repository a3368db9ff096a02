//! Shared test support: a server over in-memory devices on 127.0.0.1,
//! libiscsi URLs, and a small blocking initiator that sends exactly the
//! PDUs a test wants.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tarn_iscsi::pdu::{self, op, Digests, Pdu};
use tarn_iscsi::{text, IscsiConfig, IscsiServer, IscsiTarget, Running};
use tarn_vol::testing::MemDevice;

pub const MIB: u64 = 1 << 20;
pub const IQN: &str = "iqn.2024-01.org.tarn:disk";

/// A server on 127.0.0.1, any free port, with `cfg`'s other settings.
pub fn start_with(cfg: IscsiConfig, targets: Vec<IscsiTarget>) -> Running {
    let cfg = IscsiConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..cfg
    };
    IscsiServer::start(cfg, targets).expect("server starts")
}

/// A server with the default settings.
pub fn start(targets: Vec<IscsiTarget>) -> Running {
    start_with(IscsiConfig::default(), targets)
}

pub fn mem(size: u64, block: u32) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(size, block))
}

/// `iscsi://127.0.0.1:PORT/IQN/0`.
pub fn url(r: &Running, iqn: &str) -> String {
    format!("iscsi://127.0.0.1:{}/{iqn}/0", r.local_addr().port())
}

/// Runs a program; returns (success, stdout, stderr).
pub fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a program that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let (good, out, err) = run(args);
    assert!(good, "{} failed:\n{out}\n{err}", args.join(" "));
    out
}

/// What [`Raw::next`] found.
pub enum Next {
    /// A PDU.
    Pdu(Pdu),
    /// End of file, a reset, or bytes that are no PDU.
    Closed,
    /// Nothing within the read timeout.
    Timeout,
}

/// A blocking initiator over TCP.
pub struct Raw {
    pub s: TcpStream,
    pub digests: Digests,
    pub cmd_sn: u32,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw {
            s,
            digests: Digests::default(),
            cmd_sn: 1,
        }
    }

    pub fn send_bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b)
    }

    pub fn send(&mut self, p: &Pdu) {
        let b = p.encode(self.digests);
        self.s.write_all(&b).expect("send");
    }

    /// The next PDU, or None when the server closed the connection (or
    /// nothing came within the read timeout).
    pub fn recv(&mut self) -> Option<Pdu> {
        match self.next() {
            Next::Pdu(p) => Some(p),
            Next::Closed | Next::Timeout => None,
        }
    }

    /// The next PDU, or whether the connection was closed or stayed
    /// silent for the read timeout.
    pub fn next(&mut self) -> Next {
        let mut bhs = [0u8; 48];
        if let Err(e) = self.s.read_exact(&mut bhs) {
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Next::Timeout,
                _ => Next::Closed,
            };
        }
        let Ok(f) = pdu::framing(&bhs, 1 << 24) else {
            return Next::Closed;
        };
        let mut rest = bhs.to_vec();
        let mut n = f.ahs_len + pdu::padded(f.data_len);
        if self.digests.header {
            n += 4;
        }
        if self.digests.data && f.data_len > 0 {
            n += 4;
        }
        let mut more = vec![0u8; n];
        if self.s.read_exact(&mut more).is_err() {
            return Next::Closed;
        }
        rest.extend_from_slice(&more);
        match pdu::decode(&rest, self.digests, 1 << 24) {
            Ok(Some((p, _))) => Next::Pdu(p),
            _ => Next::Closed,
        }
    }

    /// True if the server closes the connection (EOF or reset) within
    /// the read timeout, skipping any PDUs it sends first; false if the
    /// connection stays open and silent that long.
    pub fn closed(&mut self) -> bool {
        for _ in 0..64 {
            match self.next() {
                Next::Pdu(_) => {}
                Next::Closed => return true,
                Next::Timeout => return false,
            }
        }
        false
    }

    /// A login request.
    pub fn login_pdu(csg: u8, nsg: Option<u8>, keys: &[(&str, &str)]) -> Pdu {
        let mut p = Pdu::new(op::LOGIN);
        p.set_immediate(true);
        let mut f = csg << 2;
        if let Some(n) = nsg {
            f |= 0x80 | n;
        }
        p.set_flags(f);
        p.bhs[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
        p.set_itt(1);
        p.set_u32(24, 1);
        let pairs: Vec<(String, String)> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p.data = text::encode(&pairs);
        p
    }

    /// Logs in to `iqn` without CHAP, straight into the full feature
    /// phase; panics on failure.
    pub fn login(addr: SocketAddr, iqn: &str) -> Raw {
        let mut r = Raw::connect(addr);
        r.send(&Raw::login_pdu(
            1,
            Some(3),
            &[
                ("InitiatorName", "iqn.2024-01.org.tarn:test"),
                ("TargetName", iqn),
                ("SessionType", "Normal"),
                ("MaxRecvDataSegmentLength", "8192"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
            ],
        ));
        let rsp = r.recv().expect("login response");
        assert_eq!(rsp.opcode(), op::LOGIN_RSP);
        assert_eq!(rsp.u16_at(36), 0, "login status");
        assert_eq!(rsp.flags() & 0x83, 0x83, "in full feature phase");
        r
    }

    /// A SCSI command PDU with `cdb`.
    pub fn scsi(&mut self, itt: u32, cdb: &[u8], edtl: u32, read: bool, write: bool) -> Pdu {
        let mut p = Pdu::new(op::SCSI_CMD);
        let mut f = 0x80u8;
        if read {
            f |= 0x40;
        }
        if write {
            f |= 0x20;
        }
        p.set_flags(f);
        p.set_itt(itt);
        p.set_u32(20, edtl);
        p.set_u32(24, self.cmd_sn);
        self.cmd_sn += 1;
        p.bhs[32..32 + cdb.len()].copy_from_slice(cdb);
        p
    }

    /// Sends a TEST UNIT READY and expects GOOD.
    pub fn tur_good(&mut self, itt: u32) {
        let p = self.scsi(itt, &[0; 6], 0, false, false);
        self.send(&p);
        let r = self.recv().expect("a response");
        assert_eq!(r.opcode(), op::SCSI_RSP, "{r:?}");
        assert_eq!(r.itt(), itt);
        assert_eq!(r.bhs[3], 0, "GOOD");
    }
}

//! The protocol over a raw socket: bad input (garbage, oversized
//! segments, login out of order, unknown opcodes) is answered with a
//! Reject or a closed connection and never disturbs other sessions;
//! writes through R2T and reads split into several Data-In PDUs; ABORT
//! TASK of a waiting, a finished and an unknown task.

mod common;

use common::*;
use tarn_iscsi::pdu::{op, Pdu};
use tarn_iscsi::IscsiTarget;
use tarn_vol::Device;

fn server() -> (
    tarn_iscsi::Running,
    std::sync::Arc<tarn_vol::testing::MemDevice>,
) {
    let dev = mem(8 * MIB, 4096);
    let r = start(vec![IscsiTarget::new(IQN, dev.clone())]);
    (r, dev)
}

#[test]
fn garbage_and_oversized_segments_close_only_that_connection() {
    let (r, _) = server();
    let addr = r.local_addr();
    let mut good = Raw::login(addr, IQN);

    let mut junk = Raw::connect(addr);
    let _ = junk.send_bytes(&[0xffu8; 48]);
    assert!(junk.closed(), "garbage BHS before login");

    // A login request announcing a 16 MiB data segment.
    let mut big = Raw::connect(addr);
    let mut p = Raw::login_pdu(0, None, &[]);
    p.data = Vec::new();
    let mut wire = p.encode(Default::default());
    wire[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    let _ = big.send_bytes(&wire);
    assert!(big.closed(), "oversized login segment");

    // In the full feature phase: a segment over MaxRecvDataSegmentLength
    // (another initiator port: a login with `good`'s would reinstate it).
    let mut ffp = login_isid(addr, 2);
    let mut nop = Pdu::new(op::NOP_OUT);
    nop.set_flags(0x80);
    nop.set_itt(5);
    let mut wire = nop.encode(Default::default());
    wire[5..8].copy_from_slice(&[0x10, 0, 0]); // 1 MiB
    let _ = ffp.send_bytes(&wire);
    assert!(ffp.closed(), "oversized segment in the full feature phase");

    good.tur_good(1);
}

#[test]
fn commands_before_login_and_unknown_opcodes() {
    let (r, _) = server();
    let addr = r.local_addr();
    let mut early = Raw::connect(addr);
    let cmd = early.scsi(1, &[0; 6], 0, false, false);
    early.send(&cmd);
    let rsp = early.recv().expect("a login reject");
    assert_eq!(rsp.opcode(), op::LOGIN_RSP);
    assert_ne!(rsp.u16_at(36), 0);
    assert!(early.closed());

    let mut s = Raw::login(addr, IQN);
    let mut odd = Pdu::new(0x1c);
    odd.set_itt(3);
    s.send(&odd);
    let rej = s.recv().expect("a reject");
    assert_eq!(rej.opcode(), op::REJECT);
    assert_eq!(rej.bhs[2], 0x05, "command not supported");
    assert_eq!(&rej.data[..48], &odd.bhs[..]);
    // The session goes on.
    s.tur_good(4);

    // An unknown SCSI opcode is a CHECK CONDITION, not a protocol error.
    let c = s.scsi(5, &[0xd9, 0, 0, 0, 0, 0], 0, false, false);
    s.send(&c);
    let rsp = s.recv().unwrap();
    assert_eq!(rsp.opcode(), op::SCSI_RSP);
    assert_eq!(rsp.bhs[3], 0x02);
    assert_eq!(rsp.data[2 + 2] & 0x0f, 0x05, "ILLEGAL REQUEST");
    assert_eq!(rsp.data[2 + 12], 0x20, "INVALID COMMAND OPERATION CODE");
    s.tur_good(6);
}

#[test]
fn writes_use_r2t_and_reads_split_by_the_initiators_segment_size() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    // WRITE(10) of 64 KiB at LBA 8 with InitialR2T=Yes and 4 KiB of
    // immediate data: the target asks for the rest.
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut c = s.scsi(10, &[0x2a, 0, 0, 0, 0, 8, 0, 0, 128, 0], 65536, false, true);
    c.data = data[..4096].to_vec();
    s.send(&c);
    let mut got = 4096usize;
    let rsp = loop {
        let p = s.recv().expect("R2T or response");
        if p.opcode() != op::R2T {
            break p;
        }
        let off = p.u32_at(40) as usize;
        let len = p.u32_at(44) as usize;
        assert_eq!(off, got);
        // Answer in 8 KiB Data-Out PDUs (the target's segment limit is
        // larger; the initiator may use any size up to it).
        let mut at = off;
        let mut sn = 0;
        while at < off + len {
            let n = (off + len - at).min(8192);
            let mut d = Pdu::new(op::DATA_OUT);
            d.set_flags(if at + n == off + len { 0x80 } else { 0 });
            d.set_itt(10);
            d.set_u32(20, p.u32_at(20));
            d.set_u32(36, sn);
            d.set_u32(40, at as u32);
            d.data = data[at..at + n].to_vec();
            s.send(&d);
            at += n;
            sn += 1;
        }
        got = off + len;
    };
    assert_eq!(rsp.opcode(), op::SCSI_RSP);
    assert_eq!(rsp.bhs[3], 0, "GOOD");
    assert_eq!(dev.read(8 * 512, 65536).unwrap(), data);

    // READ(10) of the same 64 KiB: MaxRecvDataSegmentLength=8192 gives
    // eight Data-In PDUs, the status in the last.
    let c = s.scsi(11, &[0x28, 0, 0, 0, 0, 8, 0, 0, 128, 0], 65536, true, false);
    s.send(&c);
    let mut back = Vec::new();
    loop {
        let p = s.recv().unwrap();
        assert_eq!(p.opcode(), op::DATA_IN);
        assert!(p.data.len() <= 8192);
        assert_eq!(p.u32_at(40) as usize, back.len());
        back.extend_from_slice(&p.data);
        if p.flags() & 0x01 != 0 {
            assert_eq!(p.bhs[3], 0);
            break;
        }
    }
    assert_eq!(back, data);
}

#[test]
fn a_data_out_at_a_wrong_offset_ends_the_connection_only() {
    let (r, _) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    let c = s.scsi(1, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 4096, false, true);
    s.send(&c);
    let r2t = s.recv().unwrap();
    assert_eq!(r2t.opcode(), op::R2T);
    let mut d = Pdu::new(op::DATA_OUT);
    d.set_flags(0x80);
    d.set_itt(1);
    d.set_u32(20, r2t.u32_at(20));
    d.set_u32(40, 512);
    d.data = vec![1; 512];
    s.send(&d);
    assert!(s.closed());
    let mut other = Raw::login(r.local_addr(), IQN);
    other.tur_good(1);
}

#[test]
fn crc32c_digests_apply_after_login_and_a_bad_one_closes() {
    let (r, _) = server();
    let login = |addr| {
        let mut s = Raw::connect(addr);
        s.send(&Raw::login_pdu(
            1,
            Some(3),
            &[
                ("InitiatorName", "iqn.2024-01.org.tarn:test"),
                ("TargetName", IQN),
                ("HeaderDigest", "CRC32C"),
                ("DataDigest", "CRC32C,None"),
            ],
        ));
        let rsp = s.recv().expect("login response");
        assert_eq!(rsp.u16_at(36), 0);
        let keys = tarn_iscsi::text::parse(&rsp.data).unwrap();
        assert!(keys.contains(&("HeaderDigest".into(), "CRC32C".into())));
        assert!(keys.contains(&("DataDigest".into(), "CRC32C".into())));
        s.digests = tarn_iscsi::pdu::Digests {
            header: true,
            data: true,
        };
        s
    };
    let mut s = login(r.local_addr());
    s.tur_good(1);
    let mut nop = Pdu::new(op::NOP_OUT);
    nop.set_immediate(true);
    nop.set_flags(0x80);
    nop.set_itt(2);
    nop.set_u32(20, 0xffff_ffff);
    nop.data = b"ping".to_vec();
    s.send(&nop);
    let pong = s.recv().expect("NOP-In");
    assert_eq!(pong.opcode(), op::NOP_IN);
    assert_eq!(pong.data, b"ping");

    let mut wire = nop.encode(s.digests);
    wire[48] ^= 0xff; // the header digest
    let _ = s.send_bytes(&wire);
    assert!(s.closed());
    login(r.local_addr()).tur_good(1);
}

#[test]
fn a_data_out_with_a_wrong_data_sn_fails_the_command_not_the_session() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    // WRITE(10) of 2 blocks; the R2T asks for both; the Data-Outs carry
    // DataSN 1 then 0 (swapped).
    let c = s.scsi(1, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 2, 0], 1024, false, true);
    s.send(&c);
    let r2t = s.recv().unwrap();
    assert_eq!(r2t.opcode(), op::R2T);
    for (i, sn) in [(0u32, 1u32), (1, 0)] {
        let mut d = Pdu::new(op::DATA_OUT);
        d.set_flags(if i == 1 { 0x80 } else { 0 });
        d.set_itt(1);
        d.set_u32(20, r2t.u32_at(20));
        d.set_u32(36, sn);
        d.set_u32(40, i * 512);
        d.data = vec![0xee; 512];
        s.send(&d);
    }
    let rej = s.recv().expect("a reject");
    assert_eq!(rej.opcode(), op::REJECT);
    assert_eq!(rej.bhs[2], 0x02, "handled as a data digest error");
    let rsp = s.recv().expect("the command's status");
    assert_eq!(rsp.opcode(), op::SCSI_RSP);
    assert_eq!(rsp.itt(), 1);
    assert_eq!(rsp.bhs[3], 0x02, "CHECK CONDITION");
    assert_eq!(rsp.data[2 + 2] & 0x0f, 0x0b, "ABORTED COMMAND");
    assert_eq!(
        (rsp.data[2 + 12], rsp.data[2 + 13]),
        (0x47, 0x05),
        "PROTOCOL SERVICE CRC ERROR"
    );
    assert!(dev.read(0, 1024).unwrap().iter().all(|&b| b == 0));
    // The session goes on, and a correct write works.
    s.tur_good(2);
    let c = s.scsi(3, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, false, true);
    s.send(&c);
    let r2t = s.recv().unwrap();
    s.send(&data_out(3, &r2t, vec![0x11; 512]));
    let rsp = s.recv().unwrap();
    assert_eq!((rsp.opcode(), rsp.bhs[3]), (op::SCSI_RSP, 0));
    assert_eq!(dev.read(0, 512).unwrap(), vec![0x11; 512]);
}

/// Reads block `lba` (512 bytes) over `s`.
/// A WRITE whose expected length ends inside a block cannot be carried
/// out as sent: it is refused, not done for the whole blocks and answered
/// GOOD with the rest of the bytes dropped. One that ends on a block is
/// done for those blocks, with an overflow residual for the rest.
#[test]
fn a_write_shorter_than_its_cdb_by_part_of_a_block_is_refused() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    let mut c = s.scsi(20, &[0x2a, 0, 0, 0, 0, 2, 0, 0, 2, 0], 1000, false, true);
    c.data = vec![0xab; 1000];
    s.send(&c);
    let rsp = s.recv().expect("response");
    assert_eq!(rsp.opcode(), op::SCSI_RSP, "{rsp:?}");
    assert_eq!(rsp.bhs[3], 2, "CHECK CONDITION");
    assert_eq!(
        (rsp.data[2 + 2] & 0x0f, rsp.data[2 + 12], rsp.data[2 + 13]),
        (0x05, 0x0e, 0x03),
        "ILLEGAL REQUEST, INVALID FIELD IN INFORMATION UNIT"
    );
    assert_eq!(rsp.u32_at(44), 24, "overflow residual");
    assert_eq!(
        dev.read(2 * 512, 1024).unwrap(),
        vec![0; 1024],
        "nothing written"
    );
    let mut c = s.scsi(21, &[0x2a, 0, 0, 0, 0, 2, 0, 0, 2, 0], 512, false, true);
    c.data = vec![0xcd; 512];
    s.send(&c);
    let rsp = s.recv().expect("response");
    assert_eq!(rsp.opcode(), op::SCSI_RSP, "{rsp:?}");
    assert_eq!(rsp.bhs[3], 0, "GOOD");
    assert_eq!(rsp.u32_at(44), 512, "overflow residual");
    assert_eq!(dev.read(2 * 512, 512).unwrap(), vec![0xcd; 512]);
    // The session goes on.
    assert_eq!(read_block(&mut s, 22, 2), vec![0xcd; 512]);
}

fn read_block(s: &mut Raw, itt: u32, lba: u8) -> Vec<u8> {
    let c = s.scsi(itt, &[0x28, 0, 0, 0, 0, lba, 0, 0, 1, 0], 512, true, false);
    s.send(&c);
    let mut got = Vec::new();
    loop {
        let p = s.recv().expect("Data-In");
        assert_eq!(p.opcode(), op::DATA_IN, "{p:?}");
        got.extend_from_slice(&p.data);
        if p.flags() & 0x01 != 0 {
            assert_eq!(p.bhs[3], 0);
            return got;
        }
    }
}

#[test]
fn compare_and_write_is_atomic_across_sessions() {
    // Each session increments a counter in block 3 with COMPARE AND
    // WRITE (read, then swap old for old + 1, again on a miscompare),
    // as VMware's ATS takes a lock. If any compare and its write could
    // interleave with another session's, an increment would be lost.
    let (r, dev) = server();
    let addr = r.local_addr();
    const SESSIONS: usize = 4;
    const EACH: u64 = 40;
    let threads: Vec<_> = (0..SESSIONS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = login_isid(addr, i as u8 + 1);
                let mut itt = 1;
                let mut misses = 0;
                for _ in 0..EACH {
                    loop {
                        itt += 1;
                        let old = read_block(&mut s, itt, 3);
                        let n = u64::from_be_bytes(old[..8].try_into().unwrap());
                        let mut new = old.clone();
                        new[..8].copy_from_slice(&(n + 1).to_be_bytes());
                        itt += 1;
                        let mut c = s.scsi(
                            itt,
                            &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0],
                            1024,
                            false,
                            true,
                        );
                        c.data = [old, new].concat();
                        s.send(&c);
                        let rsp = s.recv().expect("a response");
                        assert_eq!(rsp.opcode(), op::SCSI_RSP);
                        if rsp.bhs[3] == 0 {
                            break;
                        }
                        assert_eq!(rsp.bhs[3], 0x02);
                        assert_eq!(rsp.data[2 + 2] & 0x0f, 0x0e, "MISCOMPARE");
                        misses += 1;
                    }
                }
                misses
            })
        })
        .collect();
    let misses: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let block = dev.read(3 * 512, 8).unwrap();
    assert_eq!(
        u64::from_be_bytes(block[..8].try_into().unwrap()),
        SESSIONS as u64 * EACH,
        "no increment lost ({misses} miscompares retried)"
    );
}

/// Logs in as initiator port `isid` (same initiator name as
/// `Raw::login`).
fn login_isid(addr: std::net::SocketAddr, isid: u8) -> Raw {
    login_port(addr, IQN, isid)
}

/// Logs in to `iqn` as initiator port `isid`: a session of its own,
/// where a second `Raw::login` (the same port) would reinstate the
/// first.
fn login_port(addr: std::net::SocketAddr, iqn: &str, isid: u8) -> Raw {
    let mut r = Raw::connect(addr);
    let mut p = Raw::login_pdu(
        1,
        Some(3),
        &[
            ("InitiatorName", "iqn.2024-01.org.tarn:test"),
            ("TargetName", iqn),
            ("ImmediateData", "Yes"),
        ],
    );
    p.bhs[13] = isid;
    r.send(&p);
    let rsp = r.recv().expect("login response");
    assert_eq!(rsp.u16_at(36), 0, "login status");
    r
}

/// Sends PERSISTENT RESERVE OUT `sa` with `key`, `sa_key` and type `t`;
/// returns the SCSI status.
fn prout(s: &mut Raw, itt: u32, sa: u8, t: u8, key: u64, sa_key: u64) -> u8 {
    let mut c = s.scsi(itt, &[0x5f, sa, t, 0, 0, 0, 0, 0, 24, 0], 24, false, true);
    let mut list = key.to_be_bytes().to_vec();
    list.extend_from_slice(&sa_key.to_be_bytes());
    list.extend_from_slice(&[0; 8]);
    c.data = list;
    s.send(&c);
    let rsp = s.recv().expect("a response");
    assert_eq!(rsp.opcode(), op::SCSI_RSP);
    rsp.bhs[3]
}

/// READ(10) of one block; the SCSI status.
fn read_status(s: &mut Raw, itt: u32) -> u8 {
    let c = s.scsi(itt, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, true, false);
    s.send(&c);
    loop {
        let p = s.recv().expect("a response");
        if p.opcode() == op::SCSI_RSP || p.flags() & 0x01 != 0 {
            return p.bhs[3];
        }
    }
}

#[test]
fn reservations_are_per_initiator_port_and_outlive_sessions() {
    let (r, _) = server();
    let addr = r.local_addr();
    let mut a = login_isid(addr, 1);
    let mut b = login_isid(addr, 2);
    // A registers and takes Exclusive Access.
    assert_eq!(prout(&mut a, 1, 0, 0, 0, 0xaa), 0);
    assert_eq!(prout(&mut a, 2, 1, 3, 0xaa, 0), 0);
    // B, the same initiator name with another ISID, is another nexus:
    // its reads meet RESERVATION CONFLICT; TEST UNIT READY still works.
    assert_eq!(read_status(&mut b, 1), 0x18);
    b.tur_good(2);
    assert_eq!(read_status(&mut a, 3), 0);
    // B cannot reserve or release without being registered.
    assert_eq!(prout(&mut b, 3, 1, 3, 0, 0), 0x18);
    // A's session ends; the reservation stays.
    drop(a);
    let mut b2 = login_isid(addr, 2);
    assert_eq!(read_status(&mut b2, 1), 0x18);
    // A comes back on the same initiator port and releases.
    let mut a = login_isid(addr, 1);
    assert_eq!(prout(&mut a, 1, 2, 3, 0xaa, 0), 0);
    assert_eq!(read_status(&mut b2, 2), 0);
    // APTPL is refused: CHECK CONDITION.
    let mut c = a.scsi(2, &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, false, true);
    let mut list = vec![0u8; 24];
    list[7] = 0xaa;
    list[20] = 0x01;
    c.data = list;
    a.send(&c);
    let rsp = a.recv().unwrap();
    assert_eq!(rsp.bhs[3], 0x02);
    assert_eq!(rsp.data[2 + 12], 0x26, "INVALID FIELD IN PARAMETER LIST");
}

/// A device whose reads of the first 4 KiB wait (up to 3 s) until the
/// test opens the gate: a server that ran one command at a time could
/// not answer a later read before the wait is over.
struct Gate {
    inner: std::sync::Arc<tarn_vol::testing::MemDevice>,
    opened: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    /// Reads waiting at the gate now, and the most that ever did.
    waiting: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    /// Writes to the first 4 KiB wait at the gate too.
    writes: bool,
}

impl Gate {
    /// An 8 MiB device whose first block's reads wait for the gate.
    fn closed() -> std::sync::Arc<Gate> {
        Gate::new(false)
    }

    /// The same, and writes to the first block wait for the gate too.
    fn closed_for_writes() -> std::sync::Arc<Gate> {
        Gate::new(true)
    }

    fn new(writes: bool) -> std::sync::Arc<Gate> {
        std::sync::Arc::new(Gate {
            inner: mem(8 * MIB, 4096),
            opened: std::sync::Mutex::new(false),
            cv: std::sync::Condvar::new(),
            waiting: Default::default(),
            most: Default::default(),
            writes,
        })
    }

    /// Waits (up to 3 s) while the gate is shut, for a request at `off`.
    fn pass(&self, off: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut open = self.opened.lock().unwrap();
        if off < 4096 {
            let n = self.waiting.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(n, SeqCst);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while !*open && std::time::Instant::now() < deadline {
                open = self
                    .cv
                    .wait_timeout(open, std::time::Duration::from_millis(50))
                    .unwrap()
                    .0;
            }
            self.waiting.fetch_sub(1, SeqCst);
        }
    }

    fn set(&self, open: bool) {
        *self.opened.lock().unwrap() = open;
        self.cv.notify_all();
    }
}

impl tarn_vol::Device for Gate {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_data(&self, off: u64, len: u32) -> Result<tarn_vol::ReadData, tarn_vol::VolError> {
        self.pass(off);
        self.inner.read_data(off, len)
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), tarn_vol::VolError> {
        if self.writes {
            self.pass(off);
        }
        self.inner.write(off, data, fua)
    }
    fn flush(&self) -> Result<(), tarn_vol::VolError> {
        self.inner.flush()
    }
    fn trim(&self, off: u64, len: u64) -> Result<(), tarn_vol::VolError> {
        self.inner.trim(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), tarn_vol::VolError> {
        self.inner.write_zeroes(off, len, fua)
    }
    fn extents(&self, off: u64, len: u64) -> Result<Vec<tarn_vol::Extent>, tarn_vol::VolError> {
        self.inner.extents(off, len)
    }
}

/// READ(10) of 8 blocks at `lba` with the task attribute `attr`
/// (1 SIMPLE, 2 ORDERED).
fn read10(s: &mut Raw, itt: u32, lba: u8, attr: u8) -> Pdu {
    let mut c = s.scsi(itt, &[0x28, 0, 0, 0, 0, lba, 0, 0, 8, 0], 4096, true, false);
    c.set_flags(c.flags() | attr);
    c
}

/// The ITTs of the next `n` finished commands, in the order their
/// status came, and the MaxCmdSN of the first answer; `after_first` runs
/// once the first has finished.
fn finished(s: &mut Raw, n: usize, mut after_first: impl FnMut()) -> (Vec<u32>, u32) {
    let mut order = Vec::new();
    let mut max_cmd_sn = None;
    while order.len() < n {
        let p = s.recv().expect("an answer");
        max_cmd_sn.get_or_insert(p.u32_at(32));
        let done = match p.opcode() {
            op::DATA_IN => p.flags() & 0x01 != 0,
            op::SCSI_RSP => true,
            other => panic!("unexpected opcode {other:#x}"),
        };
        if done {
            assert_eq!(p.bhs[3], 0, "GOOD");
            order.push(p.itt());
            if order.len() == 1 {
                after_first();
            }
        }
    }
    (order, max_cmd_sn.unwrap_or_default())
}

#[test]
fn one_session_runs_simple_commands_at_once_and_ordered_ones_alone() {
    let dev = Gate::closed();
    let r = start(vec![IscsiTarget::new(IQN, dev.clone())]);
    let mut s = Raw::login(r.local_addr(), IQN);
    // SIMPLE: the gated read waits until the second read is answered,
    // which must run while the first is still running (one at a time,
    // the first would be answered first, after the gate's timeout).
    let a = read10(&mut s, 1, 0, 1);
    let b = read10(&mut s, 2, 64, 1);
    let sn_after = b.u32_at(24) + 1;
    s.send(&a);
    s.send(&b);
    let (order, max_cmd_sn) = finished(&mut s, 2, || dev.set(true));
    assert_eq!(order, [2, 1], "the second read was held up by the first");
    // While the gated read ran, the window was one command smaller.
    assert_eq!(
        max_cmd_sn,
        sn_after + 32 - 1 - 1,
        "MaxCmdSN did not count the running command"
    );

    // ORDERED: the second read waits until the first is over, so the
    // gated one times out first and the answers come in order.
    dev.set(false);
    let a = read10(&mut s, 3, 0, 1);
    let b = read10(&mut s, 4, 64, 2);
    s.send(&a);
    s.send(&b);
    let (order, _) = finished(&mut s, 2, || ());
    assert_eq!(order, [3, 4], "an ORDERED task ran beside another");
    s.tur_good(5);
}

/// With the window full of running commands, a ping (an immediate
/// NOP-Out) is still read and answered at once: an initiator whose pings
/// go unanswered while its commands run long drops the connection.
#[test]
fn a_ping_is_answered_while_the_window_is_full_of_running_commands() {
    let dev = Gate::closed();
    let cfg = tarn_iscsi::IscsiConfig {
        queue_depth: 2,
        ..Default::default()
    };
    let r = start_with(cfg, vec![IscsiTarget::new(IQN, dev.clone())]);
    let mut s = Raw::login(r.local_addr(), IQN);
    let a = read10(&mut s, 1, 0, 1);
    let b = read10(&mut s, 2, 0, 1);
    s.send(&a);
    s.send(&b);
    let mut nop = Pdu::new(op::NOP_OUT);
    nop.set_immediate(true);
    nop.set_flags(0x80);
    nop.set_itt(9);
    nop.set_u32(20, 0xffff_ffff);
    nop.set_u32(24, s.cmd_sn);
    nop.data = b"still there?".to_vec();
    s.send(&nop);
    // The gated reads run until the gate opens (or 3 s pass): the answer
    // to the ping must come first.
    let pong = s.recv().expect("an answer");
    assert_eq!(pong.opcode(), op::NOP_IN, "the ping waited for a command");
    assert_eq!(pong.itt(), 9);
    assert_eq!(pong.data, b"still there?");
    dev.set(true);
    let (mut order, _) = finished(&mut s, 2, || ());
    order.sort_unstable();
    assert_eq!(order, [1, 2]);
    s.tur_good(3);
}

#[test]
fn an_ordered_task_behind_a_write_waiting_for_data_is_told_to_retry() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    // A WRITE(10) of 8 blocks with no immediate data: the target asks for
    // it with an R2T and the write waits.
    let c = s.scsi(1, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 4096, false, true);
    s.send(&c);
    let r2t = s.recv().expect("an R2T");
    assert_eq!(r2t.opcode(), op::R2T);
    // An ORDERED TEST UNIT READY cannot go before it: TASK SET FULL.
    let mut tur = s.scsi(2, &[0; 6], 0, false, false);
    tur.set_flags(tur.flags() | 2);
    s.send(&tur);
    let rsp = s.recv().expect("a response");
    assert_eq!((rsp.opcode(), rsp.itt()), (op::SCSI_RSP, 2));
    assert_eq!(rsp.bhs[3], 0x28, "TASK SET FULL");
    // The data comes, the write completes, and the retry runs.
    s.send(&data_out(1, &r2t, vec![0x5a; 4096]));
    let rsp = s.recv().expect("the write's status");
    assert_eq!((rsp.itt(), rsp.bhs[3]), (1, 0));
    assert_eq!(dev.read(0, 4096).unwrap(), vec![0x5a; 4096]);
    let mut tur = s.scsi(3, &[0; 6], 0, false, false);
    tur.set_flags(tur.flags() | 2);
    s.send(&tur);
    let rsp = s.recv().expect("a response");
    assert_eq!((rsp.itt(), rsp.bhs[3]), (3, 0), "GOOD");
}

#[test]
fn revoking_access_closes_the_sessions_already_in() {
    let a = mem(8 * MIB, 4096);
    let b = mem(8 * MIB, 4096);
    let b_iqn = "iqn.2024-01.org.tarn:other";
    let targets = |a_clients: &str| {
        let mut ta = IscsiTarget::new(IQN, a.clone());
        ta.clients = vec![a_clients.parse().unwrap()];
        vec![ta, IscsiTarget::new(b_iqn, b.clone())]
    };
    let r = start(targets("127.0.0.0/8"));
    let mut sa = Raw::login(r.local_addr(), IQN);
    let mut sb = Raw::login(r.local_addr(), b_iqn);
    // The same targets again (what the daemon does on any share change):
    // both sessions go on.
    r.set_targets(targets("127.0.0.0/8")).unwrap();
    sa.tur_good(1);
    sb.tur_good(1);
    // A's networks no longer include this client: its session is closed,
    // B's goes on.
    r.set_targets(targets("10.0.0.0/8")).unwrap();
    assert!(
        sa.closed(),
        "a session outside the target's networks went on"
    );
    sb.tur_good(2);
    // A target removed ends its sessions too.
    let mut sa = login_port(r.local_addr(), b_iqn, 2);
    r.set_targets(vec![IscsiTarget::new(IQN, a.clone())])
        .unwrap();
    assert!(
        sa.closed() && sb.closed(),
        "sessions of a removed target went on"
    );
}

/// A share made read-only ends the sessions logged in while it was
/// writable, also when its volume refuses writes of its own right now
/// (`readonly=on`, which can be turned off later): the session must not
/// keep the writable share it logged in to.
#[test]
fn a_share_made_read_only_ends_its_writable_sessions() {
    let dev = std::sync::Arc::new(tarn_vol::testing::MemDevice::new(8 * MIB, 4096).read_only());
    let target = |read_only: bool| {
        let mut t = IscsiTarget::new(IQN, dev.clone());
        t.read_only = read_only;
        vec![t]
    };
    let r = start(target(false));
    let mut s = Raw::login(r.local_addr(), IQN);
    s.tur_good(1);
    r.set_targets(target(false)).unwrap();
    s.tur_good(2);
    r.set_targets(target(true)).unwrap();
    assert!(
        s.closed(),
        "a session of a writable share went on read-only"
    );
}

/// A target whose volume is closed for a moment (rolled back, destroyed)
/// answers a login with Service Unavailable, so the initiator retries,
/// rather than letting it in to an empty disk.
#[test]
fn a_closed_volume_is_unavailable_at_login() {
    let (r, dev) = server();
    dev.close();
    let mut s = Raw::connect(r.local_addr());
    s.send(&Raw::login_pdu(
        1,
        Some(3),
        &[
            ("InitiatorName", "iqn.2024-01.org.tarn:test"),
            ("TargetName", IQN),
            ("SessionType", "Normal"),
        ],
    ));
    let rsp = s.recv().expect("a login response");
    assert_eq!(rsp.u16_at(36), 0x0301, "Service Unavailable");
}

/// A volume closed under a session (a rollback or destroy under way) is
/// not ready: READ CAPACITY does not report a disk of one block, nor TEST
/// UNIT READY a ready one.
#[test]
fn a_volume_closed_under_a_session_is_not_ready() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    s.tur_good(1);
    dev.close();
    for (itt, cdb) in [
        (2, vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        (
            3,
            vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        ),
        (4, vec![0, 0, 0, 0, 0, 0]),
    ] {
        let read = cdb[0] != 0;
        let c = s.scsi(itt, &cdb, if read { 32 } else { 0 }, read, false);
        s.send(&c);
        let rsp = s.recv().expect("a response");
        assert_eq!(
            (rsp.opcode(), rsp.bhs[3]),
            (op::SCSI_RSP, 2),
            "CHECK CONDITION for {cdb:02x?}"
        );
        assert_eq!(rsp.data[2 + 2] & 0x0f, 0x02, "NOT READY for {cdb:02x?}");
    }
}

/// The initiator list is checked before availability: an initiator the
/// target does not admit is refused as such even while the volume is
/// closed, and learns nothing of what is being done to it; an admitted
/// one is told to retry.
#[test]
fn a_closed_volume_is_unavailable_only_to_admitted_initiators() {
    let dev = mem(MIB, 4096);
    let mut t = IscsiTarget::new(IQN, dev.clone());
    t.initiators = vec!["iqn.2024-01.org.tarn:allowed".into()];
    let r = start(vec![t]);
    dev.close();
    let status = |initiator: &str| {
        let mut s = Raw::connect(r.local_addr());
        s.send(&Raw::login_pdu(
            1,
            Some(3),
            &[
                ("InitiatorName", initiator),
                ("TargetName", IQN),
                ("SessionType", "Normal"),
            ],
        ));
        s.recv().expect("a login response").u16_at(36)
    };
    assert_eq!(status("iqn.2024-01.org.tarn:other"), 0x0202, "Forbidden");
    assert_eq!(
        status("iqn.2024-01.org.tarn:allowed"),
        0x0301,
        "Service Unavailable"
    );
}

/// A target removed the moment a login finishes still ends that session:
/// the change can land between the login answer and the session's
/// subscription to changes, and must not be missed there. Many rounds,
/// because the window is a few microseconds wide.
#[test]
fn a_target_removed_right_after_login_ends_that_session() {
    let a = mem(MIB, 4096);
    let r = start(vec![IscsiTarget::new(IQN, a.clone())]);
    for round in 0..200 {
        let mut s = Raw::login(r.local_addr(), IQN);
        r.set_targets(Vec::new()).unwrap();
        assert!(s.closed(), "round {round}: the session went on");
        r.set_targets(vec![IscsiTarget::new(IQN, a.clone())])
            .unwrap();
    }
}

/// Access revoked while commands wait to be handled (queued behind a
/// task management request that waits for a running command): none of
/// them runs after the change. Each PDU is handled only once the last
/// change of the targets was checked, the way a login judged against the
/// table of its connection's start is checked before its session's first
/// command. Several rounds: without the check, which of the two comes
/// first is a coin toss.
#[test]
fn commands_waiting_when_access_is_revoked_do_not_run() {
    let dev = Gate::closed();
    let target = || IscsiTarget::new(IQN, dev.clone());
    let r = start(vec![target()]);
    for round in 0..8 {
        dev.set(false);
        let mut s = Raw::login(r.local_addr(), IQN);
        let gated = read10(&mut s, 1, 0, 1);
        s.send(&gated);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The abort waits for the running read; what comes after it
        // waits to be handled.
        let abort = abort_task(&mut s, 9, 1);
        s.send(&abort);
        for (i, lba) in (8u8..12).enumerate() {
            let mut w = s.scsi(
                2 + i as u32,
                &[0x2a, 0, 0, 0, 0, lba, 0, 0, 1, 0],
                4096,
                false,
                true,
            );
            w.data = vec![0xee; 4096];
            s.send(&w);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        r.set_targets(Vec::new()).unwrap();
        dev.set(true);
        while let Some(p) = s.recv() {
            assert!(
                !(2..6).contains(&p.itt()),
                "round {round}: answered {:#x} for task {} after the revocation",
                p.opcode(),
                p.itt()
            );
        }
        r.set_targets(vec![target()]).unwrap();
    }
    let written = dev.inner.read_data(8 * 4096, 4 * 4096).unwrap().to_vec();
    assert!(written.iter().all(|&b| b == 0), "a revoked session wrote");
}

/// An ABORT TASK request for `itt` (immediate).
fn abort_task(s: &mut Raw, tmf_itt: u32, itt: u32) -> Pdu {
    tmf(s, tmf_itt, 1, itt)
}

/// ABORT TASK: a write waiting for its data is dropped without a response
/// ("function complete"); one that completed and was answered, or an ITT
/// never used, is "task does not exist", so the initiator knows the
/// response it got stands.
#[test]
fn abort_task_tells_a_dropped_task_from_a_finished_one() {
    let (r, dev) = server();
    let mut s = Raw::login(r.local_addr(), IQN);
    let block = |dev: &tarn_vol::testing::MemDevice| dev.contents()[..4096].to_vec();
    // A 4 KiB write with no immediate data: it waits for Data-Out.
    let c = s.scsi(20, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 4096, false, true);
    s.send(&c);
    let r2t = s.recv().expect("an R2T");
    assert_eq!(r2t.opcode(), op::R2T);
    let a = abort_task(&mut s, 21, 20);
    s.send(&a);
    let rsp = s.recv().expect("the function's response");
    assert_eq!(rsp.opcode(), op::TASK_MGMT_RSP);
    assert_eq!(rsp.itt(), 21);
    assert_eq!(rsp.bhs[2], 0, "function complete");
    // Its data, sent late, is dropped: the device is unchanged.
    s.send(&data_out(20, &r2t, vec![0xee; 4096]));
    s.tur_good(22);
    assert_eq!(block(&dev), vec![0u8; 4096]);

    // A write that completed and was answered.
    let mut c = s.scsi(30, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, false, true);
    c.data = vec![0x5a; 512];
    s.send(&c);
    let rsp = s.recv().expect("the write's response");
    assert_eq!((rsp.opcode(), rsp.itt(), rsp.bhs[3]), (op::SCSI_RSP, 30, 0));
    let a = abort_task(&mut s, 31, 30);
    s.send(&a);
    let rsp = s.recv().expect("the function's response");
    assert_eq!((rsp.opcode(), rsp.itt()), (op::TASK_MGMT_RSP, 31));
    assert_eq!(rsp.bhs[2], 1, "task does not exist");
    assert_eq!(block(&dev)[..512], [0x5a; 512]);
    // An ITT never used.
    let a = abort_task(&mut s, 32, 0x7777);
    s.send(&a);
    let rsp = s.recv().expect("the function's response");
    assert_eq!(rsp.bhs[2], 1, "task does not exist");
    s.tur_good(33);
}

#[test]
fn writes_waiting_for_data_that_fill_the_budget_still_get_their_data() {
    // The budget is exactly one write of the largest size: admitted, it
    // holds all of it while it waits for its Data-Out.
    let cfg = tarn_iscsi::IscsiConfig {
        max_transfer: 64 << 10,
        max_pending_write_bytes: 64 << 10,
        ..Default::default()
    };
    let dev = mem(8 * MIB, 4096);
    let r = start_with(cfg, vec![IscsiTarget::new(IQN, dev.clone())]);
    let mut s = Raw::login(r.local_addr(), IQN);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13 % 253) as u8).collect();
    let c = s.scsi(1, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 128, 0], 65536, false, true);
    s.send(&c);
    let mut at = 0usize;
    let rsp = loop {
        let p = s.recv().expect("an R2T or the status, not silence");
        if p.opcode() != op::R2T {
            break p;
        }
        let (off, len) = (p.u32_at(40) as usize, p.u32_at(44) as usize);
        assert_eq!(off, at);
        let mut d = Pdu::new(op::DATA_OUT);
        d.set_flags(0x80);
        d.set_itt(1);
        d.set_u32(20, p.u32_at(20));
        d.set_u32(40, off as u32);
        d.data = data[off..off + len].to_vec();
        s.send(&d);
        at = off + len;
    };
    assert_eq!((rsp.opcode(), rsp.bhs[3]), (op::SCSI_RSP, 0), "GOOD");
    assert_eq!(dev.read(0, 65536).unwrap(), data);
    // The session goes on.
    s.tur_good(2);
}

/// A READ holds what it reads while it runs, whatever length the
/// initiator says it expects: READs sent with an expected length of 0 are
/// held to the connection's budget like any others, not let in without
/// bound (each would read its blocks into memory).
#[test]
fn reads_that_expect_nothing_still_count_against_the_budget() {
    use std::sync::atomic::Ordering::SeqCst;
    let cfg = tarn_iscsi::IscsiConfig {
        max_transfer: 64 << 10,
        max_pending_write_bytes: 64 << 10,
        ..Default::default()
    };
    let dev = Gate::closed();
    let r = start_with(cfg, vec![IscsiTarget::new(IQN, dev.clone())]);
    let mut s = Raw::login(r.local_addr(), IQN);
    // Sixteen READ(10)s of the first 64 KiB, expecting no data; each
    // waits at the gate once it is let in.
    for i in 0..16u32 {
        let c = s.scsi(
            100 + i,
            &[0x28, 0, 0, 0, 0, 0, 0, 0, 128, 0],
            0,
            true,
            false,
        );
        s.send(&c);
    }
    std::thread::sleep(std::time::Duration::from_millis(400));
    let most = dev.most.load(SeqCst);
    dev.set(true);
    let mut answered = 0;
    while answered < 16 {
        let p = s.recv().expect("a response to every READ");
        if p.opcode() == op::SCSI_RSP || (p.opcode() == op::DATA_IN && p.flags() & 0x01 != 0) {
            answered += 1;
        }
    }
    assert!(
        most <= 1,
        "{most} reads of 64 KiB ran at once on a 64 KiB budget"
    );
    s.tur_good(200);
}

/// A task management function of `func` for LUN 0, referring to task
/// `itt` (ABORT TASK; others take the reserved tag).
fn tmf(s: &Raw, tmf_itt: u32, func: u8, itt: u32) -> Pdu {
    let mut p = Pdu::new(op::TASK_MGMT);
    p.set_immediate(true);
    p.set_flags(0x80 | func);
    p.set_itt(tmf_itt);
    p.set_u32(20, itt);
    p.set_u32(24, s.cmd_sn);
    p
}

/// The one (final) Data-Out answering `r2t` for task `itt`, at offset 0.
fn data_out(itt: u32, r2t: &Pdu, data: Vec<u8>) -> Pdu {
    let mut d = Pdu::new(op::DATA_OUT);
    d.set_flags(0x80);
    d.set_itt(itt);
    d.set_u32(20, r2t.u32_at(20));
    d.data = data;
    d
}

/// Sends `cdb` (no data) and returns the status and the sense key, ASC
/// and ASCQ of a CHECK CONDITION (zeros otherwise).
fn status_and_sense(s: &mut Raw, itt: u32, cdb: &[u8]) -> (u8, [u8; 3]) {
    let c = s.scsi(itt, cdb, 0, false, false);
    s.send(&c);
    let r = s.recv().expect("a response");
    assert_eq!((r.opcode(), r.itt()), (op::SCSI_RSP, itt), "{r:?}");
    let sense = if r.bhs[3] == 2 && r.data.len() >= 2 + 14 {
        [r.data[2 + 2] & 0x0f, r.data[2 + 12], r.data[2 + 13]]
    } else {
        [0; 3]
    };
    (r.bhs[3], sense)
}

/// LUN RESET from one nexus ends the tasks of every session of the unit:
/// a write another session had waiting for its data never reaches the
/// device, and each session's next command reports the reset (unit
/// attention 29/03) once, the one that reset too. A resize of
/// the device is reported to every session (2A/09), by REQUEST SENSE too,
/// and a PREEMPT to the nexus it removed (2A/05).
#[test]
fn a_lun_reset_ends_other_sessions_tasks_and_tells_them() {
    let (r, dev) = server();
    let mut a = login_isid(r.local_addr(), 1);
    let mut b = login_isid(r.local_addr(), 2);
    a.tur_good(1);
    b.tur_good(1);
    // B: a 4 KiB write with no immediate data waits for its Data-Out.
    let c = b.scsi(2, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 4096, false, true);
    b.send(&c);
    let r2t = b.recv().expect("an R2T");
    assert_eq!(r2t.opcode(), op::R2T);
    // A resets the unit.
    let t = tmf(&a, 2, 5, 0xffff_ffff);
    a.send(&t);
    let rsp = a.recv().expect("the function's response");
    assert_eq!(
        (rsp.opcode(), rsp.itt(), rsp.bhs[2]),
        (op::TASK_MGMT_RSP, 2, 0)
    );
    // B's data comes after the reset: dropped, with no response.
    b.send(&data_out(2, &r2t, vec![0xee; 4096]));
    assert_eq!(
        status_and_sense(&mut b, 3, &[0; 6]),
        (2, [0x06, 0x29, 0x03]),
        "B is told of the reset"
    );
    b.tur_good(4);
    // The nexus that reset is told too (SAM-5: every nexus).
    assert_eq!(
        status_and_sense(&mut a, 3, &[0; 6]),
        (2, [0x06, 0x29, 0x03])
    );
    a.tur_good(31);
    assert_eq!(dev.contents()[..4096], [0u8; 4096], "the ended write ran");

    // The device grows under both sessions: the first command to find
    // the new size runs, and every nexus is told once.
    dev.resize(16 * MIB);
    a.tur_good(4);
    assert_eq!(
        status_and_sense(&mut a, 5, &[0; 6]),
        (2, [0x06, 0x2a, 0x09])
    );
    let c = b.scsi(5, &[0x03, 0, 0, 0, 252, 0], 252, true, false);
    b.send(&c);
    let p = b.recv().expect("REQUEST SENSE's data");
    assert_eq!(
        (p.opcode(), p.itt(), p.bhs[3]),
        (op::DATA_IN, 5, 0),
        "{p:?}"
    );
    assert_eq!(
        [p.data[2] & 0x0f, p.data[12], p.data[13]],
        [0x06, 0x2a, 0x09],
        "REQUEST SENSE returns the attention"
    );
    b.tur_good(6);
    a.tur_good(6);

    // Persistent reservations: B's PREEMPT of A's key tells A once
    // (REGISTRATIONS PREEMPTED); B is told nothing.
    assert_eq!(prout(&mut a, 7, 0, 0, 0, 0xa), 0, "A registers");
    assert_eq!(prout(&mut b, 7, 0, 0, 0, 0xb), 0, "B registers");
    assert_eq!(prout(&mut b, 8, 4, 1, 0xb, 0xa), 0, "B preempts A");
    assert_eq!(
        status_and_sense(&mut a, 8, &[0; 6]),
        (2, [0x06, 0x2a, 0x05])
    );
    a.tur_good(9);
    b.tur_good(9);
}

/// A LUN RESET is answered only once the writes other sessions had
/// running have finished (after the answer, nothing the reset ended
/// changes the volume); the session whose write it ended gets no
/// response for it, and its next commands, sent at once one after the
/// other, are carried out and answered (only the first reports the
/// reset).
#[test]
fn a_reset_waits_for_other_sessions_running_writes() {
    use std::sync::atomic::Ordering::SeqCst;
    let dev = Gate::closed_for_writes();
    let r = start(vec![IscsiTarget::new(IQN, dev.clone())]);
    let mut a = login_isid(r.local_addr(), 1);
    let mut b = login_isid(r.local_addr(), 2);
    // B's write of the first block (immediate data) waits in the device.
    let mut w = b.scsi(1, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, false, true);
    w.data = vec![0x77; 512];
    b.send(&w);
    let t0 = std::time::Instant::now();
    while dev.waiting.load(SeqCst) == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(3),
            "the write never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let t = tmf(&a, 1, 5, 0xffff_ffff);
    a.send(&t);
    // The reset waits for the write: no answer while the gate is shut.
    a.s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .unwrap();
    assert!(
        a.recv().is_none(),
        "the reset was answered before the write ended"
    );
    a.s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    dev.set(true);
    let rsp = a.recv().expect("the function's response");
    assert_eq!(
        (rsp.opcode(), rsp.itt(), rsp.bhs[2]),
        (op::TASK_MGMT_RSP, 1, 0)
    );
    // B: no response for the ended write; the reset first, then three
    // commands sent back to back all run.
    let tur = b.scsi(2, &[0; 6], 0, false, false);
    b.send(&tur);
    for itt in 3..6u32 {
        let mut w = b.scsi(itt, &[0x2a, 0, 0, 0, 0, 8, 0, 0, 1, 0], 512, false, true);
        w.data = vec![itt as u8; 512];
        b.send(&w);
    }
    let first = b.recv().expect("the TUR's response");
    assert_eq!(
        (first.opcode(), first.itt(), first.bhs[3]),
        (op::SCSI_RSP, 2, 2),
        "{first:?}"
    );
    let mut answered = Vec::new();
    for _ in 3..6 {
        let p = b.recv().expect("each write is answered");
        assert_eq!((p.opcode(), p.bhs[3]), (op::SCSI_RSP, 0), "{p:?}");
        answered.push(p.itt());
    }
    answered.sort();
    assert_eq!(answered, vec![3, 4, 5]);
    b.tur_good(6);
    assert_eq!(
        status_and_sense(&mut a, 2, &[0; 6]),
        (2, [0x06, 0x29, 0x03])
    );
}

/// Sends task management `func` for LUN 0 and checks it succeeded.
fn tmf_done(s: &mut Raw, tmf_itt: u32, func: u8) {
    let t = tmf(s, tmf_itt, func, 0xffff_ffff);
    s.send(&t);
    let rsp = s.recv().expect("the function's response");
    assert_eq!(
        (rsp.opcode(), rsp.itt(), rsp.bhs[2]),
        (op::TASK_MGMT_RSP, tmf_itt, 0),
        "function {func}"
    );
}

/// Polls TEST UNIT READY from `s` until the unit is no longer reserved
/// against it (the server notices a closed connection on its own time).
fn until_unreserved(s: &mut Raw, first_itt: u32) -> u32 {
    for i in 0..100 {
        match status_and_sense(s, first_itt + i, &[0; 6]) {
            (0, _) => return first_itt + i + 1,
            (0x18, _) => std::thread::sleep(std::time::Duration::from_millis(50)),
            other => panic!("{other:?}"),
        }
    }
    panic!("still reserved after 5 s");
}

/// RESERVE(6) gives the unit to one nexus; another meets RESERVATION
/// CONFLICT (INQUIRY still answers). ABORT TASK SET and CLEAR TASK SET
/// leave the reservation, LUN RESET and TARGET WARM RESET end it; so
/// do the holder's session ending and a login that reinstates the
/// holder's session (same initiator name and ISID), which also closes
/// the old session.
#[test]
fn spc2_reservations_end_with_resets_and_with_the_holders_nexus() {
    let (r, _) = server();
    let addr = r.local_addr();
    let mut a = login_isid(addr, 1);
    let mut b = login_isid(addr, 2);
    let reserve = [0x16, 0, 0, 0, 0, 0];
    let conflict = (0x18, [0; 3]);
    let good = (0, [0; 3]);
    assert_eq!(status_and_sense(&mut a, 1, &reserve), good);
    assert_eq!(status_and_sense(&mut b, 1, &[0; 6]), conflict);
    assert_eq!(status_and_sense(&mut b, 2, &reserve), conflict);
    assert_eq!(status_and_sense(&mut b, 3, &[0x12, 0, 0, 0, 36, 0]).0, 0);
    // Ending task sets is no reset.
    tmf_done(&mut a, 2, 2);
    tmf_done(&mut a, 3, 4);
    assert_eq!(
        status_and_sense(&mut b, 4, &[0; 6]),
        (2, [0x06, 0x2f, 0x00]),
        "told of the CLEAR TASK SET"
    );
    assert_eq!(status_and_sense(&mut b, 5, &[0; 6]), conflict);
    // LUN RESET ends it (both nexuses are told of the reset first).
    tmf_done(&mut a, 4, 5);
    assert_eq!(status_and_sense(&mut b, 6, &[0; 6]).1, [0x06, 0x29, 0x03]);
    assert_eq!(status_and_sense(&mut a, 5, &[0; 6]).1, [0x06, 0x29, 0x03]);
    b.tur_good(7);
    // So does TARGET WARM RESET.
    assert_eq!(status_and_sense(&mut b, 8, &reserve), good);
    assert_eq!(status_and_sense(&mut a, 6, &[0; 6]), conflict);
    tmf_done(&mut a, 7, 6);
    assert_eq!(status_and_sense(&mut a, 8, &[0; 6]).1, [0x06, 0x29, 0x03]);
    assert_eq!(status_and_sense(&mut b, 9, &[0; 6]).1, [0x06, 0x29, 0x03]);
    a.tur_good(9);
    // A login with B's ISID reinstates B's session: the old one is
    // closed and the reservation it held ends.
    assert_eq!(status_and_sense(&mut b, 10, &reserve), good);
    assert_eq!(status_and_sense(&mut a, 10, &[0; 6]), conflict);
    let mut b2 = login_isid(addr, 2);
    assert!(b.closed(), "the reinstated session is closed");
    a.tur_good(11);
    // The holder's last session ending ends it too.
    assert_eq!(status_and_sense(&mut b2, 1, &reserve), good);
    assert_eq!(status_and_sense(&mut a, 12, &[0; 6]), conflict);
    drop(b2);
    until_unreserved(&mut a, 13);
}

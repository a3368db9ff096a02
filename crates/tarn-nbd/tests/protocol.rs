//! The protocol over a real socket, byte by byte: handshakes good and
//! bad, requests good and bad, pipelining, disconnects, several
//! connections, live export changes, limits. After every kind of bad
//! input the same server still serves a well-behaved client.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_nbd::proto::{self, client, cmd, cmd_flag, errno, opt, rep, tx};
use tarn_nbd::{NbdConfig, NbdExport, Running};
use tarn_vol::testing::MemDevice;
use tarn_vol::Device;

fn mem(size: u64) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(size, 4096))
}

fn server() -> (Running, Arc<MemDevice>) {
    let dev = mem(8 * MIB);
    let r = start(vec![NbdExport::new("disk", dev.clone())]);
    (r, dev)
}

/// A well-behaved session still works: write, read back, disconnect.
fn still_serves(addr: SocketAddr) {
    let mut c = Raw::open(addr, "disk");
    let data = pattern(99, 4096);
    assert_eq!(c.write(4096, &data), 0);
    assert_eq!(c.read(4096, 4096), Ok(data));
    c.disconnect();
}

// ----- handshake -------------------------------------------------------------

#[test]
fn garbage_instead_of_client_flags_closes_only_that_connection() {
    let (r, _) = server();
    let mut c = Raw::greeted(r.local_addr());
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(c.closed());
    still_serves(r.local_addr());
}

#[test]
fn clients_without_fixed_newstyle_or_with_unknown_flags_are_refused() {
    let (r, _) = server();
    for flags in [0u32, client::NO_ZEROES, client::FIXED_NEWSTYLE | 4] {
        let mut c = Raw::greeted(r.local_addr());
        c.send(&flags.to_be_bytes());
        // The server may not even read an option: it hangs up.
        assert!(c.closed(), "client flags {flags:#x}");
    }
    still_serves(r.local_addr());
}

#[test]
fn wrong_option_magic_closes() {
    let (r, _) = server();
    let mut c = Raw::connect(r.local_addr());
    let mut b = b"IHAVEOPX".to_vec();
    b.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 0]);
    c.send(&b);
    assert!(c.closed());
    still_serves(r.local_addr());
}

#[test]
fn oversized_option_is_too_big_and_closes() {
    let (r, _) = server();
    let mut c = Raw::connect(r.local_addr());
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt::GO.to_be_bytes());
    b.extend_from_slice(&(1u32 << 30).to_be_bytes());
    c.send(&b);
    let reply = c.option_reply();
    assert_eq!((reply.option, reply.kind), (opt::GO, rep::ERR_TOO_BIG));
    assert!(c.closed());
    still_serves(r.local_addr());
}

/// An export whose device is closed (its volume being rolled back or
/// destroyed) is not offered: a client negotiating meanwhile is told it
/// is unknown, to try again, rather than get an empty disk.
#[test]
fn a_closed_device_is_not_offered() {
    let (r, dev) = server();
    let mut c = Raw::connect(r.local_addr());
    dev.close();
    assert_eq!(c.go("disk"), Err(rep::ERR_UNKNOWN));
    let listed = c.option(opt::LIST, &[]);
    assert!(
        listed.iter().all(|r| r.kind != rep::SERVER),
        "a closed export was listed"
    );
}

#[test]
fn unknown_malformed_and_misnamed_options_get_errors_and_negotiation_goes_on() {
    let (r, _) = server();
    let mut c = Raw::connect(r.local_addr());
    // Unknown option with data: skipped, UNSUP.
    assert_eq!(c.option(4242, &[7; 100])[0].kind, rep::ERR_UNSUP);
    // A GO whose name runs past the option: INVALID.
    assert_eq!(
        c.option(opt::GO, &[0, 0, 1, 0, b'x'])[0].kind,
        rep::ERR_INVALID
    );
    // LIST with data: INVALID.
    assert_eq!(c.option(opt::LIST, &[1])[0].kind, rep::ERR_INVALID);
    // Unknown export; the empty name without a default export.
    assert_eq!(c.go("nope"), Err(rep::ERR_UNKNOWN));
    assert_eq!(c.go(""), Err(rep::ERR_UNKNOWN));
    // STARTTLS on a server without TLS.
    assert_eq!(c.option(opt::STARTTLS, &[])[0].kind, rep::ERR_POLICY);
    // Block status context without structured replies: INVALID.
    let m = meta_payload("disk", &["base:allocation"]);
    assert_eq!(
        c.option(opt::SET_META_CONTEXT, &m)[0].kind,
        rep::ERR_INVALID
    );
    // And after all that, a good GO.
    let (size, flags) = c.go("disk").unwrap();
    assert_eq!(size, 8 * MIB);
    assert_eq!(
        flags,
        tx::HAS_FLAGS
            | tx::SEND_FLUSH
            | tx::SEND_FUA
            | tx::SEND_TRIM
            | tx::SEND_WRITE_ZEROES
            | tx::SEND_FAST_ZERO
            | tx::SEND_CACHE
            | tx::CAN_MULTI_CONN
    );
    assert_eq!(c.write(0, b"ok"), 0);
    c.disconnect();
}

#[test]
fn export_name_with_and_without_zeroes_and_unknown() {
    let (r, _) = server();
    // With the zeroes.
    let mut c = Raw::greeted(r.local_addr());
    c.send(&client::FIXED_NEWSTYLE.to_be_bytes());
    c.send_option(opt::EXPORT_NAME, b"disk");
    let b = c.read_n(134);
    assert_eq!(u64::from_be_bytes(b[..8].try_into().unwrap()), 8 * MIB);
    assert!(b[10..].iter().all(|&x| x == 0));
    assert_eq!(c.write(0, b"z"), 0, "transmission follows the zeroes");
    // Without.
    let mut c = Raw::connect(r.local_addr());
    c.send_option(opt::EXPORT_NAME, b"disk");
    let b = c.read_n(10);
    assert_eq!(u16::from_be_bytes([b[8], b[9]]) & tx::HAS_FLAGS, 1);
    assert_eq!(c.read(0, 1), Ok(b"z".to_vec()));
    // Unknown: no way to say so but hanging up.
    let mut c = Raw::connect(r.local_addr());
    c.send_option(opt::EXPORT_NAME, b"nope");
    assert!(c.closed());
    still_serves(r.local_addr());
}

#[test]
fn abort_is_acknowledged() {
    let (r, _) = server();
    let mut c = Raw::connect(r.local_addr());
    assert_eq!(c.option(opt::ABORT, &[])[0].kind, rep::ACK);
    assert!(c.closed());
}

#[test]
fn default_export_and_info_items() {
    let dev = mem(MIB);
    let mut e = NbdExport::new("main", dev);
    e.description = Some("the main disk".into());
    let r = start_with(
        NbdConfig {
            default_export: Some("main".into()),
            ..NbdConfig::default()
        },
        vec![e],
    );
    let mut c = Raw::connect(r.local_addr());
    let rs = c.option(
        opt::INFO,
        &info_payload("", &[proto::info::NAME, proto::info::DESCRIPTION]),
    );
    let item = |t: u16| {
        rs.iter()
            .find(|x| x.kind == rep::INFO && x.data[..2] == t.to_be_bytes())
            .map(|x| x.data[2..].to_vec())
    };
    assert_eq!(item(proto::info::NAME).as_deref(), Some(&b"main"[..]));
    assert_eq!(
        item(proto::info::DESCRIPTION).as_deref(),
        Some(&b"the main disk"[..])
    );
    let bs = item(proto::info::BLOCK_SIZE).expect("block sizes");
    assert_eq!(&bs[..4], &1u32.to_be_bytes());
    assert_eq!(&bs[4..8], &4096u32.to_be_bytes());
    assert_eq!(&bs[8..12], &(32u32 << 20).to_be_bytes());
    assert_eq!(
        c.go(""),
        Ok((
            MIB,
            tx::HAS_FLAGS
                | tx::SEND_FLUSH
                | tx::SEND_FUA
                | tx::SEND_TRIM
                | tx::SEND_WRITE_ZEROES
                | tx::SEND_FAST_ZERO
                | tx::SEND_CACHE
                | tx::CAN_MULTI_CONN
        ))
    );
}

#[test]
fn a_silent_client_is_closed_after_the_handshake_timeout() {
    let r = start_with(
        NbdConfig {
            handshake_timeout: Duration::from_millis(300),
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", mem(MIB))],
    );
    let t = Instant::now();
    let mut c = Raw::connect(r.local_addr());
    assert!(c.closed());
    assert!(t.elapsed() < Duration::from_secs(5));
    // A handshake that finishes in time is not cut short later.
    let mut c = Raw::open(r.local_addr(), "disk");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(c.write(0, b"late"), 0);
}

// ----- transmission ---------------------------------------------------------

#[test]
fn read_past_the_end_is_einval_and_the_connection_stays_usable() {
    let (r, _) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    assert_eq!(c.read(8 * MIB - 2, 4), Err(errno::EINVAL));
    assert_eq!(c.read(u64::MAX - 1, 4), Err(errno::EINVAL));
    assert_eq!(c.read(8 * MIB - 4, 4), Ok(vec![0; 4]));
    // Trim and block status past the end are EINVAL, writes ENOSPC.
    assert_eq!(c.command(cmd::TRIM, 0, 8 * MIB, 1), errno::EINVAL);
    assert_eq!(c.command(cmd::WRITE_ZEROES, 0, 8 * MIB, 1), errno::ENOSPC);
    assert_eq!(c.write(8 * MIB - 1, &[1, 2]), errno::ENOSPC);
    assert_eq!(c.write(0, &[1, 2]), 0, "the rejected payload was skipped");
    // Same with structured replies: errors come as error chunks.
    let mut c = Raw::open_structured(r.local_addr(), "disk");
    assert_eq!(c.read_structured(8 * MIB, 1, 0), Err(errno::EINVAL));
    assert_eq!(c.read_structured(0, 2, 0), Ok(vec![1, 2]));
    c.disconnect();
}

/// A connection's writes of whole blocks run one after the other on a
/// thread of their own, and writes into part of a block (they may read
/// the old block first) and FUA writes (they wait for the intent log) on
/// the blocking pool; every one lands. A write
/// whose device call panics loses its reply (as on the pool) but not the
/// thread: the writes after it on the same connection are carried out
/// and answered.
#[test]
fn whole_block_writes_run_on_the_connections_write_thread() {
    let dev = Probe::new(MIB, 4096);
    let r = start(vec![NbdExport::new("vol", dev.clone())]);
    let mut c = Raw::open(r.local_addr(), "vol");
    let mut model = vec![0u8; MIB as usize];
    let writes: [(u64, usize); 6] = [
        (0, 4096),
        (3 * 4096, 8192),
        (100, 512),
        (8192, 4096),
        (4096 + 7, 4096),
        // Aligned to 512 bytes, not to the block.
        (6 * 4096 + 512, 512),
    ];
    for (i, &(off, len)) in writes.iter().enumerate() {
        let data = pattern(i as u64 + 1, len);
        assert_eq!(c.write(off, &data), 0, "write of {len} at {off}");
        model[off as usize..off as usize + len].copy_from_slice(&data);
    }
    assert_eq!(
        c.read(0, MIB as u32),
        Ok(model.clone()),
        "every write landed"
    );
    let on_thread = |off: u64| {
        dev.write_threads
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(o, _)| *o == off)
            .map(|(_, name)| name.as_deref() == Some("tarn-nbd-writes"))
            .expect("the write reached the device")
    };
    for (off, len) in writes {
        let whole = off % 4096 == 0 && len % 4096 == 0;
        assert_eq!(on_thread(off), whole, "write of {len} at {off}");
    }
    // A FUA write of a whole block goes to the pool (it waits for the
    // intent log there, beside others).
    let fua = pattern(11, 4096);
    c.request(cmd::WRITE, cmd_flag::FUA, 5, 30 * 4096, 4096, &fua);
    assert_eq!(c.status(), (5, 0));
    assert!(!on_thread(30 * 4096), "a FUA write on the write thread");
    assert_eq!(Probe::get(&dev.fua_writes), 1);
    // A panicking write, then another on the same connection: the first
    // fails with EIO (its client is not left waiting), the next works.
    *dev.panic_at.lock().unwrap() = Some(16 * 4096);
    c.request(cmd::WRITE, 0, 7, 16 * 4096, 4096, &pattern(9, 4096));
    let data = pattern(10, 4096);
    c.request(cmd::WRITE, 0, 8, 20 * 4096, 4096, &data);
    assert_eq!(
        c.status(),
        (7, errno::EIO),
        "the panicking write is answered"
    );
    assert_eq!(c.status(), (8, 0), "the write after the panic is answered");
    assert!(on_thread(20 * 4096), "on the same thread, which lived on");
    model[20 * 4096..21 * 4096].copy_from_slice(&data);
    *dev.panic_at.lock().unwrap() = None;
    // Only the panicking write failed: a new connection sees everything
    // else.
    drop(c);
    let mut c = Raw::open(r.local_addr(), "vol");
    let got = c.read(0, MIB as u32).expect("read");
    assert!(
        got[20 * 4096..21 * 4096] == data[..],
        "written after the panic"
    );
    assert!(
        got[..16 * 4096] == model[..16 * 4096],
        "the writes before it"
    );
    assert!(got[30 * 4096..31 * 4096] == fua[..], "the FUA write");
    c.disconnect();
}

#[test]
fn writes_to_read_only_exports_are_eperm() {
    let dev = mem(MIB);
    let mut shared = NbdExport::new("ro-share", dev.clone());
    shared.read_only = true;
    let ro_dev = Arc::new(MemDevice::new(MIB, 4096).read_only());
    let r = start(vec![shared, NbdExport::new("ro-dev", ro_dev)]);
    for name in ["ro-share", "ro-dev"] {
        let mut c = Raw::connect(r.local_addr());
        let (_, flags) = c.go(name).unwrap();
        assert_ne!(flags & tx::READ_ONLY, 0, "{name} is advertised read-only");
        assert_eq!(c.write(0, &[1; 512]), errno::EPERM, "{name}");
        assert_eq!(c.command(cmd::TRIM, 0, 0, 512), errno::EPERM);
        assert_eq!(c.command(cmd::WRITE_ZEROES, 0, 0, 512), errno::EPERM);
        assert_eq!(c.command(cmd::FLUSH, 0, 0, 0), 0, "a flush is harmless");
        assert_eq!(c.read(0, 512), Ok(vec![0; 512]), "still usable");
        c.disconnect();
    }
    assert!(dev.contents().iter().all(|&b| b == 0));
}

#[test]
fn unknown_commands_and_flags_are_einval() {
    let (r, _) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    assert_eq!(c.command(9, 0, 0, 0), errno::EINVAL);
    assert_eq!(c.command(0xffff, 0, 0, 4096), errno::EINVAL);
    assert_eq!(c.command(cmd::FLUSH, 1 << 9, 0, 0), errno::EINVAL);
    assert_eq!(
        c.command(cmd::TRIM, cmd_flag::NO_HOLE, 0, 4096),
        errno::EINVAL
    );
    // DF without structured replies is not defined either.
    assert_eq!(c.command(cmd::READ, cmd_flag::DF, 0, 16), errno::EINVAL);
    // Block status without a selected context.
    assert_eq!(c.command(cmd::BLOCK_STATUS, 0, 0, 4096), errno::EINVAL);
    // Cache is fine.
    assert_eq!(c.command(cmd::CACHE, 0, 0, 4096), 0);
    // A write with an undefined flag: refused, its payload skipped.
    c.request(cmd::WRITE, cmd_flag::REQ_ONE, 9, 0, 3, b"abc");
    assert_eq!(c.status(), (9, errno::EINVAL));
    assert_eq!(c.read(0, 3), Ok(vec![0; 3]));
    c.disconnect();
}

#[test]
fn oversized_requests() {
    let dev = mem(64 * MIB);
    let r = start_with(
        NbdConfig {
            max_payload: 64 << 10,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", dev.clone())],
    );
    let mut c = Raw::open(r.local_addr(), "disk");
    // A read over the maximum: EINVAL (simple replies), nothing sent.
    assert_eq!(c.read(0, 128 << 10), Err(errno::EINVAL));
    // A write over the maximum but under 32 MiB: skipped, EINVAL.
    assert_eq!(c.write(0, &vec![1; 128 << 10]), errno::EINVAL);
    assert_eq!(
        c.read(0, 4),
        Ok(vec![0; 4]),
        "nothing written, still in step"
    );
    // Commands without payload may be longer than the maximum.
    assert_eq!(c.command(cmd::WRITE_ZEROES, 0, 0, 32 << 20), 0);
    assert_eq!(c.command(cmd::TRIM, 0, 0, 32 << 20), 0);
    // With structured replies an oversized read is EOVERFLOW.
    let mut s = Raw::open_structured(r.local_addr(), "disk");
    assert_eq!(s.read_structured(0, 1 << 20, 0), Err(errno::EOVERFLOW));
    // A write announcing more than can be skipped closes the connection.
    let mut c = Raw::open(r.local_addr(), "disk");
    c.request(cmd::WRITE, 0, 1, 0, (32 << 20) + 1, &[]);
    assert!(c.closed());
    still_serves(r.local_addr());
}

#[test]
fn bad_request_magic_closes() {
    let (r, _) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    c.send(&[0x25, 0x60, 0x95, 0x14]);
    c.send(&[0; 24]);
    assert!(c.closed());
    still_serves(r.local_addr());
}

#[test]
fn truncated_payload_then_close_changes_nothing() {
    let (r, dev) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    c.request(cmd::WRITE, 0, 1, 0, 65536, &[0xee; 1000]);
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    assert!(dev.contents()[..65536].iter().all(|&b| b == 0));
    still_serves(r.local_addr());
    // Garbage after a good handshake, then hang-up.
    let mut c = Raw::open(r.local_addr(), "disk");
    c.send(&proto::REQUEST_MAGIC.to_be_bytes());
    c.send(&[1, 2, 3]);
    drop(c);
    still_serves(r.local_addr());
}

#[test]
fn zero_length_requests_succeed() {
    let (r, _) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    assert_eq!(c.read(0, 0), Ok(vec![]));
    assert_eq!(c.write(8 * MIB, &[]), 0);
    assert_eq!(c.command(cmd::TRIM, 0, 0, 0), 0);
    assert_eq!(c.command(cmd::WRITE_ZEROES, 0, 0, 0), 0);
    let mut s = Raw::open_structured(r.local_addr(), "disk");
    assert_eq!(s.read_structured(0, 0, 0), Ok(vec![]));
    assert_eq!(s.command(cmd::BLOCK_STATUS, 0, 0, 0), errno::EINVAL);
}

#[test]
fn structured_reads_send_data_or_holes() {
    let (r, dev) = server();
    dev.write(4096, &pattern(1, 4096), false).unwrap();
    let mut c = Raw::open_structured(r.local_addr(), "disk");
    // All zeros: one hole chunk.
    c.request(cmd::READ, 0, 11, 65536, 8192, &[]);
    let Answer::Chunk(ch) = c.answer() else {
        panic!()
    };
    assert_eq!(
        (ch.kind, ch.flags, ch.cookie),
        (proto::reply::TYPE_OFFSET_HOLE, proto::reply::FLAG_DONE, 11)
    );
    assert_eq!(&ch.payload[..8], &65536u64.to_be_bytes());
    assert_eq!(&ch.payload[8..], &8192u32.to_be_bytes());
    // Data and zeros: one data chunk, also with DF.
    for flags in [0, cmd_flag::DF] {
        c.request(cmd::READ, flags, 12, 0, 8192, &[]);
        let Answer::Chunk(ch) = c.answer() else {
            panic!()
        };
        assert_eq!(
            (ch.kind, ch.flags),
            (proto::reply::TYPE_OFFSET_DATA, proto::reply::FLAG_DONE)
        );
        assert_eq!(&ch.payload[..8], &0u64.to_be_bytes());
        assert!(ch.payload[8..4104].iter().all(|&b| b == 0));
        assert_eq!(&ch.payload[4104..], &pattern(1, 4096)[..]);
    }
    // Writes still get simple replies.
    assert_eq!(c.write(0, &[5]), 0);
}

#[test]
fn block_status_reports_holes_and_data() {
    let (r, dev) = server();
    dev.write(8192, &[1; 4096], false).unwrap();
    let mut c = Raw::open_structured(r.local_addr(), "disk");
    let status = |c: &mut Raw, flags, off, len| {
        c.request(cmd::BLOCK_STATUS, flags, 21, off, len, &[]);
        let Answer::Chunk(ch) = c.answer() else {
            panic!()
        };
        assert_eq!(
            (ch.kind, ch.flags),
            (proto::reply::TYPE_BLOCK_STATUS, proto::reply::FLAG_DONE)
        );
        assert_eq!(&ch.payload[..4], &proto::BASE_ALLOCATION_ID.to_be_bytes());
        ch.payload[4..]
            .chunks(8)
            .map(|d| {
                (
                    u32::from_be_bytes(d[..4].try_into().unwrap()),
                    u32::from_be_bytes(d[4..].try_into().unwrap()),
                )
            })
            .collect::<Vec<_>>()
    };
    let hz = proto::STATE_HOLE | proto::STATE_ZERO;
    assert_eq!(
        status(&mut c, 0, 0, 65536),
        [(8192, hz), (4096, 0), (65536 - 12288, hz)]
    );
    assert_eq!(status(&mut c, cmd_flag::REQ_ONE, 0, 65536), [(8192, hz)]);
    assert_eq!(status(&mut c, cmd_flag::REQ_ONE, 8192, 100), [(100, 0)]);
    // After a trim the block is a hole again.
    assert_eq!(c.command(cmd::TRIM, 0, 8192, 4096), 0);
    assert_eq!(status(&mut c, 0, 0, 65536), [(65536, hz)]);
    // Past the end: EINVAL as an error chunk.
    assert_eq!(c.command(cmd::BLOCK_STATUS, 0, 8 * MIB, 1), errno::EINVAL);
}

#[test]
fn pipelined_requests_are_answered_by_cookie() {
    let (r, dev) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    // 64 writes sent back to back, then 64 reads, without waiting.
    let mut batch = Vec::new();
    for i in 0..64u64 {
        let data = pattern(i, 4096);
        batch.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        batch.extend_from_slice(&[0, 0, 0, cmd::WRITE as u8]);
        batch.extend_from_slice(&(1000 + i).to_be_bytes());
        batch.extend_from_slice(&(i * 8192).to_be_bytes());
        batch.extend_from_slice(&4096u32.to_be_bytes());
        batch.extend_from_slice(&data);
    }
    c.s.write_all(&batch).unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let (cookie, e) = c.status();
        assert_eq!(e, 0);
        assert!((1000..1064).contains(&cookie) && seen.insert(cookie));
    }
    for i in 0..64u64 {
        assert!(dev.contents()[(i * 8192) as usize..][..4096] == pattern(i, 4096)[..]);
    }
    for i in 0..64u64 {
        c.request(cmd::READ, 0, 2000 + i, i * 8192, 4096, &[]);
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..64 {
        let Answer::Simple { errno: 0, cookie } = c.answer() else {
            panic!()
        };
        let data = c.read_n(4096);
        assert!(seen.insert(cookie));
        assert_eq!(
            data,
            pattern(cookie - 2000, 4096),
            "reply matched by cookie"
        );
    }
    c.disconnect();
}

#[test]
fn disconnect_waits_for_requests_in_flight() {
    let dev = Probe::new(4 * MIB, 4096);
    *dev.write_delay.lock().unwrap() = Duration::from_millis(300);
    let r = start(vec![NbdExport::new("slow", dev.clone())]);
    let mut c = Raw::open(r.local_addr(), "slow");
    for i in 0..4u64 {
        c.request(cmd::WRITE, 0, i, i * 4096, 4096, &[i as u8 + 1; 4096]);
    }
    c.request(cmd::DISC, 0, 99, 0, 0, &[]);
    let mut cookies: Vec<u64> = (0..4)
        .map(|_| c.status())
        .map(|(ck, e)| {
            assert_eq!(e, 0);
            ck
        })
        .collect();
    cookies.sort();
    assert_eq!(
        cookies,
        [0, 1, 2, 3],
        "every write answered before the close"
    );
    assert!(c.closed());
    assert_eq!(Probe::get(&dev.writes), 4);
    for i in 0..4usize {
        assert!(dev.mem.contents()[i * 4096..][..4096]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
}

#[test]
fn fua_and_flush_reach_the_device() {
    let dev = Probe::new(MIB, 4096);
    let r = start(vec![NbdExport::new("d", dev.clone())]);
    let mut c = Raw::open(r.local_addr(), "d");
    c.request(cmd::WRITE, cmd_flag::FUA, 1, 0, 3, b"fua");
    assert_eq!(c.status(), (1, 0));
    assert_eq!(Probe::get(&dev.fua_writes), 1);
    assert_eq!(
        c.command(
            cmd::WRITE_ZEROES,
            cmd_flag::FUA | cmd_flag::NO_HOLE,
            4096,
            4096
        ),
        0
    );
    assert_eq!(Probe::get(&dev.fua_writes), 2);
    let before = dev.mem.flushes();
    assert_eq!(c.command(cmd::FLUSH, 0, 0, 0), 0);
    assert_eq!(dev.mem.flushes(), before + 1);
    assert_eq!(c.command(cmd::TRIM, cmd_flag::FUA, 0, 4096), 0);
    assert_eq!(
        dev.mem.flushes(),
        before + 2,
        "a trim with FUA is followed by a flush"
    );
}

#[test]
fn two_connections_write_disjoint_halves_then_one_flushes() {
    let dev = mem(16 * MIB);
    let r = start(vec![NbdExport::new("disk", dev.clone())]);
    let addr = r.local_addr();
    let half = 8 * MIB;
    let writers: Vec<_> = (0..2u64)
        .map(|h| {
            std::thread::spawn(move || {
                let mut c = Raw::open(addr, "disk");
                for i in 0..(half / (256 << 10)) {
                    let off = h * half + i * (256 << 10);
                    assert_eq!(c.write(off, &pattern(off, 256 << 10)), 0);
                }
                c
            })
        })
        .collect();
    let mut conns: Vec<Raw> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let before = dev.flushes();
    assert_eq!(conns[0].command(cmd::FLUSH, 0, 0, 0), 0);
    assert_eq!(dev.flushes(), before + 1);
    let c = dev.contents();
    for h in 0..2u64 {
        for i in 0..(half / (256 << 10)) {
            let off = h * half + i * (256 << 10);
            assert!(
                c[off as usize..][..256 << 10] == pattern(off, 256 << 10)[..],
                "at {off}"
            );
        }
    }
    // Each connection sees the other's writes.
    assert_eq!(conns[1].read(0, 16), Ok(pattern(0, 16)));
    assert_eq!(conns[0].read(half, 16), Ok(pattern(half, 16)));
    for c in conns {
        c.disconnect();
    }
}

// ----- exports, limits, stop ----------------------------------------------------

#[test]
fn set_exports_is_live_and_ends_only_the_sessions_it_revokes() {
    let old = mem(MIB);
    old.write(0, b"old", false).unwrap();
    let extra = mem(MIB);
    let lan = |dev: Arc<MemDevice>, net: &str| {
        let mut e = NbdExport::new("lan", dev);
        e.clients = vec![net.parse().unwrap()];
        e
    };
    let shared = mem(MIB);
    let r = start(vec![
        NbdExport::new("disk", old.clone()),
        NbdExport::new("extra", extra.clone()),
        lan(shared.clone(), "127.0.0.0/8"),
    ]);
    let mut before = Raw::open(r.local_addr(), "disk");
    let mut kept = Raw::open(r.local_addr(), "extra");
    let mut narrowed = Raw::open(r.local_addr(), "lan");
    // A client negotiating across the change sees the new list.
    let mut negotiating = Raw::connect(r.local_addr());
    let new = mem(2 * MIB);
    new.write(0, b"new", false).unwrap();
    let mut ro = NbdExport::new("disk", new.clone());
    ro.read_only = true;
    r.set_exports(vec![
        ro,
        NbdExport::new("extra", extra.clone()),
        lan(shared.clone(), "10.0.0.0/8"),
    ])
    .unwrap();
    // "disk" is another device now, "lan" no longer admits this client:
    // their sessions end; "extra" is unchanged and its session goes on.
    assert!(before.closed(), "a session of a replaced export went on");
    assert!(
        narrowed.closed(),
        "a session outside the new networks went on"
    );
    assert_eq!(kept.write(0, b"kept"), 0);
    assert_eq!(kept.read(0, 4), Ok(b"kept".to_vec()));
    let (size, flags) = negotiating.go("disk").unwrap();
    assert_eq!(size, 2 * MIB);
    assert_ne!(flags & tx::READ_ONLY, 0);
    assert_eq!(negotiating.read(0, 3), Ok(b"new".to_vec()));
    let mut c = Raw::connect(r.local_addr());
    let names: Vec<Vec<u8>> = c
        .option(opt::LIST, &[])
        .iter()
        .filter(|x| x.kind == rep::SERVER)
        .map(|x| x.data[4..].to_vec())
        .collect();
    assert_eq!(names, [b"disk".to_vec(), b"extra".to_vec()]);
    // Bad lists are refused and leave the current one in place.
    assert!(r
        .set_exports(vec![
            NbdExport::new("a", mem(MIB)),
            NbdExport::new("a", mem(MIB))
        ])
        .is_err());
    assert_eq!(c.go("extra").map(|x| x.0), Ok(MIB));
    assert_eq!(&old.contents()[..3], b"old");
    assert_eq!(kept.read(0, 4), Ok(b"kept".to_vec()));
}

#[test]
fn per_address_limit_refuses_extra_connections() {
    let r = start_with(
        NbdConfig {
            max_connections_per_address: 2,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", mem(MIB))],
    );
    let a = Raw::open(r.local_addr(), "disk");
    let b = Raw::open(r.local_addr(), "disk");
    let mut s = std::net::TcpStream::connect(r.local_addr()).unwrap();
    assert!(tarn_testkit::net::closed_within(
        &mut s,
        Duration::from_secs(10)
    ));
    assert_eq!(r.stats().refused_per_address, 1);
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.stats().open > 0 {
        assert!(
            Instant::now() < deadline,
            "closed connections free their slots"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    still_serves(r.local_addr());
}

#[test]
fn stop_answers_requests_in_flight_and_frees_the_port() {
    let dev = Probe::new(MIB, 4096);
    *dev.write_delay.lock().unwrap() = Duration::from_millis(300);
    let r = start(vec![NbdExport::new("slow", dev.clone())]);
    let addr = r.local_addr();
    let mut c = Raw::open(addr, "slow");
    c.request(cmd::WRITE, 0, 7, 0, 4, b"last");
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    r.stop();
    assert!(t.elapsed() < Duration::from_secs(9));
    assert_eq!(c.status(), (7, 0), "the write in flight was answered");
    assert!(c.closed());
    assert_eq!(&dev.mem.contents()[..4], b"last");
    assert!(
        std::net::TcpListener::bind(addr).is_ok(),
        "the port is free"
    );
}

#[test]
fn config_is_checked() {
    let bad = [
        NbdConfig {
            max_payload: 100,
            ..NbdConfig::default()
        },
        NbdConfig {
            max_inflight_bytes_per_connection: 1 << 20,
            ..NbdConfig::default()
        },
        NbdConfig {
            tls_required: true,
            ..NbdConfig::default()
        },
    ];
    for cfg in bad {
        let cfg = NbdConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            ..cfg
        };
        assert!(tarn_nbd::NbdServer::start(cfg, vec![]).is_err());
    }
}

#[test]
fn a_small_memory_budget_still_serves_every_command() {
    // Block status counts 2 MiB against the budget; with a budget smaller
    // than that it must take the whole budget, not wait forever.
    let dev = mem(MIB);
    let r = start_with(
        NbdConfig {
            max_payload: 4096,
            max_inflight_bytes_per_connection: 4096,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", dev)],
    );
    let mut c = Raw::open_structured(r.local_addr(), "disk");
    for _ in 0..4 {
        c.request(cmd::BLOCK_STATUS, 0, 1, 0, MIB as u32, &[]);
        c.request(cmd::READ, 0, 2, 0, 4096, &[]);
    }
    for _ in 0..8 {
        let Answer::Chunk(ch) = c.answer() else {
            panic!()
        };
        assert!(
            ch.kind == proto::reply::TYPE_BLOCK_STATUS || ch.kind == proto::reply::TYPE_OFFSET_HOLE,
            "{ch:?}"
        );
    }
    c.disconnect();
}

#[test]
fn an_export_exists_only_for_the_client_networks_it_names() {
    let mut disk = NbdExport::new("disk", mem(MIB));
    disk.clients = vec!["127.0.0.2/32".parse().expect("a network")];
    let r = start(vec![disk, NbdExport::new("open", mem(MIB))]);
    let from = |last: u8| {
        let s = tarn_testkit::net::connect_from([127, 0, 0, last], r.local_addr())
            .expect("connect from a loopback address");
        Raw::greeted_over(s)
    };
    // Outside: not listed, unknown to GO, and the session that does
    // exist for it still works.
    let mut c = from(3);
    c.send(&client::FIXED_NEWSTYLE.to_be_bytes());
    let listed = c.option(opt::LIST, &[]);
    let names: Vec<Vec<u8>> = listed
        .iter()
        .filter(|o| o.kind == rep::SERVER)
        .map(|o| o.data[4..].to_vec())
        .collect();
    assert_eq!(names, [b"open".to_vec()], "only the open export is listed");
    assert_eq!(c.go("disk"), Err(rep::ERR_UNKNOWN));
    // Inside: served.
    let mut c = from(2);
    c.send(&client::FIXED_NEWSTYLE.to_be_bytes());
    assert!(c.go("disk").is_ok());
    assert_eq!(c.write(0, b"in"), 0);
    assert_eq!(c.read(0, 2), Ok(b"in".to_vec()));
}

/// An export removed the moment a client's `NBD_OPT_GO` is answered still
/// ends that session: the change can land between the handshake and the
/// session's subscription to changes. Many rounds, because the window is
/// a few microseconds wide.
#[test]
fn an_export_removed_right_after_go_ends_that_session() {
    let dev = mem(MIB);
    let r = start(vec![NbdExport::new("disk", dev.clone())]);
    for round in 0..200 {
        let mut s = Raw::open(r.local_addr(), "disk");
        r.set_exports(Vec::new()).unwrap();
        assert!(s.closed(), "round {round}: the session went on");
        r.set_exports(vec![NbdExport::new("disk", dev.clone())])
            .unwrap();
    }
}

/// A request that comes with a revocation does not run: an export made
/// read-only while a client's `NBD_OPT_GO` is being answered, with a
/// write pipelined behind the GO, ends the session before the write. The
/// session's first look at the changes and the waiting write were once
/// picked between at random, so this runs many rounds.
#[test]
fn a_write_pipelined_behind_go_does_not_run_after_a_revocation() {
    let dev = Probe::new(MIB, 4096);
    let writable = || NbdExport::new("disk", dev.clone());
    let r = start(vec![writable()]);
    for round in 0..32u64 {
        // The GO waits in `read_only` while the export changes.
        *dev.read_only_delay.lock().unwrap() = Duration::from_millis(100);
        let mut c = Raw::connect(r.local_addr());
        c.send_option(opt::GO, &info_payload("disk", &[proto::info::BLOCK_SIZE]));
        c.request(cmd::WRITE, 0, 1, 0, 4096, &pattern(round, 4096));
        std::thread::sleep(Duration::from_millis(30));
        let mut read_only = writable();
        read_only.read_only = true;
        r.set_exports(vec![read_only]).unwrap();
        *dev.read_only_delay.lock().unwrap() = Duration::ZERO;
        // The GO's answer, then the end (a write's reply, had it run).
        assert!(c.closed(), "round {round}: the session went on");
        assert_eq!(
            Probe::get(&dev.writes),
            0,
            "round {round}: a write ran after its export was made read-only"
        );
        r.set_exports(vec![writable()]).unwrap();
    }
}

/// Negotiating clients never hold up the network threads: while their
/// options wait for the device (a volume asks its dataset whether it is
/// read-only, which waits while its pool commits a txg), a session
/// already in transmission keeps getting its reads answered from memory.
#[test]
fn slow_handshakes_do_not_stall_other_connections() {
    let dev = Probe::new(MIB, 4096);
    dev.from_memory
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = start(vec![NbdExport::new("disk", dev.clone())]);
    let addr = r.local_addr();
    let mut c = Raw::open(addr, "disk");
    assert_eq!(c.read(0, 4096).map(|b| b.len()), Ok(4096));
    *dev.read_only_delay.lock().unwrap() = Duration::from_secs(2);
    let joining: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut j = Raw::connect(addr);
                j.go("disk").map(|(size, _)| size)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut slowest = Duration::ZERO;
    for i in 0..20u64 {
        let t0 = Instant::now();
        assert_eq!(c.read(i * 4096, 4096).map(|b| b.len()), Ok(4096));
        slowest = slowest.max(t0.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        slowest < Duration::from_millis(700),
        "a read waited {slowest:?} behind handshakes"
    );
    for j in joining {
        assert_eq!(j.join().unwrap(), Ok(MIB));
    }
    *dev.read_only_delay.lock().unwrap() = Duration::ZERO;
    still_serves(addr);
}

/// `FAST_ZERO` over whole blocks zeroes them; over part of a block (which
/// a volume must read and write again) it is refused at once with
/// `ENOTSUP`, and nothing changes.
#[test]
fn fast_zero_over_part_of_a_block_is_refused_at_once() {
    let (r, dev) = server();
    let mut c = Raw::open(r.local_addr(), "disk");
    let data = pattern(5, 3 * 4096);
    assert_eq!(c.write(0, &data), 0);
    let zeroes = |c: &mut Raw, off: u64, len: u32| {
        c.command(cmd::WRITE_ZEROES, cmd_flag::FAST_ZERO, off, len)
    };
    assert_eq!(zeroes(&mut c, 100, 512), errno::ENOTSUP);
    assert_eq!(zeroes(&mut c, 4096, 4096 + 512), errno::ENOTSUP);
    assert_eq!(c.read(0, 3 * 4096), Ok(data.clone()), "nothing changed");
    assert_eq!(zeroes(&mut c, 4096, 4096), 0);
    let mut want = data;
    want[4096..8192].fill(0);
    assert_eq!(c.read(0, 3 * 4096), Ok(want));
    // Without the flag, part of a block is zeroed as asked.
    assert_eq!(c.command(cmd::WRITE_ZEROES, 0, 100, 512), 0);
    assert_eq!(dev.contents()[100..612], [0u8; 512]);
    still_serves(r.local_addr());
}

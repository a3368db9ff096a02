//! Hostile clients on loopback: crowds of idle and trickling connections
//! from several addresses (127.0.0.x), the idle timeout, and a client
//! that never reads its replies, while a well-behaved client keeps
//! working.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_nbd::proto::{self, client, cmd, opt};
use tarn_nbd::{NbdConfig, NbdExport};
use tarn_testkit::net::{closed_within, connect_from, idle_and_trickling, Trickle};
use tarn_vol::testing::MemDevice;
use tarn_vol::Device;

/// A client that greets, then announces a 1000-byte `NBD_OPT_GO` and
/// sends it a byte every 100 ms, never finishing.
fn trickle() -> Trickle {
    let mut head = (client::FIXED_NEWSTYLE | client::NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    head.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    head.extend_from_slice(&opt::GO.to_be_bytes());
    head.extend_from_slice(&1000u32.to_be_bytes());
    Trickle::new(&head, &[0])
}

/// 300 connection attempts from five addresses (half idle, half
/// trickling an option) and a good client doing 200 requests and
/// reconnecting every 20: it finishes within the bound, the table never
/// exceeds its limit, idle connections are evicted for newcomers and
/// nobody is refused for a full table.
#[test]
fn idle_and_slow_connections_do_not_lock_out_a_good_client() {
    const BOUND: Duration = Duration::from_secs(20);
    let dev = Arc::new(MemDevice::new(4 * MIB, 4096));
    let r = start_with(
        NbdConfig {
            max_connections: 64,
            max_connections_per_address: 16,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", dev)],
    );
    let addr = r.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let from = (0..300u32)
        .map(|i| [127, 0, 0, 2 + (i % 5) as u8])
        .collect();
    let attackers = idle_and_trickling(addr, from, trickle(), stop.clone());

    let start = Instant::now();
    let connect = || Raw::open_over(connect_from([127, 0, 0, 1], addr).unwrap(), "disk");
    let mut c = connect();
    for i in 0..200u64 {
        if i % 20 == 19 {
            // A newcomer must get in however full the table is.
            c = connect();
        }
        let data = pattern(i, 4096);
        assert_eq!(c.write(i * 4096, &data), 0, "request {i}");
        assert_eq!(c.read(i * 4096, 4096), Ok(data));
        let open = r.stats().open;
        assert!(open <= 64, "{open} connections open");
    }
    let took = start.elapsed();
    assert!(took < BOUND, "good client took {took:?}");
    stop.store(true, Ordering::Relaxed);
    attackers.join().unwrap();
    let st = r.stats();
    assert!(st.evicted > 0, "{st:?}");
    assert_eq!(
        st.refused_full, 0,
        "an idle connection was always there to close"
    );
}

/// The idle timeout closes a connection without requests and one that
/// trickles a write's payload, but never one with a request in flight.
#[test]
fn idle_timeout_spares_requests_in_flight() {
    let timeout = Duration::from_millis(800);
    let dev = Probe::new(4 * MIB, 4096);
    let r = start_with(
        NbdConfig {
            idle_timeout: timeout,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("slow", dev.clone())],
    );
    let addr = r.local_addr();
    let idle = Raw::open_over(connect_from([127, 0, 0, 2], addr).unwrap(), "slow");
    let mut slow = Raw::open_over(connect_from([127, 0, 0, 3], addr).unwrap(), "slow");
    // A write announcing 64 KiB whose payload comes a byte at a time.
    slow.request(cmd::WRITE, 0, 1, 0, 65536, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let t = Trickle::new(&[], &[1]).start(vec![slow.s.try_clone().unwrap()], stop.clone());

    *dev.write_delay.lock().unwrap() = timeout * 3;
    let mut c = Raw::open_over(connect_from([127, 0, 0, 1], addr).unwrap(), "slow");
    let started = Instant::now();
    assert_eq!(c.write(MIB, b"slow"), 0, "a slow write is answered");
    assert!(started.elapsed() >= timeout * 3);
    *dev.write_delay.lock().unwrap() = Duration::ZERO;
    assert_eq!(
        c.read(MIB, 4),
        Ok(b"slow".to_vec()),
        "and the connection still serves"
    );

    for (name, mut s) in [("idle", idle.s), ("trickling", slow.s)] {
        assert!(
            closed_within(&mut s, Duration::from_secs(10)),
            "{name} connection closed"
        );
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert!(
        dev.mem.contents()[..65536].iter().all(|&b| b == 0),
        "the partial write was dropped"
    );
    assert!(
        closed_within(&mut c.s, Duration::from_secs(10)),
        "once idle, it goes too"
    );
    assert!(r.stats().idle_closed >= 3, "{:?}", r.stats());
}

/// A server of `dev` as export "disk" that gives up a client taking no
/// reply byte for 500 ms.
fn with_short_reply_timeout(dev: Arc<MemDevice>) -> tarn_nbd::Running {
    start_with(
        NbdConfig {
            reply_timeout: Duration::from_millis(500),
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", dev)],
    )
}

/// A client that sends reads and never reads the replies is given up
/// after the reply timeout; the server does not wait on it forever.
#[test]
fn a_client_that_never_reads_replies_is_given_up() {
    let dev = Arc::new(MemDevice::new(64 * MIB, 4096));
    dev.write(0, &vec![0x42; 64 * MIB as usize], false).unwrap();
    let r = with_short_reply_timeout(dev);
    let mut c = Raw::open(r.local_addr(), "disk");
    let mut batch = Vec::new();
    for i in 0..64u64 {
        batch.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        batch.extend_from_slice(&[0, 0, 0, cmd::READ as u8]);
        batch.extend_from_slice(&i.to_be_bytes());
        batch.extend_from_slice(&(i * MIB).to_be_bytes());
        batch.extend_from_slice(&(MIB as u32).to_be_bytes());
    }
    c.s.write_all(&batch).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    // Whatever was sent before the server gave up is drained, then the
    // stream ends (it would not end if the server were still waiting).
    assert!(closed_within(&mut c.s, Duration::from_secs(10)));
    let mut ok = Raw::open(r.local_addr(), "disk");
    assert_eq!(ok.read(0, 2), Ok(vec![0x42, 0x42]));
}

/// A client that reads a large reply slowly but steadily is not given up
/// as one that stopped reading: the reply timeout judges progress, not
/// the time a whole batch of replies takes.
#[test]
fn a_client_that_reads_slowly_but_steadily_keeps_its_connection() {
    use std::io::Read;
    let dev = Arc::new(MemDevice::new(64 * MIB, 4096));
    dev.write(0, &vec![0x37; 32 * MIB as usize], false).unwrap();
    let r = with_short_reply_timeout(dev);
    let mut c = Raw::open(r.local_addr(), "disk");
    let len = 32 * MIB as u32;
    c.request(cmd::READ, 0, 7, 0, len, &[]);
    // About 8 MB/s: the whole reply takes about four seconds, each piece
    // a few milliseconds.
    let mut got = Vec::with_capacity(16 + len as usize);
    let mut buf = vec![0u8; 64 << 10];
    let t0 = Instant::now();
    while got.len() < 16 + len as usize {
        let n = c.s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the server closed the connection after {:?}",
            t0.elapsed()
        );
        got.extend_from_slice(&buf[..n]);
        std::thread::sleep(Duration::from_millis(8));
    }
    assert!(
        t0.elapsed() > Duration::from_secs(1),
        "the reply came too fast to test"
    );
    assert!(got[16..].iter().all(|b| *b == 0x37));
    assert_eq!(
        c.read(0, 2),
        Ok(vec![0x37, 0x37]),
        "the connection still serves"
    );
}

//! Hostile clients on loopback: hundreds of idle and trickling
//! connections from several addresses (127.0.0.x), clients from an
//! address no export lists, and the idle timeout — while a well-behaved
//! client keeps working.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_fs::testing::MemBackend;
use tarn_fs::Fs;
use tarn_nfs::{Export, NfsConfig, NfsServer, Running};
use tarn_testkit::net::{closed_within, connect_from, idle_and_trickling, Trickle};

const OK: u32 = 0;

/// Loopback addresses 127.0.0.0 - 127.0.0.7; 127.0.0.9 is listed nowhere.
fn exported(path: &str, fs: Arc<dyn tarn_nfs::ExportFs>) -> Export {
    let mut e = Export::new(path, fs, vec!["127.0.0.0/29".parse().unwrap()]);
    e.root_squash = false;
    e
}

fn server(cfg: NfsConfig, exports: Vec<Export>) -> Running {
    let cfg = NfsConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        mount_bind: None,
        ..cfg
    };
    NfsServer::start(cfg, exports).expect("server starts")
}

/// What a trickling connection sends: a header announcing a 1000-byte
/// last fragment, then the body one byte at a time, never complete.
fn trickle() -> Trickle {
    Trickle::new(&(1000u32 | 0x8000_0000).to_be_bytes(), &[0])
}

/// 300 connection attempts from five addresses (half idle, half trickling
/// a partial record), 50 from an address no export lists, and a good
/// client doing 200 calls and reconnecting every 20: it finishes well
/// within the stated bound, the table never exceeds its limits, the
/// unlisted address is refused at accept, and the per-address limit
/// refuses only the address that hit it.
#[test]
fn idle_and_slow_connections_do_not_lock_out_a_good_client() {
    const BOUND: Duration = Duration::from_secs(20);
    let cfg = NfsConfig {
        max_connections: 64,
        max_connections_per_address: 16,
        ..NfsConfig::default()
    };
    let r = server(cfg, vec![exported("/e", mem_fs())]);
    let addr = r.local_addrs().0;
    let mut first = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
    let (st, root) = first.mnt("/e");
    assert_eq!(st, 0);
    drop(first);

    let stop = Arc::new(AtomicBool::new(false));
    // The attackers connect from their own thread while the good client
    // works.
    let from = (0..300u32)
        .map(|i| [127, 0, 0, 2 + (i % 5) as u8])
        .collect();
    let attackers = idle_and_trickling(addr, from, trickle(), stop.clone());
    // Unlisted clients: closed at accept, whatever they send.
    let unlisted = std::thread::spawn(move || {
        let mut closed = 0;
        for _ in 0..50 {
            let mut s = connect_from([127, 0, 0, 9], addr).unwrap();
            let _ = s.write_all(&frame(&[0u8; 40]));
            if !closed_within(&mut s, Duration::from_secs(5)) {
                break;
            }
            closed += 1;
        }
        closed
    });

    let start = Instant::now();
    let mut c = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
    for i in 0..200 {
        if i % 20 == 19 {
            // A newcomer must get in however full the table is.
            c = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
        }
        assert_eq!(c.getattr(&root).0, OK, "call {i}");
        let open = r.stats().open;
        assert!(open <= 64, "{open} connections open");
    }
    let took = start.elapsed();
    assert_eq!(
        unlisted.join().unwrap(),
        50,
        "every unlisted connection closed"
    );
    assert!(took < BOUND, "good client took {took:?}");

    stop.store(true, Ordering::Relaxed);
    attackers.join().unwrap();
    // The attackers are gone (their connections close as the server sees
    // them end).
    let calm = Instant::now();
    while r.stats().open > 1 && calm.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(r.stats().open <= 1, "{:?}", r.stats());
    // The per-address limit, table not full: 127.0.0.7 opens 16, the 17th
    // is closed, and 127.0.0.1 still gets in.
    let mut mine: Vec<TcpStream> = (0..16)
        .map(|_| connect_from([127, 0, 0, 7], addr).unwrap())
        .collect();
    let mut probe = Client::over(mine.pop().unwrap(), sys(0, 0));
    assert_eq!(probe.getattr(&root).0, OK, "16th connection served");
    let mut extra = connect_from([127, 0, 0, 7], addr).unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(10)),
        "17th connection from one address closed"
    );
    let mut other = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
    assert_eq!(other.getattr(&root).0, OK);

    let st = r.stats();
    eprintln!("{st:?}");
    assert_eq!(st.refused_unlisted, 50);
    assert!(st.refused_per_address > 0, "{st:?}");
    assert!(st.evicted > 0, "{st:?}");
    assert_eq!(
        st.refused_full, 0,
        "an idle connection was always there to close"
    );
    drop(mine);
}

/// The idle timeout closes a connection without requests, and one that
/// only trickles a partial record, but never one with a request in
/// flight: a COMMIT that takes three times the timeout is answered on
/// its connection.
#[test]
fn idle_timeout_is_rpc_aware() {
    let timeout = Duration::from_millis(800);
    let fs = Arc::new(
        Fs::mount(Arc::new(SlowSync {
            inner: MemBackend::new(),
            delay: timeout * 3,
        }))
        .unwrap(),
    );
    let cfg = NfsConfig {
        idle_timeout: timeout,
        ..NfsConfig::default()
    };
    let r = server(cfg, vec![exported("/s", fs)]);
    let addr = r.local_addrs().0;
    let mut c = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
    let (_, root) = c.mnt("/s");
    let (st, fh, _) = c.create(&root, "f", 1, [0; 8]);
    assert_eq!(st, OK);
    let idle = connect_from([127, 0, 0, 2], addr).unwrap();
    let slow = connect_from([127, 0, 0, 3], addr).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = trickle().start(vec![slow.try_clone().unwrap()], stop.clone());

    let started = Instant::now();
    assert_eq!(c.commit(&fh).0, OK, "slow COMMIT answered");
    assert!(started.elapsed() >= timeout * 3);
    assert_eq!(c.getattr(&fh).0, OK, "and the connection still serves");

    for (name, mut s) in [("idle", idle), ("trickling", slow)] {
        assert!(
            closed_within(&mut s, Duration::from_secs(10)),
            "{name} connection closed"
        );
    }
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    // Once idle, the client's own connection goes too.
    assert!(closed_within(&mut c.s, Duration::from_secs(10)));
    assert!(r.stats().idle_closed >= 3, "{:?}", r.stats());
    // And a new connection is served as usual.
    let mut c = Client::over(connect_from([127, 0, 0, 1], addr).unwrap(), sys(0, 0));
    assert_eq!(c.getattr(&fh).0, OK);
}

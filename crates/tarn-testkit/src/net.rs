//! Sockets for tests of servers: free ports, waiting for a Unix socket,
//! connecting from a chosen loopback address, noticing that the server
//! hung up, and crowds of idle and trickling connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until something listens on the Unix socket `path` (bounded).
pub fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(path).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {}",
            path.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP connection to `server` from the loopback address `from`
/// (127.0.0.x: Linux routes all of 127.0.0.0/8 to the loopback device),
/// with a 30 s read timeout.
pub fn connect_from(from: [u8; 4], server: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&server.into(), Duration::from_secs(10))?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// True if the server closed `s` (end of stream or reset) within
/// `within`; whatever it sends until then is skipped.
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within))
        .expect("set a read timeout");
    ends(s)
}

/// Reads `r` to its end: true if it ended (end of stream or reset), false
/// on any other error, such as the read timeout of the socket under it.
pub fn ends(r: &mut impl Read) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match r.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            }
        }
    }
}

/// What a slow client sends: `head` once, then `tick` every 100 ms, never
/// finishing what it started.
#[derive(Clone, Debug)]
pub struct Trickle {
    /// Sent once, first.
    pub head: Vec<u8>,
    /// Sent every 100 ms after.
    pub tick: Vec<u8>,
}

impl Trickle {
    /// `head` once, then `tick` every 100 ms.
    pub fn new(head: &[u8], tick: &[u8]) -> Trickle {
        Trickle {
            head: head.to_vec(),
            tick: tick.to_vec(),
        }
    }

    /// Keeps `socks` open on a thread of their own, each sending this,
    /// until `stop`.
    pub fn start(&self, mut socks: Vec<TcpStream>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
        let t = self.clone();
        thread::spawn(move || {
            for s in &mut socks {
                let _ = s.write_all(&t.head);
            }
            while !stop.load(Ordering::Relaxed) {
                for s in &mut socks {
                    let _ = s.write_all(&t.tick);
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    }
}

/// Hostile clients on a thread of their own: a connection attempt to
/// `server` from each address of `from` in turn; every other connection
/// made stays idle, the rest send `slow`; all are held open until `stop`.
pub fn idle_and_trickling(
    server: SocketAddr,
    from: Vec<[u8; 4]>,
    slow: Trickle,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut idle = Vec::new();
        let mut trickling = Vec::new();
        for (i, from) in from.into_iter().enumerate() {
            if let Ok(s) = connect_from(from, server) {
                if i % 2 == 0 {
                    idle.push(s);
                } else {
                    trickling.push(s);
                }
            }
        }
        slow.start(trickling, stop)
            .join()
            .expect("the trickling thread");
        drop(idle);
    })
}

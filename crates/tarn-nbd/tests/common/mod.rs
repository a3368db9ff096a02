//! Shared test support: servers over in-memory devices, a device that
//! records what it was asked (FUA, flushes) and can be slowed down, and
//! a small blocking NBD client that sends exactly the bytes a test wants.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tarn_nbd::proto::{self, client, cmd, opt, rep};
use tarn_nbd::{NbdConfig, NbdExport, NbdServer, Running};
use tarn_vol::testing::MemDevice;
use tarn_vol::{Device, Extent, ReadData, VolError};

pub const MIB: u64 = 1 << 20;

/// A server on 127.0.0.1, any free port, with `cfg`'s other settings.
pub fn start_with(cfg: NbdConfig, exports: Vec<NbdExport>) -> Running {
    let cfg = NbdConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..cfg
    };
    NbdServer::start(cfg, exports).expect("server starts")
}

/// A server with the default settings.
pub fn start(exports: Vec<NbdExport>) -> Running {
    start_with(NbdConfig::default(), exports)
}

/// `nbd://127.0.0.1:PORT/name`.
pub fn url(r: &Running, name: &str) -> String {
    format!("nbd://127.0.0.1:{}/{name}", r.local_addr().port())
}

/// A device that wraps a [`MemDevice`], counts what it is asked, and can
/// make every write take a while (to hold requests in flight).
pub struct Probe {
    pub mem: MemDevice,
    pub fua_writes: AtomicU64,
    pub writes: AtomicU64,
    pub zeroes: AtomicU64,
    pub trims: AtomicU64,
    pub write_delay: Mutex<Duration>,
    /// Answer reads from memory ([`Device::read_cached`]), as a volume
    /// whose blocks are cached does.
    pub from_memory: std::sync::atomic::AtomicBool,
    /// Reads answered from memory.
    pub cached_reads: AtomicU64,
    /// Each write's offset and the name of the thread that carried it out.
    pub write_threads: Mutex<Vec<(u64, Option<String>)>>,
    /// A write at this offset panics (a device bug, injected).
    pub panic_at: Mutex<Option<u64>>,
    /// How long asking whether it is read-only takes (a volume asks its
    /// dataset, which waits while its pool commits a txg).
    pub read_only_delay: Mutex<Duration>,
}

impl Probe {
    pub fn new(size: u64, block: u32) -> Arc<Probe> {
        Arc::new(Probe {
            mem: MemDevice::new(size, block),
            fua_writes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            zeroes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            write_delay: Mutex::new(Duration::ZERO),
            from_memory: std::sync::atomic::AtomicBool::new(false),
            cached_reads: AtomicU64::new(0),
            write_threads: Mutex::new(Vec::new()),
            panic_at: Mutex::new(None),
            read_only_delay: Mutex::new(Duration::ZERO),
        })
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::SeqCst)
    }
}

impl Device for Probe {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn block_size(&self) -> u32 {
        self.mem.block_size()
    }
    fn read_only(&self) -> bool {
        let d = *self.read_only_delay.lock().unwrap();
        if !d.is_zero() {
            std::thread::sleep(d);
        }
        Device::read_only(&self.mem)
    }
    fn read_data(&self, off: u64, len: u32) -> Result<ReadData, VolError> {
        self.mem.read_data(off, len)
    }
    fn read_cached(&self, off: u64, len: u32) -> Option<Result<ReadData, VolError>> {
        if !self.from_memory.load(Ordering::SeqCst) {
            return None;
        }
        self.cached_reads.fetch_add(1, Ordering::SeqCst);
        Some(self.mem.read_data(off, len))
    }
    fn write(&self, off: u64, data: &[u8], fua: bool) -> Result<(), VolError> {
        let d = *self.write_delay.lock().unwrap();
        if !d.is_zero() {
            std::thread::sleep(d);
        }
        self.write_threads
            .lock()
            .unwrap()
            .push((off, std::thread::current().name().map(str::to_string)));
        if *self.panic_at.lock().unwrap() == Some(off) {
            panic!("injected: a write at {off} panics");
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.mem.write(off, data, fua)
    }
    fn flush(&self) -> Result<(), VolError> {
        self.mem.flush()
    }
    fn trim(&self, off: u64, len: u64) -> Result<(), VolError> {
        self.trims.fetch_add(1, Ordering::SeqCst);
        self.mem.trim(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, fua: bool) -> Result<(), VolError> {
        self.zeroes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.mem.write_zeroes(off, len, fua)
    }
    fn extents(&self, off: u64, len: u64) -> Result<Vec<Extent>, VolError> {
        self.mem.extents(off, len)
    }
}

/// Deterministic bytes (xorshift) from `seed`, never all zero per 4 KiB.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

// ----- a raw client ---------------------------------------------------------

/// One option reply.
#[derive(Debug)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// One structured reply chunk.
#[derive(Debug)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub payload: Vec<u8>,
}

/// What the server sent for one reply.
#[derive(Debug)]
pub enum Answer {
    Simple { errno: u32, cookie: u64 },
    Chunk(Chunk),
}

/// A blocking NBD client over TCP.
pub struct Raw {
    pub s: TcpStream,
}

impl Raw {
    /// Connects and reads the greeting (checked); sends no flags yet.
    pub fn greeted(addr: SocketAddr) -> Raw {
        Raw::greeted_over(TcpStream::connect(addr).expect("connect"))
    }

    /// Reads the greeting on an open connection.
    pub fn greeted_over(s: TcpStream) -> Raw {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        let mut r = Raw { s };
        let mut g = [0u8; 18];
        r.s.read_exact(&mut g).expect("greeting");
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
        r
    }

    /// Connects as a fixed newstyle client asking for no zeroes.
    pub fn connect(addr: SocketAddr) -> Raw {
        let mut r = Raw::greeted(addr);
        r.send(&(client::FIXED_NEWSTYLE | client::NO_ZEROES).to_be_bytes());
        r
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send");
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).expect("read from the server");
        b
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    pub fn option_reply(&mut self) -> OptReply {
        let h = self.read_n(20);
        assert_eq!(&h[..8], &proto::OPTION_REPLY_MAGIC.to_be_bytes());
        let n = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        OptReply {
            option: u32::from_be_bytes(h[8..12].try_into().unwrap()),
            kind: u32::from_be_bytes(h[12..16].try_into().unwrap()),
            data: self.read_n(n),
        }
    }

    /// Sends an option and reads replies up to the final one (ACK or an
    /// error).
    pub fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        self.send_option(option, data);
        let mut v = Vec::new();
        loop {
            let r = self.option_reply();
            assert_eq!(r.option, option);
            let last = r.kind == rep::ACK || r.kind & (1 << 31) != 0;
            v.push(r);
            if last {
                return v;
            }
        }
    }

    /// Structured replies, then `base:allocation` on `name`.
    pub fn structured(&mut self, name: &str) {
        assert_eq!(self.option(opt::STRUCTURED_REPLY, &[])[0].kind, rep::ACK);
        let r = self.option(
            opt::SET_META_CONTEXT,
            &meta_payload(name, &["base:allocation"]),
        );
        assert_eq!(r[0].kind, rep::META_CONTEXT, "{r:?}");
    }

    /// `NBD_OPT_GO` to `name`: returns (size, transmission flags) or the
    /// error reply type.
    pub fn go(&mut self, name: &str) -> Result<(u64, u16), u32> {
        let r = self.option(opt::GO, &info_payload(name, &[proto::info::BLOCK_SIZE]));
        let last = r.last().unwrap();
        if last.kind != rep::ACK {
            return Err(last.kind);
        }
        let ex = r
            .iter()
            .find(|x| x.kind == rep::INFO && x.data[..2] == [0, 0])
            .expect("NBD_INFO_EXPORT");
        Ok((
            u64::from_be_bytes(ex.data[2..10].try_into().unwrap()),
            u16::from_be_bytes([ex.data[10], ex.data[11]]),
        ))
    }

    /// A connection in transmission on `name` (simple replies).
    pub fn open(addr: SocketAddr, name: &str) -> Raw {
        Raw::open_over(TcpStream::connect(addr).expect("connect"), name)
    }

    /// The same over an open connection.
    pub fn open_over(s: TcpStream, name: &str) -> Raw {
        let mut r = Raw::greeted_over(s);
        r.send(&(client::FIXED_NEWSTYLE | client::NO_ZEROES).to_be_bytes());
        r.go(name).expect("GO succeeds");
        r
    }

    /// A connection in transmission on `name` with structured replies
    /// and block status.
    pub fn open_structured(addr: SocketAddr, name: &str) -> Raw {
        let mut r = Raw::connect(addr);
        r.structured(name);
        r.go(name).expect("GO succeeds");
        r
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut b = Vec::with_capacity(28 + payload.len());
        b.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(payload);
        self.send(&b);
    }

    /// The next reply's header (a simple reply or a whole chunk); the data
    /// of a successful simple read reply is left on the stream.
    pub fn answer(&mut self) -> Answer {
        let m = self.read_n(4);
        let magic = u32::from_be_bytes(m[..4].try_into().unwrap());
        if magic == proto::SIMPLE_REPLY_MAGIC {
            let r = self.read_n(12);
            return Answer::Simple {
                errno: u32::from_be_bytes(r[..4].try_into().unwrap()),
                cookie: u64::from_be_bytes(r[4..12].try_into().unwrap()),
            };
        }
        assert_eq!(magic, proto::STRUCTURED_REPLY_MAGIC, "reply magic");
        let r = self.read_n(16);
        let n = u32::from_be_bytes(r[12..16].try_into().unwrap()) as usize;
        Answer::Chunk(Chunk {
            flags: u16::from_be_bytes([r[0], r[1]]),
            kind: u16::from_be_bytes([r[2], r[3]]),
            cookie: u64::from_be_bytes(r[4..12].try_into().unwrap()),
            payload: self.read_n(n),
        })
    }

    /// The error value of a simple reply (or of an error chunk).
    pub fn status(&mut self) -> (u64, u32) {
        match self.answer() {
            Answer::Simple { errno, cookie } => (cookie, errno),
            Answer::Chunk(c) if c.kind == proto::reply::TYPE_ERROR => (
                c.cookie,
                u32::from_be_bytes(c.payload[..4].try_into().unwrap()),
            ),
            Answer::Chunk(c) => panic!("unexpected chunk {c:?}"),
        }
    }

    /// A read with simple replies.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.request(cmd::READ, 0, 1, offset, len, &[]);
        match self.answer() {
            Answer::Simple { errno: 0, cookie } => {
                assert_eq!(cookie, 1);
                Ok(self.read_n(len as usize))
            }
            Answer::Simple { errno, .. } => Err(errno),
            Answer::Chunk(c) => panic!("chunk without structured replies: {c:?}"),
        }
    }

    /// A read with structured replies: the data reassembled, or the
    /// error value.
    pub fn read_structured(&mut self, offset: u64, len: u32, flags: u16) -> Result<Vec<u8>, u32> {
        self.request(cmd::READ, flags, 2, offset, len, &[]);
        let mut out = vec![0u8; len as usize];
        loop {
            let Answer::Chunk(c) = self.answer() else {
                panic!("simple reply to a read with structured replies")
            };
            assert_eq!(c.cookie, 2);
            match c.kind {
                proto::reply::TYPE_OFFSET_DATA => {
                    let at = u64::from_be_bytes(c.payload[..8].try_into().unwrap()) - offset;
                    out[at as usize..at as usize + c.payload.len() - 8]
                        .copy_from_slice(&c.payload[8..]);
                }
                proto::reply::TYPE_OFFSET_HOLE => {
                    let at = u64::from_be_bytes(c.payload[..8].try_into().unwrap()) - offset;
                    let n = u32::from_be_bytes(c.payload[8..12].try_into().unwrap());
                    out[at as usize..(at + n as u64) as usize].fill(0);
                }
                proto::reply::TYPE_ERROR => {
                    return Err(u32::from_be_bytes(c.payload[..4].try_into().unwrap()));
                }
                proto::reply::TYPE_NONE => {}
                k => panic!("unexpected chunk type {k}"),
            }
            if c.flags & proto::reply::FLAG_DONE != 0 {
                return Ok(out);
            }
        }
    }

    /// A write; returns the error value (0: success).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(cmd::WRITE, 0, 3, offset, data.len() as u32, data);
        let (cookie, e) = self.status();
        assert_eq!(cookie, 3);
        e
    }

    /// A command without payload; returns the error value.
    pub fn command(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> u32 {
        self.request(kind, flags, 4, offset, len, &[]);
        let (cookie, e) = self.status();
        assert_eq!(cookie, 4);
        e
    }

    /// Sends `NBD_CMD_DISC` and waits for the server to close.
    pub fn disconnect(mut self) {
        self.request(cmd::DISC, 0, 5, 0, 0, &[]);
        assert!(self.closed(), "the server closes after NBD_CMD_DISC");
    }

    /// True if the server closed the connection (within 20 s).
    pub fn closed(&mut self) -> bool {
        tarn_testkit::net::closed_within(&mut self.s, Duration::from_secs(20))
    }
}

pub fn info_payload(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

pub fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

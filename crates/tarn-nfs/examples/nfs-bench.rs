//! A small NFSv3 load generator built on this crate's own XDR, RPC and
//! record-marking modules. A benchmark tool, not a test: it reports what it
//! measured and fails only on protocol or I/O errors.
//!
//! ```text
//! nfs-bench --server 127.0.0.1:2049 --export /NAME --file NAME \
//!           --size-mib N --conns C --mode write|read|randread4k
//!           [--seconds S] [--depth D] [--uid U] [--gid G] [--mount-port P]
//! nfs-bench --server 127.0.0.1:2049 --export /NAME --file DIR \
//!           --mode mkfiles --count N [--conns C] [--depth D]
//! nfs-bench --server 127.0.0.1:2049 --export /NAME --file DIR \
//!           --mode list [--passes P] [--dtsize BYTES]
//! ```
//!
//! `write` CREATEs (or reuses) the file and writes N MiB in 1 MiB UNSTABLE
//! WRITEs, then sends one COMMIT (its time is included). `read` reads the
//! first N MiB in 1 MiB READs. Both hand out 1 MiB chunks in file order to C
//! TCP connections, each keeping D calls in flight (replies are matched by
//! xid). `randread4k` issues 4 KiB READs at random aligned offsets within the
//! first N MiB (default: the whole file) for S seconds, on each of the C
//! connections. `mkfiles` makes the directory DIR (or reuses it) and CREATEs
//! N empty files `f0000000`, ... in it, spread over the connections.
//! `list` reads DIR with READDIRPLUS (names, attributes and handles, what
//! `ls -l` asks of a Linux client) from the first cookie to EOF, P times
//! over one connection, asking for DTSIZE bytes per reply (default 64 KiB).
//! One result line goes to stdout.
//!
//! The MOUNT call goes to the NFS port unless `--mount-port` names another
//! (servers that register MOUNT separately with the portmapper).

use std::collections::HashMap;
use std::error::Error;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tarn_nfs::proto::{mountproc, nfsproc, MOUNT_PROG, NFS_PROG};
use tarn_nfs::record::LAST_FRAGMENT;
use tarn_nfs::rpc::{encode_call, Auth, AuthSys};
use tarn_nfs::xdr::{Reader, Writer, XdrResult};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = MIB;
const SMALL: u64 = 4096;
/// Largest reply record accepted: a 1 MiB READ plus its headers.
const MAX_REPLY: usize = (MIB as usize) + (64 << 10);
/// Size of an XDR `fattr3`.
const FATTR3: usize = 84;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Write,
    Read,
    RandRead4k,
    MkFiles,
    List,
}

struct Cfg {
    server: SocketAddr,
    export: String,
    file: String,
    size: Option<u64>,
    conns: usize,
    depth: usize,
    mode: Mode,
    seconds: u64,
    count: u64,
    passes: u32,
    dtsize: u32,
    mount: SocketAddr,
    auth: Auth,
}

const USAGE: &str = "usage: nfs-bench --server ADDR:PORT --export /NAME --file NAME \
--mode write|read|randread4k|mkfiles|list [--size-mib N] [--conns C] [--seconds S] [--depth D] \
[--count N] [--passes P] [--dtsize BYTES] [--mount-port P] [--uid U] [--gid G]";

fn parse_args() -> Res<Cfg> {
    let mut kv = HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(k) = args.next() {
        if k == "-h" || k == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let key = k
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {k:?}"))?;
        let v = args.next().ok_or_else(|| format!("{k} needs a value"))?;
        kv.insert(key.to_string(), v);
    }
    let mut take = |k: &str| kv.remove(k);
    fn num<T: std::str::FromStr>(k: &str, v: Option<String>, default: Option<T>) -> Res<T> {
        match v {
            Some(s) => s
                .parse()
                .map_err(|_| format!("--{k}: not a number: {s:?}").into()),
            None => default.ok_or_else(|| format!("--{k} is required").into()),
        }
    }
    let mode = match take("mode").as_deref() {
        Some("write") => Mode::Write,
        Some("read") => Mode::Read,
        Some("randread4k") => Mode::RandRead4k,
        Some("mkfiles") => Mode::MkFiles,
        Some("list") => Mode::List,
        other => {
            return Err(format!(
                "--mode must be write, read, randread4k, mkfiles or list, not {other:?}"
            )
            .into())
        }
    };
    let size_mib: Option<u64> = take("size-mib")
        .map(|s| num("size-mib", Some(s), None))
        .transpose()?;
    if matches!(mode, Mode::Write | Mode::Read) && size_mib.is_none() {
        return Err("--size-mib is required for write and read".into());
    }
    let server = take("server").ok_or("--server is required")?;
    let server: SocketAddr = server
        .parse()
        .map_err(|_| format!("--server: not ADDR:PORT: {server:?}"))?;
    let mount_port = num("mount-port", take("mount-port"), Some(server.port()))?;
    let cfg = Cfg {
        server,
        mount: SocketAddr::new(server.ip(), mount_port),
        export: take("export").ok_or("--export is required")?,
        file: take("file").ok_or("--file is required")?,
        size: size_mib.map(|m| m * MIB),
        conns: num("conns", take("conns"), Some(1))?,
        depth: num("depth", take("depth"), Some(8))?,
        mode,
        seconds: num("seconds", take("seconds"), Some(30))?,
        count: num(
            "count",
            take("count"),
            if mode == Mode::MkFiles { None } else { Some(0) },
        )?,
        passes: num("passes", take("passes"), Some(1))?,
        dtsize: num("dtsize", take("dtsize"), Some(64 << 10))?,
        auth: Auth::Sys(AuthSys {
            stamp: 0,
            machine: b"nfs-bench".to_vec(),
            uid: num("uid", take("uid"), Some(0))?,
            gid: num("gid", take("gid"), Some(0))?,
            gids: vec![],
        }),
    };
    if let Some(k) = kv.keys().next() {
        return Err(format!("unknown option --{k}\n{USAGE}").into());
    }
    if cfg.conns == 0 || cfg.depth == 0 || cfg.seconds == 0 || cfg.passes == 0 {
        return Err("--conns, --depth, --seconds and --passes must be at least 1".into());
    }
    if !(1024..=MIB as u32).contains(&cfg.dtsize) {
        return Err("--dtsize must be between 1024 and 1048576".into());
    }
    Ok(cfg)
}

/// Seconds to wait for a reply before giving up.
const REPLY_TIMEOUT: u64 = 120;

fn recv_err(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no reply within {REPLY_TIMEOUT} s")
        }
        std::io::ErrorKind::UnexpectedEof => "the server closed the connection".into(),
        _ => format!("reading a reply: {e}"),
    }
}

/// One TCP connection speaking ONC RPC.
struct Conn {
    s: TcpStream,
    xid: u32,
    auth: Auth,
    buf: Vec<u8>,
}

impl Conn {
    fn connect(addr: SocketAddr, auth: &Auth, first_xid: u32) -> Res<Conn> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(REPLY_TIMEOUT)))?;
        s.set_nodelay(true)?;
        let buf = vec![0; MAX_REPLY];
        Ok(Conn {
            s,
            xid: first_xid,
            auth: auth.clone(),
            buf,
        })
    }

    /// Sends a call: `args` then `payload` (already XDR-padded). Returns its xid.
    fn send(&mut self, prog: u32, proc_: u32, args: &[u8], payload: &[u8]) -> Res<u32> {
        self.xid = self.xid.wrapping_add(1);
        let mut w = encode_call(self.xid, prog, 3, proc_, &self.auth);
        w.fixed(args);
        let mut head = w.into_bytes();
        let len = u32::try_from(head.len() + payload.len()).map_err(|_| "call too large")?;
        head.splice(0..0, (len | LAST_FRAGMENT).to_be_bytes());
        self.s
            .write_all(&head)
            .map_err(|e| format!("sending a call: {e}"))?;
        self.s
            .write_all(payload)
            .map_err(|e| format!("sending a call: {e}"))?;
        Ok(self.xid)
    }

    /// Reads one reply record; returns its xid and a reader at the results
    /// of an accepted, successful call (anything else is an error).
    fn recv(&mut self) -> Res<(u32, Reader<'_>)> {
        let mut len = 0;
        loop {
            let mut h = [0u8; 4];
            self.s.read_exact(&mut h).map_err(recv_err)?;
            let h = u32::from_be_bytes(h);
            let n = (h & !LAST_FRAGMENT) as usize;
            if n > MAX_REPLY - len {
                return Err(
                    format!("reply record over {MAX_REPLY} bytes (not an NFS server?)").into(),
                );
            }
            self.s
                .read_exact(&mut self.buf[len..len + n])
                .map_err(recv_err)?;
            len += n;
            if h & LAST_FRAGMENT != 0 {
                break;
            }
        }
        let mut r = Reader::new(&self.buf[..len]);
        let bad = |e| format!("malformed RPC reply: {e}");
        let xid = r.u32().map_err(bad)?;
        if r.u32().map_err(bad)? != 1 {
            return Err("server sent a CALL, not a REPLY".into());
        }
        match r.u32().map_err(bad)? {
            0 => {
                r.u32().map_err(bad)?; // verifier flavor and body
                r.opaque(400).map_err(bad)?;
                match r.u32().map_err(bad)? {
                    0 => Ok((xid, r)),
                    s => Err(format!("call {xid} refused, accept_stat {s} (1 PROG_UNAVAIL, 2 PROG_MISMATCH, 3 PROC_UNAVAIL, 4 GARBAGE_ARGS)").into()),
                }
            }
            1 => match r.u32().map_err(bad)? {
                0 => Err("server refused RPC version 2 (RPC_MISMATCH)".into()),
                _ => Err(format!("call {xid} denied: AUTH_ERROR {}", r.u32().map_err(bad)?).into()),
            },
            s => Err(format!("invalid reply_stat {s}").into()),
        }
    }

    /// One call, waiting for its reply; returns a reader at its results.
    fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Res<Reader<'_>> {
        let xid = self.send(prog, proc_, args, &[])?;
        let (got, r) = self.recv()?;
        if got != xid {
            return Err(format!("reply xid {got}, expected {xid}").into());
        }
        Ok(r)
    }
}

fn nfs_err(what: &str, stat: u32) -> Box<dyn Error + Send + Sync> {
    let name = match stat {
        2 => "NOENT",
        5 => "IO",
        13 => "ACCES",
        21 => "ISDIR",
        22 => "INVAL",
        28 => "NOSPC",
        30 => "ROFS",
        69 => "DQUOT",
        70 => "STALE",
        10001 => "BADHANDLE",
        10008 => "JUKEBOX",
        _ => "see RFC 1813",
    };
    format!("{what} failed: nfsstat3 {stat} ({name})").into()
}

/// Reads an `fattr3`, returning the file size.
fn fattr_size(r: &mut Reader) -> XdrResult<u64> {
    for _ in 0..5 {
        r.u32()?; // type, mode, nlink, uid, gid
    }
    let size = r.u64()?;
    r.fixed(FATTR3 - 28)?;
    Ok(size)
}

fn skip_post_op(r: &mut Reader) -> XdrResult<()> {
    r.option(fattr_size).map(drop)
}

fn skip_wcc(r: &mut Reader) -> XdrResult<()> {
    r.option(|r| r.fixed(24).map(drop))?; // pre_op_attr: size, mtime, ctime
    skip_post_op(r)
}

/// MNT the export (over `c`, or a connection of its own if MOUNT has its
/// own port); returns the root handle.
fn mount_root(cfg: &Cfg, c: &mut Conn) -> Res<Vec<u8>> {
    let mut own;
    let m = if cfg.mount == cfg.server {
        c
    } else {
        own = Conn::connect(cfg.mount, &cfg.auth, 0x00ff_0000)?;
        &mut own
    };
    let mut w = Writer::new();
    w.opaque(cfg.export.as_bytes());
    let mut r = m.call(MOUNT_PROG, mountproc::MNT, &w.into_bytes())?;
    let export = &cfg.export;
    match r.u32()? {
        0 => {}
        2 => return Err(format!("MNT {export}: no such export").into()),
        13 => {
            return Err(format!("MNT {export}: access denied (client address not allowed?)").into())
        }
        s => return Err(format!("MNT {export} failed: mountstat3 {s}").into()),
    }
    Ok(r.opaque(64)?.to_vec())
}

/// sattr3 of a new file or directory: the mode; uid, gid, size unset; times
/// unchanged.
fn new_sattr(w: &mut Writer, mode: u32) {
    w.bool(true)
        .u32(mode)
        .bool(false)
        .bool(false)
        .bool(false)
        .u32(0)
        .u32(0);
}

/// MNT the export, then LOOKUP (or, for writing, CREATE) the file; for
/// `mkfiles` and `list`, LOOKUP (or for `mkfiles`, MKDIR) the directory.
/// Returns its handle and size.
fn open_file(cfg: &Cfg, c: &mut Conn) -> Res<(Vec<u8>, u64)> {
    let root = mount_root(cfg, c)?;
    let export = &cfg.export;
    let mut w = Writer::new();
    w.opaque(&root).opaque(cfg.file.as_bytes());
    let mut r = c.call(NFS_PROG, nfsproc::LOOKUP, &w.into_bytes())?;
    let fh = match r.u32()? {
        0 => r.opaque(64)?.to_vec(),
        2 if cfg.mode == Mode::MkFiles => {
            let mut w = Writer::new();
            w.opaque(&root).opaque(cfg.file.as_bytes());
            new_sattr(&mut w, 0o755);
            let mut r = c.call(NFS_PROG, nfsproc::MKDIR, &w.into_bytes())?;
            match r.u32()? {
                0 => r
                    .option(|r| r.opaque(64).map(<[u8]>::to_vec))?
                    .ok_or("MKDIR returned no handle")?,
                s => return Err(nfs_err(&format!("MKDIR {}", cfg.file), s)),
            }
        }
        2 if cfg.mode == Mode::Write => {
            let mut w = Writer::new();
            // UNCHECKED, mode 0644.
            w.opaque(&root).opaque(cfg.file.as_bytes()).u32(0);
            new_sattr(&mut w, 0o644);
            let mut r = c.call(NFS_PROG, nfsproc::CREATE, &w.into_bytes())?;
            match r.u32()? {
                0 => r
                    .option(|r| r.opaque(64).map(<[u8]>::to_vec))?
                    .ok_or("CREATE returned no handle")?,
                s => return Err(nfs_err(&format!("CREATE {}", cfg.file), s)),
            }
        }
        2 => {
            let first = if cfg.mode == Mode::List {
                "mkfiles"
            } else {
                "write"
            };
            return Err(format!(
                "{} does not exist in {export}; make it first (--mode {first})",
                cfg.file
            )
            .into());
        }
        s => return Err(nfs_err(&format!("LOOKUP {}", cfg.file), s)),
    };

    let mut w = Writer::new();
    w.opaque(&fh);
    let mut r = c.call(NFS_PROG, nfsproc::GETATTR, &w.into_bytes())?;
    match r.u32()? {
        0 => Ok((fh, fattr_size(&mut r)?)),
        s => Err(nfs_err("GETATTR", s)),
    }
}

struct Shared {
    /// Next 1 MiB chunk to hand out (write, read).
    next: AtomicU64,
    /// Set when a connection failed: the others stop issuing calls.
    abort: AtomicBool,
    /// End of the random-read run.
    deadline: Instant,
}

#[derive(Default)]
struct Stats {
    ops: u64,
    bytes: u64,
    latency: Duration,
    verf: Option<[u8; 8]>,
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Incompressible pseudo-random bytes.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&xorshift(&mut x).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Checks a WRITE or READ reply for `len` bytes (or a CREATE's); returns a
/// WRITE's verifier.
fn check_reply(mode: Mode, r: &mut Reader, len: u32) -> Res<Option<[u8; 8]>> {
    let stat = r.u32()?;
    if mode == Mode::MkFiles {
        return match stat {
            0 => Ok(None),
            s => Err(nfs_err("CREATE", s)),
        };
    }
    if mode == Mode::Write {
        skip_wcc(r)?;
        if stat != 0 {
            return Err(nfs_err("WRITE", stat));
        }
        let n = r.u32()?;
        let _committed = r.u32()?;
        let mut verf = [0; 8];
        verf.copy_from_slice(r.fixed(8)?);
        if n != len {
            return Err(format!("short WRITE: {n} of {len} bytes").into());
        }
        Ok(Some(verf))
    } else {
        skip_post_op(r)?;
        if stat != 0 {
            return Err(nfs_err("READ", stat));
        }
        let n = r.u32()?;
        let eof = r.bool()?;
        let data = r.opaque(MAX_REPLY)?;
        if n != len || data.len() != n as usize {
            return Err(format!("short READ: {} of {len} bytes (eof {eof})", data.len()).into());
        }
        Ok(None)
    }
}

/// One connection's share of the run, with up to `depth` calls in flight.
fn worker(cfg: &Cfg, fh: &[u8], size: u64, sh: &Shared, id: u32) -> Res<Stats> {
    let mut c = Conn::connect(cfg.server, &cfg.auth, id << 24)?;
    let mut data = if cfg.mode == Mode::Write {
        noise(id.into(), CHUNK as usize)
    } else {
        Vec::new()
    };
    let mut rng = u64::from(id).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5851_f42d_4c95_7f2d;
    let mut pending: HashMap<u32, (u64, u32, Instant)> = HashMap::new();
    let mut st = Stats::default();
    let chunks = if cfg.mode == Mode::MkFiles {
        cfg.count
    } else {
        size.div_ceil(CHUNK)
    };
    let blocks = size / SMALL;
    loop {
        while pending.len() < cfg.depth && !sh.abort.load(Ordering::Relaxed) {
            let (off, len) = if cfg.mode == Mode::RandRead4k {
                if Instant::now() >= sh.deadline {
                    break;
                }
                (xorshift(&mut rng) % blocks * SMALL, SMALL as u32)
            } else {
                let i = sh.next.fetch_add(1, Ordering::Relaxed);
                if i >= chunks {
                    break;
                }
                if cfg.mode == Mode::MkFiles {
                    (i, 0)
                } else {
                    (i * CHUNK, CHUNK.min(size - i * CHUNK) as u32)
                }
            };
            let mut w = Writer::with_capacity(64);
            if cfg.mode == Mode::MkFiles {
                // `off` is the file's number; UNCHECKED, mode 0644.
                w.opaque(fh).opaque(format!("f{off:07}").as_bytes()).u32(0);
                new_sattr(&mut w, 0o644);
                let xid = c.send(NFS_PROG, nfsproc::CREATE, &w.into_bytes(), &[])?;
                pending.insert(xid, (off, 0, Instant::now()));
                continue;
            }
            w.opaque(fh).u64(off).u32(len);
            let xid = if cfg.mode == Mode::Write {
                data[..8].copy_from_slice(&off.to_le_bytes()); // no two chunks alike
                w.u32(0).u32(len); // UNSTABLE, then the data's length
                c.send(
                    NFS_PROG,
                    nfsproc::WRITE,
                    &w.into_bytes(),
                    &data[..len as usize],
                )?
            } else {
                c.send(NFS_PROG, nfsproc::READ, &w.into_bytes(), &[])?
            };
            pending.insert(xid, (off, len, Instant::now()));
        }
        if pending.is_empty() {
            return Ok(st);
        }
        let (xid, mut r) = c.recv()?;
        let (off, len, t0) = pending
            .remove(&xid)
            .ok_or_else(|| format!("reply to unknown xid {xid}"))?;
        let verf = check_reply(cfg.mode, &mut r, len).map_err(|e| match cfg.mode {
            Mode::MkFiles => format!("file {off}: {e}"),
            _ => format!("offset {off}: {e}"),
        })?;
        match (st.verf, verf) {
            (Some(a), Some(b)) if a != b => {
                return Err("write verifier changed: the server restarted".into())
            }
            (None, Some(b)) => st.verf = Some(b),
            _ => {}
        }
        st.ops += 1;
        st.bytes += u64::from(len);
        st.latency += t0.elapsed();
    }
}

/// Reads the directory `dir` once with READDIRPLUS; returns the number of
/// entries (with `.` and `..`) and of calls.
fn list_once(cfg: &Cfg, c: &mut Conn, dir: &[u8]) -> Res<(u64, u64)> {
    let (mut cookie, mut verf, mut entries, mut calls) = (0u64, [0u8; 8], 0u64, 0u64);
    loop {
        let mut w = Writer::with_capacity(96);
        w.opaque(dir)
            .u64(cookie)
            .fixed(&verf)
            .u32(cfg.dtsize)
            .u32(cfg.dtsize);
        let mut r = c.call(NFS_PROG, nfsproc::READDIRPLUS, &w.into_bytes())?;
        calls += 1;
        let stat = r.u32()?;
        skip_post_op(&mut r)?;
        if stat != 0 {
            return Err(nfs_err("READDIRPLUS", stat));
        }
        verf.copy_from_slice(r.fixed(8)?);
        let before = entries;
        while r.bool()? {
            r.u64()?; // fileid
            r.string(255)?;
            cookie = r.u64()?;
            if r.option(fattr_size)?.is_none() {
                return Err("READDIRPLUS entry without attributes".into());
            }
            r.option(|r| r.opaque(64).map(drop))?;
            entries += 1;
        }
        if r.bool()? {
            return Ok((entries, calls));
        }
        if entries == before {
            return Err("READDIRPLUS returned no entries and no EOF".into());
        }
    }
}

fn run() -> Res<()> {
    let cfg = parse_args()?;
    let mut c = Conn::connect(cfg.server, &cfg.auth, 0)?;
    let (fh, file_size) = open_file(&cfg, &mut c)?;
    if cfg.mode == Mode::List {
        let t0 = Instant::now();
        let (mut entries, mut calls) = (0, 0);
        for _ in 0..cfg.passes {
            let (e, n) = list_once(&cfg, &mut c, &fh)?;
            entries = e;
            calls += n;
        }
        let secs = t0.elapsed().as_secs_f64();
        let per_pass = secs / f64::from(cfg.passes);
        println!(
            "nfs-bench mode=list passes={} dtsize={} entries={entries} calls={calls} \
             seconds={secs:.3} seconds_per_pass={per_pass:.4} entries_per_s={:.0}",
            cfg.passes,
            cfg.dtsize,
            entries as f64 / per_pass
        );
        return Ok(());
    }
    let size = match (cfg.mode, cfg.size) {
        (Mode::RandRead4k, want) => want.map_or(file_size, |w| w.min(file_size)),
        (Mode::Read, Some(want)) if want > file_size => {
            return Err(format!(
                "{} holds {file_size} bytes, fewer than --size-mib asks",
                cfg.file
            )
            .into())
        }
        (_, want) => want.unwrap_or(file_size),
    };
    if cfg.mode == Mode::RandRead4k && size < SMALL {
        return Err(format!("{} is too small for 4 KiB reads ({size} bytes)", cfg.file).into());
    }

    let t0 = Instant::now();
    let sh = Shared {
        next: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        deadline: t0 + Duration::from_secs(cfg.seconds),
    };
    let (cfgr, fhr, shr) = (&cfg, &fh[..], &sh);
    let results: Vec<Res<Stats>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=cfg.conns as u32)
            .map(|id| {
                s.spawn(move || {
                    let r = worker(cfgr, fhr, size, shr, id);
                    if r.is_err() {
                        shr.abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    let mut total = Stats::default();
    for (i, r) in results.into_iter().enumerate() {
        let st = r.map_err(|e| format!("connection {}: {e}", i + 1))?;
        total.ops += st.ops;
        total.bytes += st.bytes;
        total.latency += st.latency;
        if total.verf.is_some() && st.verf.is_some() && total.verf != st.verf {
            return Err("write verifiers differ between connections: the server restarted".into());
        }
        total.verf = total.verf.or(st.verf);
    }
    if cfg.mode == Mode::Write {
        let mut w = Writer::new();
        w.opaque(&fh).u64(0).u32(0);
        let mut r = c.call(NFS_PROG, nfsproc::COMMIT, &w.into_bytes())?;
        let stat = r.u32()?;
        skip_wcc(&mut r)?;
        if stat != 0 {
            return Err(nfs_err("COMMIT", stat));
        }
        if total.verf.is_some_and(|v| r.fixed(8).ok() != Some(&v[..])) {
            return Err("COMMIT verifier differs from the WRITEs': the server restarted".into());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let mean_us = total.latency.as_secs_f64() * 1e6 / total.ops.max(1) as f64;
    let mode = match cfg.mode {
        Mode::Write => "write",
        Mode::Read => "read",
        Mode::RandRead4k => "randread4k",
        Mode::MkFiles => "mkfiles",
        Mode::List => "list",
    };
    let head = format!(
        "nfs-bench mode={mode} conns={} depth={}",
        cfg.conns, cfg.depth
    );
    if cfg.mode == Mode::RandRead4k || cfg.mode == Mode::MkFiles {
        let iops = total.ops as f64 / secs;
        println!(
            "{head} ops={} seconds={secs:.3} iops={iops:.0} mean_latency_us={mean_us:.0}",
            total.ops
        );
    } else {
        let rate = total.bytes as f64 / MIB as f64 / secs;
        println!(
            "{head} bytes={} seconds={secs:.3} mib_per_s={rate:.1} mean_latency_us={mean_us:.0}",
            total.bytes
        );
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("nfs-bench: {e}");
        std::process::exit(1);
    }
}

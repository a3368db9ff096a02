//! The listener, connections and their two phases (see the crate docs).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use tarn_conn::{Busy, Conn, ConnState, Host, HostConfig, Limits, Progress, RateLog};

use crate::exec::{self, Reply};
use crate::export::{NbdExport, Table};
use crate::handshake::{self, HsError, HsState, Outcome, Policy, Session};
use crate::proto::{self, errno};
use crate::request::{self, Command, Decision, RequestHeader};
use crate::Error;

/// Server configuration: address, limits and TLS.
#[derive(Clone, Debug)]
pub struct NbdConfig {
    /// Address to listen on (port 0: any free port). Default
    /// `0.0.0.0:10809`, the port IANA reserved for NBD.
    pub bind: SocketAddr,
    /// Largest read or write in one request, advertised as the maximum
    /// payload of `NBD_INFO_BLOCK_SIZE`. Default 32 MiB, the size every
    /// client may assume without asking. Between 4 KiB and 1 GiB.
    pub max_payload: u32,
    /// Most simultaneous connections. When all are taken, an idle
    /// connection (one with no request in flight) is closed for a
    /// newcomer: one of the address holding the most connections, the
    /// longest idle of those. Default 64.
    pub max_connections: usize,
    /// Most simultaneous connections from one address. Default 16
    /// (`nbdcopy` opens 4, qemu's multi-connection up to 16).
    pub max_connections_per_address: usize,
    /// Most requests of one connection being carried out at once; the
    /// connection is not read further until one is answered. Default 32
    /// (qemu keeps 16 in flight, `nbdcopy` 64 per connection).
    pub max_inflight_per_connection: usize,
    /// Most memory the requests of one connection hold in flight at once
    /// (read and write payloads; 2 MiB per block status), so memory is
    /// bounded by `max_connections` times this rather than by the request
    /// count. At least `max_payload`. Default 64 MiB.
    pub max_inflight_bytes_per_connection: u32,
    /// Threads carrying out device calls (blocking work), for all
    /// connections together; each connection's writes of whole blocks
    /// run on a thread of its own instead (`Writes`). Default 16.
    pub workers: usize,
    /// Time allowed from accept to the end of the negotiation (TLS
    /// included). Default 30 s.
    pub handshake_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    /// `Duration::ZERO`, the default: never, because NBD clients do not
    /// reconnect on their own (a kernel `/dev/nbd` device or a qemu disk
    /// would see I/O errors); dead peers are found by TCP keepalive.
    pub idle_timeout: Duration,
    /// Time a client may take no byte of its replies before the
    /// connection is given up (a client that stops reading its replies
    /// would otherwise hold its requests' memory; one that reads slowly
    /// but steadily is kept). Default 2 minutes.
    pub reply_timeout: Duration,
    /// Export that an empty name (`nbd://host:10809` without a path)
    /// stands for; None: an empty name is unknown.
    pub default_export: Option<String>,
    /// TLS for `NBD_OPT_STARTTLS`; None: the option is refused with
    /// `NBD_REP_ERR_POLICY`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Refuse every option but `STARTTLS` and `ABORT` until TLS is on
    /// (`NBD_REP_ERR_TLS_REQD`). Needs `tls`.
    pub tls_required: bool,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            bind: SocketAddr::from(([0, 0, 0, 0], 10809)),
            max_payload: 32 << 20,
            max_connections: 64,
            max_connections_per_address: 16,
            max_inflight_per_connection: 32,
            max_inflight_bytes_per_connection: 64 << 20,
            workers: 16,
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Duration::ZERO,
            reply_timeout: Duration::from_secs(120),
            default_export: None,
            tls: None,
            tls_required: false,
        }
    }
}

impl NbdConfig {
    fn check(&self) -> Result<(), Error> {
        if !(4096..=1 << 30).contains(&self.max_payload) {
            return Err(Error::Config(format!(
                "max_payload {} is outside 4 KiB ..= 1 GiB",
                self.max_payload
            )));
        }
        if self.max_inflight_bytes_per_connection < self.max_payload {
            return Err(Error::Config(
                "max_inflight_bytes_per_connection must be at least max_payload".into(),
            ));
        }
        if self.tls_required && self.tls.is_none() {
            return Err(Error::Config(
                "tls_required needs a TLS configuration (tls)".into(),
            ));
        }
        Ok(())
    }
}

/// Connection counters of a running server (see [`Running::stats`]).
pub use tarn_conn::Stats as ConnStats;

/// Most replies gathered into one write.
const REPLY_BATCH: usize = 32;
/// Buffer sizes of a connection's reader and writer.
const IO_BUFFER: usize = 64 << 10;

/// What every connection shares.
struct Shared {
    cfg: NbdConfig,
    policy: Policy,
    table: RwLock<Arc<Table>>,
    /// Bumped by every `set_exports`: transmitting connections then check
    /// that their export still lets them in ([`still_admitted`]).
    changed: watch::Sender<u64>,
    log: RateLog,
}

impl Shared {
    fn table(&self) -> Arc<Table> {
        match self.table.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// The NBD server (see [`NbdServer::start`]).
pub struct NbdServer;

impl NbdServer {
    /// Binds the listener, starts the runtime on its own thread, and
    /// returns a handle. Exports can be changed later with
    /// [`Running::set_exports`].
    pub fn start(config: NbdConfig, exports: Vec<NbdExport>) -> Result<Running, Error> {
        config.check()?;
        let table = Table::new(exports, config.default_export.clone())?;
        let host_cfg = HostConfig {
            name: "tarn-nbd",
            bind: config.bind,
            workers: config.workers,
            limits: Limits {
                max_connections: config.max_connections,
                max_per_address: config.max_connections_per_address,
            },
        };
        let shared = Arc::new(Shared {
            policy: Policy {
                tls_available: config.tls.is_some(),
                tls_required: config.tls_required,
                max_payload: config.max_payload,
            },
            cfg: config,
            table: RwLock::new(Arc::new(table)),
            changed: watch::channel(0).0,
            log: RateLog::new("tarn-nbd", Duration::from_secs(10)),
        });
        let serving = shared.clone();
        let host = Host::start(host_cfg, move |stream, peer, conn, stop| {
            connection(stream, peer, conn, serving.clone(), stop)
        })?;
        Ok(Running { shared, host })
    }
}

/// A running server. Dropping it stops it, as [`Running::stop`] does.
pub struct Running {
    shared: Arc<Shared>,
    host: Host,
}

impl Running {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.host.local_addr()
    }

    /// Replaces the export list. New negotiations see the new list at
    /// once. A connection already transmitting goes on if its export is
    /// still listed with the same device and would still let it in on the
    /// same terms (client networks, read-only); otherwise it is closed,
    /// so revoking access takes effect on connections already in.
    pub fn set_exports(&self, exports: Vec<NbdExport>) -> Result<(), Error> {
        let t = Arc::new(Table::new(exports, self.shared.cfg.default_export.clone())?);
        match self.shared.table.write() {
            Ok(mut g) => *g = t,
            Err(p) => *p.into_inner() = t,
        }
        self.shared.changed.send_modify(|v| *v = v.wrapping_add(1));
        Ok(())
    }

    /// Connection counters: open connections, refusals by reason,
    /// evictions, idle closes.
    pub fn stats(&self) -> ConnStats {
        self.host.stats()
    }

    /// Stops the server: closes the listener, stops reading requests,
    /// lets every connection finish and answer what it had in flight (up
    /// to 10 s), then closes them all. The port is free when it returns.
    /// Must not be called from inside a tokio runtime's async context
    /// (it blocks).
    pub fn stop(self) {
        self.host.stop();
    }
}

/// The phase after a successful handshake: the stream (clear or TLS) and
/// the session.
enum Entered {
    Plain(TcpStream, Session),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, Session),
}

/// Serves one connection: handshake (bounded by the handshake timeout,
/// cut short by an eviction or a stop), then transmission.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: Conn,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    tarn_conn::keepalive(&stream);
    let idle = nonzero(shared.cfg.idle_timeout);
    let hs = tokio::time::timeout(
        shared.cfg.handshake_timeout,
        handshake(stream, peer, &shared),
    );
    let entered = tokio::select! {
        r = hs => r,
        _ = conn.closed(idle) => return,
        _ = stop.wait_for(|&s| s) => return,
    };
    let entered = match entered {
        Ok(Ok(Some(e))) => e,
        Ok(Ok(None)) => return,
        Ok(Err(HsError::Io(e))) => {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                shared
                    .log
                    .log("handshake", &format!("handshake with {peer} failed: {e}"));
            }
            return;
        }
        Ok(Err(e)) => {
            shared
                .log
                .log("handshake", &format!("handshake with {peer} failed: {e}"));
            return;
        }
        Err(_) => {
            shared.log.log(
                "handshake",
                &format!(
                    "handshake with {peer} did not finish within {:?}",
                    shared.cfg.handshake_timeout
                ),
            );
            return;
        }
    };
    match entered {
        Entered::Plain(s, sess) => {
            let (r, w) = s.into_split();
            transmit(r, w, sess, peer, &conn, &shared, stop).await;
        }
        Entered::Tls(s, sess) => {
            let (r, w) = tokio::io::split(*s);
            transmit(r, w, sess, peer, &conn, &shared, stop).await;
        }
    }
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Greeting, options, and the TLS upgrade if asked for; None if the
/// client aborted.
async fn handshake(
    mut tcp: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> Result<Option<Entered>, HsError> {
    let mut st = HsState {
        no_zeroes: handshake::greet(&mut tcp).await?,
        ..HsState::default()
    };
    let table = || Arc::new(shared.table().visible_to(peer.ip()));
    match handshake::negotiate(&mut tcp, &mut st, &shared.policy, table).await? {
        Outcome::Go(s) => return Ok(Some(Entered::Plain(tcp, s))),
        Outcome::Abort => {
            let _ = tcp.shutdown().await;
            return Ok(None);
        }
        Outcome::StartTls => {}
    }
    let Some(cfg) = &shared.cfg.tls else {
        return Err(HsError::Protocol(
            "STARTTLS without a TLS configuration".into(),
        ));
    };
    let mut tls = tokio_rustls::TlsAcceptor::from(cfg.clone())
        .accept(tcp)
        .await?;
    // Nothing negotiated in clear text survives the upgrade.
    st = HsState {
        tls: true,
        no_zeroes: st.no_zeroes,
        options: st.options,
        ..HsState::default()
    };
    match handshake::negotiate(&mut tls, &mut st, &shared.policy, table).await? {
        Outcome::Go(s) => Ok(Some(Entered::Tls(Box::new(tls), s))),
        Outcome::Abort => {
            let _ = tls.shutdown().await;
            Ok(None)
        }
        Outcome::StartTls => Err(HsError::Protocol("STARTTLS twice".into())),
    }
}

/// A reply on its way to the writer, with what it holds until written:
/// the connection's busy mark and its in-flight slot and bytes.
struct Outgoing {
    reply: Reply,
    _busy: Busy,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// What the reader found next on the stream.
enum Next {
    /// A command to carry out, its payload read and its permits taken.
    Run {
        header: RequestHeader,
        cmd: Command,
        payload: Option<Vec<u8>>,
        slot: OwnedSemaphorePermit,
        bytes: Option<OwnedSemaphorePermit>,
    },
    /// An error to answer (any payload already dropped).
    Refuse {
        header: RequestHeader,
        errno: u32,
        why: &'static str,
        slot: OwnedSemaphorePermit,
    },
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// The client hung up or the socket failed.
    End,
    /// The client broke the protocol; hang up.
    Violation(String),
}

/// The transmission phase (see the crate docs): this task reads and
/// judges requests and starts each on a blocking thread; replies go out
/// through one writer task in completion order. On `NBD_CMD_DISC`, end
/// of stream, a protocol violation, eviction or stop, reading stops,
/// the requests in flight finish and are answered, and the connection
/// closes.
async fn transmit<R, W>(
    rd: R,
    wr: W,
    sess: Session,
    peer: SocketAddr,
    conn: &Conn,
    shared: &Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.cfg;
    let inflight = cfg.max_inflight_per_connection.max(1);
    let (tx, rx) = mpsc::channel::<Outgoing>(inflight);
    let writer = tokio::spawn(write_replies(
        wr,
        rx,
        conn.state().clone(),
        nonzero(cfg.reply_timeout),
    ));
    let slots = Arc::new(Semaphore::new(inflight));
    let budget = cfg.max_inflight_bytes_per_connection;
    let bytes = Arc::new(Semaphore::new(budget as usize));
    let mut rd = BufReader::with_capacity(IO_BUFFER, rd);
    let idle = nonzero(cfg.idle_timeout);
    let structured = sess.view.structured;
    let mut changed = shared.changed.subscribe();
    // A change between the handshake and the subscription above would be
    // missed: check once at the start, against the exports as they are now.
    changed.mark_changed();
    let mut writes = Writes::default();
    // Fixed for a volume's life (a closed one fails every write anyway).
    let block = u64::from(sess.block).max(1);
    loop {
        // The request being read survives a change of the exports (it is
        // polled again, never dropped half-read) unless the connection
        // is closed for it.
        let reading = next_request(&mut rd, &sess, &slots, &bytes, budget);
        tokio::pin!(reading);
        let next = loop {
            tokio::select! {
                // In this order: a change, a stop or an eviction is looked
                // at before a request that came with it (a request read
                // after its export was revoked must not run), and a
                // client that keeps sending cannot starve them.
                biased;
                Ok(()) = changed.changed() => {
                    if !still_admitted(shared, &sess, peer) {
                        shared.log.log(
                            "access",
                            &format!(
                                "closed the connection of {peer} to export {:?}: it was \
                                 removed or its access changed",
                                sess.export.name
                            ),
                        );
                        break None;
                    }
                }
                _ = stop.wait_for(|&s| s) => break None,
                _ = conn.closed(idle) => break None,
                n = &mut reading => break Some(n),
            }
        };
        let Some(next) = next else { break };
        match next {
            Next::Run {
                header,
                cmd,
                payload,
                slot,
                bytes,
            } => {
                let busy = conn.state().begin();
                // A read the device answers from memory is answered here,
                // without the hand-off to a blocking thread and back (two
                // thread switches, most of a cached read's cost).
                if let Some(out) = exec::run_cached(&*sess.export.device, cmd) {
                    log_io_error(shared, &sess.export.name, &out);
                    let reply = exec::encode(header.cookie, header.offset, true, structured, out);
                    let o = Outgoing {
                        reply,
                        _busy: busy,
                        _slot: slot,
                        _bytes: bytes,
                    };
                    if tx.send(o).await.is_err() {
                        break;
                    }
                    continue;
                }
                let tx = tx.clone();
                let dev = sess.export.device.clone();
                let sh = shared.clone();
                let name = sess.export.name.clone();
                let work = move || {
                    // A device that panics fails this request with EIO:
                    // its client is answered, not left waiting forever.
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        exec::run(&*dev, cmd, payload)
                    }))
                    .unwrap_or_else(|_| {
                        Err(exec::Failure {
                            errno: errno::EIO,
                            message: "the device failed (a bug: see the log)".into(),
                        })
                    });
                    log_io_error(&sh, &name, &out);
                    let read = matches!(cmd, Command::Read { .. });
                    let reply = exec::encode(header.cookie, header.offset, read, structured, out);
                    // Never blocks long: the channel has room for every
                    // slot, and this reply holds one.
                    let _ = tx.blocking_send(Outgoing {
                        reply,
                        _busy: busy,
                        _slot: slot,
                        _bytes: bytes,
                    });
                };
                match cmd {
                    // A FUA write waits for the intent log: on the pool,
                    // several share a commit.
                    Command::Write {
                        offset,
                        len,
                        fua: false,
                    } if offset % block == 0 && u64::from(len) % block == 0 => {
                        writes.run(Box::new(work))
                    }
                    _ => drop(tokio::task::spawn_blocking(work)),
                }
            }
            Next::Refuse {
                header,
                errno,
                why,
                slot,
            } => {
                let out = Outgoing {
                    reply: exec::error(header.cookie, structured, errno, why),
                    _busy: conn.state().begin(),
                    _slot: slot,
                    _bytes: None,
                };
                if tx.send(out).await.is_err() {
                    break;
                }
            }
            Next::Disconnect | Next::End => break,
            Next::Violation(why) => {
                shared.log.log(
                    "protocol",
                    &format!("closed the connection of {peer}: {why}"),
                );
                break;
            }
        }
    }
    drop(tx);
    // Once every request in flight has sent its reply (and dropped its
    // sender), the writer drains the channel, shuts the stream down and
    // ends.
    let _ = writer.await;
}

/// A device call carried out on another thread.
type Job = Box<dyn FnOnce() + Send>;

/// The thread that carries out a connection's writes of whole blocks
/// without FUA one after the other, started by its first such write; it
/// ends once the connection has ended and its queue is done (the
/// connection's end waits for every queued write, whose reply sender it
/// holds).
///
/// On the blocking pool, the workers that carry out one connection's
/// small writes wait for one another on the volume's lock and hand the
/// lock and the CPU back and forth; a write of whole blocks reads nothing
/// first, and on one thread of their own such writes take the lock in
/// turn (measured in docs/performance.md: a fifth more 4k writes into 4K
/// blocks on a fifth less CPU). A write into part of a block may read the
/// old block from the disk first, and a FUA write waits for the intent
/// log: both still go to the pool, so that many run at once and none
/// holds up the writes behind it. NBD gives writes in flight no order,
/// so none is promised here either.
#[derive(Default)]
enum Writes {
    /// No write of whole blocks yet: no thread.
    #[default]
    Idle,
    /// The thread, fed through this queue.
    Running(std::sync::mpsc::Sender<Job>),
    /// Starting the thread failed: every write goes to the pool.
    Unavailable,
}

impl Writes {
    /// Queues `job` to the thread, started on first use (or to the pool
    /// when the thread cannot be started or has ended).
    fn run(&mut self, job: Job) {
        if matches!(self, Writes::Idle) {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let started = std::thread::Builder::new()
                .name("tarn-nbd-writes".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A job answers its own device panic with EIO;
                        // this only keeps the thread for the next one.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                });
            *self = match started {
                Ok(_) => Writes::Running(tx),
                Err(_) => Writes::Unavailable,
            };
        }
        let job = match self {
            Writes::Running(q) => match q.send(job) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(job)) => job,
            },
            Writes::Idle | Writes::Unavailable => job,
        };
        drop(tokio::task::spawn_blocking(job));
    }
}

/// Reads the next request: header, judgement, permits (so memory stays
/// within the connection's budget before anything is allocated), then a
/// write's payload. A request's payload is always consumed before the
/// next header is read.
/// After the exports changed: true if the connection's export is still
/// listed under its name with the same device and would let `peer` in on
/// the same terms (networks, read-only).
fn still_admitted(shared: &Shared, sess: &Session, peer: SocketAddr) -> bool {
    let table = shared.table();
    let old = &sess.export;
    table.find(&old.name).is_some_and(|new| {
        Arc::ptr_eq(&new.device, &old.device)
            && new.allows(peer.ip())
            && new.read_only == old.read_only
    })
}

async fn next_request<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    sess: &Session,
    slots: &Arc<Semaphore>,
    bytes: &Arc<Semaphore>,
    budget: u32,
) -> Next {
    let mut hb = [0u8; proto::REQUEST_HEADER_LEN];
    if rd.read_exact(&mut hb).await.is_err() {
        return Next::End;
    }
    let header = match request::decode_header(&hb) {
        Ok(h) => h,
        Err(e) => return Next::Violation(e.to_string()),
    };
    match request::classify(&header, &sess.view) {
        Decision::Disconnect => Next::Disconnect,
        Decision::Close => Next::Violation(format!(
            "a write of {} bytes, over the maximum payload and too long to skip",
            header.len
        )),
        Decision::Refuse { errno, skip, why } => {
            if skip > 0 {
                let mut rest = (&mut *rd).take(skip as u64);
                match tokio::io::copy_buf(&mut rest, &mut tokio::io::sink()).await {
                    Ok(n) if n == skip as u64 => {}
                    _ => return Next::End,
                }
            }
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Next::End;
            };
            Next::Refuse {
                header,
                errno,
                why,
                slot,
            }
        }
        Decision::Run(cmd) => {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Next::End;
            };
            // Never more than the whole budget (block status on a
            // connection with a small one), or it would wait forever.
            let weight = cmd.memory_bytes().min(budget);
            let held = if weight > 0 {
                match bytes.clone().acquire_many_owned(weight).await {
                    Ok(p) => Some(p),
                    Err(_) => return Next::End,
                }
            } else {
                None
            };
            let payload = match cmd {
                Command::Write { len, .. } if len > 0 => {
                    // `len` is at most the maximum payload (classify). Read
                    // into the spare capacity: zeroing bytes that are about
                    // to be overwritten is a pass over the payload for
                    // nothing.
                    let mut buf = Vec::with_capacity(len as usize);
                    match (&mut *rd).take(len as u64).read_to_end(&mut buf).await {
                        Ok(n) if n == len as usize => Some(buf),
                        _ => return Next::End,
                    }
                }
                _ => None,
            };
            Next::Run {
                header,
                cmd,
                payload,
                slot,
                bytes: held,
            }
        }
    }
}

/// Logs a device I/O error a command met (rate-limited).
fn log_io_error(shared: &Shared, export: &str, out: &Result<exec::Done, exec::Failure>) {
    if let Err(f) = out {
        if f.errno == errno::EIO {
            shared.log.log(
                "device",
                &format!("export {export:?}: I/O error: {}", f.message),
            );
        }
    }
}

/// Slices handed to one vectored write at most (a 1 MiB read of 16K
/// blocks is 64).
const MAX_IOV: usize = 256;

/// Writes a read's bytes in order with vectored writes, straight from the
/// blocks they share with the cache: a read costs no assembling copy.
/// (`BufWriter` passes a batch larger than its buffer to the socket as it
/// is; a stream that cannot write vectored, TLS, gets it through the
/// buffer.)
async fn write_data<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    data: &tarn_vol::ReadData,
) -> std::io::Result<()> {
    let slices: Vec<&[u8]> = data.slices().filter(|s| !s.is_empty()).collect();
    // slices[i][off..] is the first byte not written yet.
    let (mut i, mut off) = (0, 0);
    while i < slices.len() {
        let iov: Vec<std::io::IoSlice<'_>> = std::iter::once(&slices[i][off..])
            .chain(slices[i + 1..].iter().copied())
            .take(MAX_IOV)
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = w.write_vectored(&iov).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < slices.len() {
            let left = slices[i].len() - off;
            if n < left {
                off += n;
                break;
            }
            n -= left;
            i += 1;
            off = 0;
        }
    }
    Ok(())
}

/// Writes replies as they come, several at once when they queue up, and
/// flushes when the queue is empty. A client that takes no byte of its
/// replies for `timeout` is given up (one that reads slowly but steadily
/// is not, however large the replies it asked for). Ends when every
/// sender is gone, shutting the stream down (TLS `close_notify`, then TCP
/// FIN).
async fn write_replies<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::Receiver<Outgoing>,
    state: Arc<ConnState>,
    timeout: Option<Duration>,
) {
    let (wr, clock) = Progress::new(wr);
    let mut w = BufWriter::with_capacity(IO_BUFFER, wr);
    let mut batch: Vec<Outgoing> = Vec::with_capacity(REPLY_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < REPLY_BATCH {
            match rx.try_recv() {
                Ok(o) => batch.push(o),
                Err(_) => break,
            }
        }
        let write = async {
            for o in &batch {
                w.write_all(&o.reply.head).await?;
                if let Some(d) = &o.reply.data {
                    write_data(&mut w, d).await?;
                }
            }
            w.flush().await
        };
        let ok = clock.finish(write, timeout).await;
        // The requests are done once their replies are written.
        batch.clear();
        if !ok {
            state.close();
            return;
        }
    }
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most `max` bytes per write, vectored or not.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
        vectored: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.out.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.max - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.max {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    proptest! {
        /// Whatever the blocks, holes and short writes, the bytes on the
        /// wire are the read's, in order, after the head.
        #[test]
        fn a_read_is_written_whole_and_in_order(
            pieces in proptest::collection::vec((any::<bool>(), 1usize..40_000, any::<u8>()), 0..40),
            max in 1usize..200_000,
            vectored in any::<bool>(),
        ) {
            let mut data = tarn_vol::ReadData::default();
            for (hole, len, byte) in pieces {
                if hole {
                    data.push_zeros(len);
                } else {
                    // A block with bytes on either side of the range read.
                    let block: Vec<u8> = (0..len + 7).map(|i| byte.wrapping_add(i as u8)).collect();
                    data.push_block(Box::new(block), 3, 3 + len);
                }
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let sock = Trickle { out: Vec::new(), max, vectored };
            let out = rt.block_on(async {
                let mut w = BufWriter::with_capacity(IO_BUFFER, sock);
                w.write_all(b"head").await.unwrap();
                write_data(&mut w, &data).await.unwrap();
                w.flush().await.unwrap();
                w.into_inner().out
            });
            prop_assert_eq!(&out[..4], b"head");
            prop_assert!(out[4..] == data.to_vec()[..], "{} bytes on the wire for {}", out.len() - 4, data.len());
        }
    }
}

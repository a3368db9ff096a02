//! The listener, connections and the full feature phase (see the crate
//! docs for the overall shape).
//!
//! # One connection
//!
//! A connection is served by one task. It reads login requests until
//! the session enters the full feature phase ([`crate::login`]); then a
//! reader task decodes PDUs into a small channel, and the connection's
//! task handles them in arrival order. A SCSI command that needs no more
//! data is started on the blocking pool at once and the next PDU is read
//! while it runs, so one session keeps up to `queue_depth` commands
//! running, as the initiator's queue asks (one session with a deep queue
//! is how ESXi and open-iscsi drive a LUN). When a command finishes, its
//! Data-In and response are queued whole (never interleaved with another
//! command's) and written; StatSN is given when a response is queued, so
//! responses go out in completion order, which iSCSI allows.
//!
//! Commands run in parallel only as SCSI allows it: tasks with the
//! SIMPLE (or HEAD OF QUEUE, or untagged) attribute may run in any
//! order, as a disk with a command queue would; an ORDERED (or ACA) task
//! waits until every running task has finished, and runs alone. A
//! SYNCHRONIZE CACHE covers every write that had *completed* when it
//! started, which includes every write the initiator saw acknowledged
//! before sending it, as SBC asks.
//!
//! Flow control: MaxCmdSN is ExpCmdSN + `queue_depth` − 1 − the number of
//! running commands, so the window an initiator sees shrinks with every
//! command it starts and grows again as commands finish (an initiator
//! ignores a MaxCmdSN lower than the one it has, so the window is never
//! taken back). With `queue_depth` commands running, or with running
//! commands' expected lengths and waiting writes' data together at
//! [`IscsiConfig::max_pending_write_bytes`] while a command runs, one
//! more PDU is taken in: a ping (NOP-Out) or task management is handled
//! at once, so an initiator's pings are answered while its commands run
//! long; anything else is held, unhandled, and nothing more is read until
//! there is room (with none running, the waiting writes' Data-Out must be
//! taken in, or they could wait for ever; a new write is then refused
//! with TASK SET FULL if it does not fit the budget). PDUs are still
//! handled in the order they came: a ping overtakes only PDUs not yet
//! read. The connection's reader decodes at most five PDUs ahead (four
//! in its channel, one waiting to go in) and then stops reading, so TCP
//! backpressure holds an initiator that ignores the window, and a
//! connection holds at most about that many bytes plus one command's
//! plus those five PDUs and the held one (each within the target's
//! MaxRecvDataSegmentLength).
//!
//! An ORDERED task must come after every older task and before every
//! newer one, but a write waiting for its data cannot be waited for
//! inline (its data comes through the same loop): an ORDERED task that
//! arrives while writes wait for data, and any task that arrives while an
//! ORDERED write waits for data, is answered TASK SET FULL and retried by
//! the initiator.
//!
//! A write needs its data before it can run. The data comes as immediate
//! data in the command PDU (if `ImmediateData=Yes`, up to
//! `FirstBurstLength`), then unsolicited Data-Out PDUs (if
//! `InitialR2T=No` and the command's F bit is clear), then solicited
//! Data-Out answering R2Ts. One R2T is outstanding per command
//! (`MaxOutstandingR2T=1`), for at most `MaxBurstLength` bytes; when its
//! burst ends (F bit) the next R2T is sent, and when all the data is
//! there the command runs. While a write waits for data, other commands
//! are read and run, so an initiator with a deep queue keeps the device
//! busy. Data must arrive in order (`DataPDUInOrder=Yes` and
//! `DataSequenceInOrder=Yes`); a Data-Out at an unexpected offset, past
//! the expected length, or for an R2T that was not sent is a protocol
//! error: the connection gets a Reject and is closed
//! (`ErrorRecoveryLevel=0` has no other recovery). A Data-Out with the
//! wrong DataSN is what a lost PDU looks like (RFC 7143 section 7.8) and
//! is handled as a data digest error (section 7.7, option b): it gets a
//! Reject, the rest of its burst is discarded, and when the burst ends
//! (F bit) the command is answered CHECK CONDITION, ABORTED COMMAND /
//! PROTOCOL SERVICE CRC ERROR, without touching the device; the session
//! goes on. A Data-Out for an unknown task (one that was aborted, or
//! refused before its data came) is dropped.
//!
//! A write's data is held in memory until it runs; the bytes of all the
//! writes a connection has waiting are bounded by
//! [`IscsiConfig::max_pending_write_bytes`]. A write that would exceed it
//! is answered TASK SET FULL at once, which initiators retry.
//!
//! # Numbering
//!
//! Every response carries StatSN (incremented by each response with a
//! status: SCSI Response, the last Data-In, NOP-In, Text, Logout, Task
//! Management, Reject), ExpCmdSN and MaxCmdSN. A non-immediate command
//! whose CmdSN falls outside ExpCmdSN ..= MaxCmdSN is dropped without an
//! answer, as the RFC asks; the window is [`IscsiConfig::queue_depth`].
//!
//! # Task management
//!
//! ABORT TASK drops the referenced task if it is still waiting for data
//! (it then gets no response); a task that is running cannot be stopped
//! on the device, so the function waits for it to finish and drops its
//! response (an aborted task's outcome is unknown to the initiator, as
//! SAM says); a task that already completed has been answered. ABORT
//! TASK SET, CLEAR TASK SET, LUN RESET and TARGET WARM RESET drop every
//! waiting task and every running one that way; TARGET COLD RESET does
//! so and closes the connection. All but ABORT TASK SET then end the
//! tasks of every other session of the logical unit too and post a unit
//! attention (a reset's to every nexus, this one too; CLEAR TASK SET's
//! to the others; [`crate::lu`] has the reasoning). The response to the
//! function is sent only after the tasks it ended are over, those of
//! the other sessions that were changing the medium included. They answer "function
//! complete", except ABORT TASK for a task this connection does not hold
//! (it completed and was answered first, or never came): "task does not
//! exist", so the initiator knows the response it got stands. CLEAR ACA
//! is "not supported", TASK REASSIGN "allegiance reassignment not
//! supported".

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::watch;

use tarn_conn::{Conn, Host, HostConfig, Limits as ConnLimits, RateLog};

use crate::login::{Login, Offer, Session, SessionKind, Step};
use crate::lu::{Admission, LuState};
use crate::pdu::{self, op, Digests, Pdu, ReadError, FLAG_F, RESERVED_TAG};
use crate::pr::Nexus;
use crate::scsi::{self, Cmd, Failure, Sense, Unit};
use crate::target::{Chap, IscsiTarget, Table};
use crate::text;
use crate::Error;

/// Server configuration: address, limits and negotiation offers.
#[derive(Clone, Debug)]
pub struct IscsiConfig {
    /// Address to listen on (port 0: any free port). Default
    /// `0.0.0.0:3260`, the port IANA reserved for iSCSI.
    pub bind: SocketAddr,
    /// Most simultaneous connections (each is one session). When all are
    /// taken, an idle connection is closed for a newcomer. Default 64.
    pub max_connections: usize,
    /// Most simultaneous connections from one address. Default 16.
    pub max_connections_per_address: usize,
    /// Threads carrying out device calls, for all connections. Default 16.
    pub workers: usize,
    /// Time allowed from accept to the full feature phase. Default 30 s.
    pub login_timeout: Duration,
    /// A connection with no command in flight for this long is closed;
    /// `Duration::ZERO` (the default): never (initiators keep idle
    /// sessions and send NOP-Outs; dead peers are found by TCP keepalive).
    pub idle_timeout: Duration,
    /// Time an initiator may take no byte of its responses before the
    /// connection is given up (one reading slowly but steadily is kept).
    /// Default 2 minutes.
    pub reply_timeout: Duration,
    /// The target's `MaxRecvDataSegmentLength`: largest data segment an
    /// initiator may send. Default 256 KiB; 512 ..= 16 MiB - 1.
    pub max_recv_data_segment: u32,
    /// The target's `MaxBurstLength` offer. Default 1 MiB.
    pub max_burst: u32,
    /// The target's `FirstBurstLength` offer. Default 256 KiB.
    pub first_burst: u32,
    /// Largest READ or WRITE, advertised in the Block Limits VPD page.
    /// Default 8 MiB; a multiple of 512 in 64 KiB ..= 64 MiB.
    pub max_transfer: u32,
    /// Commands an initiator may have outstanding (the CmdSN window).
    /// Default 32.
    pub queue_depth: u32,
    /// Most bytes of write data one connection holds while its writes
    /// wait for the rest of their data; also the bound, with that data,
    /// on what its running commands may return before the connection
    /// reads on. At least `max_transfer`. Default 64 MiB.
    pub max_pending_write_bytes: u64,
    /// Credentials discovery sessions must present; None: discovery is
    /// open (it lists only the targets the client may see).
    pub discovery_chap: Option<Chap>,
}

impl Default for IscsiConfig {
    fn default() -> Self {
        IscsiConfig {
            bind: SocketAddr::from(([0, 0, 0, 0], 3260)),
            max_connections: 64,
            max_connections_per_address: 16,
            workers: 16,
            login_timeout: Duration::from_secs(30),
            idle_timeout: Duration::ZERO,
            reply_timeout: Duration::from_secs(120),
            max_recv_data_segment: 256 << 10,
            max_burst: 1 << 20,
            first_burst: 256 << 10,
            max_transfer: 8 << 20,
            queue_depth: 32,
            max_pending_write_bytes: 64 << 20,
            discovery_chap: None,
        }
    }
}

impl IscsiConfig {
    fn check(&self) -> Result<(), Error> {
        let seg = 512..=0x00ff_ffff;
        if !seg.contains(&self.max_recv_data_segment)
            || !seg.contains(&self.max_burst)
            || !seg.contains(&self.first_burst)
        {
            return Err(Error::Config(
                "max_recv_data_segment, max_burst and first_burst must be 512 ..= 16777215".into(),
            ));
        }
        if self.first_burst > self.max_burst {
            return Err(Error::Config(
                "first_burst must not exceed max_burst".into(),
            ));
        }
        if !(64 << 10..=64 << 20).contains(&self.max_transfer)
            || !self.max_transfer.is_multiple_of(512)
        {
            return Err(Error::Config(
                "max_transfer must be a multiple of 512 in 64 KiB ..= 64 MiB".into(),
            ));
        }
        if !(1..=1024).contains(&self.queue_depth) {
            return Err(Error::Config("queue_depth must be 1 ..= 1024".into()));
        }
        if self.max_pending_write_bytes < self.max_transfer as u64 {
            return Err(Error::Config(
                "max_pending_write_bytes must be at least max_transfer".into(),
            ));
        }
        if let Some(c) = &self.discovery_chap {
            c.check("discovery")?;
        }
        Ok(())
    }
}

/// Connection counters of a running server (see [`Running::stats`]).
pub use tarn_conn::Stats as ConnStats;

/// Buffer sizes of a connection's reader and writer.
const IO_BUFFER: usize = 64 << 10;
/// Largest data segment of a login request.
const LOGIN_MAX_DATA: u32 = 64 << 10;

/// Reject reasons (RFC 7143 section 11.17.1).
mod reason {
    pub const DATA_DIGEST: u8 = 0x02;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const NOT_SUPPORTED: u8 = 0x05;
    pub const INVALID_FIELD: u8 = 0x09;
}

/// What every connection shares.
struct Shared {
    cfg: IscsiConfig,
    table: RwLock<Arc<Table>>,
    /// Bumped by every `set_targets`: sessions then check that their
    /// target still lets them in (see [`Ffp::still_admitted`]).
    changed: watch::Sender<u64>,
    log: RateLog,
    tsih: AtomicU16,
}

impl Shared {
    fn table(&self) -> Arc<Table> {
        match self.table.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn next_tsih(&self) -> u16 {
        loop {
            let t = self.tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }
}

/// The iSCSI target server (see [`IscsiServer::start`]).
pub struct IscsiServer;

impl IscsiServer {
    /// Binds the listener, starts the runtime on its own thread, and
    /// returns a handle. Targets can be changed later with
    /// [`Running::set_targets`].
    pub fn start(config: IscsiConfig, targets: Vec<IscsiTarget>) -> Result<Running, Error> {
        config.check()?;
        let table = Table::new(targets)?;
        let host_cfg = HostConfig {
            name: "tarn-iscsi",
            bind: config.bind,
            workers: config.workers,
            limits: ConnLimits {
                max_connections: config.max_connections,
                max_per_address: config.max_connections_per_address,
            },
        };
        let shared = Arc::new(Shared {
            cfg: config,
            table: RwLock::new(Arc::new(table)),
            changed: watch::channel(0).0,
            log: RateLog::new("tarn-iscsi", Duration::from_secs(10)),
            tsih: AtomicU16::new(1),
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

    /// Replaces the target list. New logins and discovery requests see
    /// the new list at once; a session already logged in goes on only if
    /// its target is still listed with the same device and would let it
    /// in on the same terms, and is closed otherwise.
    pub fn set_targets(&self, targets: Vec<IscsiTarget>) -> Result<(), Error> {
        let t = Arc::new(Table::new(targets)?);
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

    /// Stops the server: closes the listener, lets every connection
    /// finish the command it is running (up to 10 s), then closes them
    /// all. The port is free when it returns. Must not be called from
    /// inside a tokio runtime's async context (it blocks).
    pub fn stop(self) {
        self.host.stop();
    }
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Serves one connection: login (bounded by the login timeout, cut short
/// by an eviction or a stop), then the full feature phase.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: Conn,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    tarn_conn::keepalive(&stream);
    let local = stream
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let (r, w) = stream.into_split();
    let mut rd = BufReader::with_capacity(IO_BUFFER, r);
    let (w, clock) = tarn_conn::Progress::new(w);
    let mut wr = BufWriter::with_capacity(IO_BUFFER, w);
    let cfg = &shared.cfg;
    let offer = Offer {
        max_recv_data_segment: cfg.max_recv_data_segment,
        max_burst: cfg.max_burst,
        first_burst: cfg.first_burst,
        window: cfg.queue_depth,
    };
    let mut login = Login::new(
        offer,
        shared.table().visible_to(peer.ip()),
        cfg.discovery_chap.clone(),
        shared.next_tsih(),
    );
    let idle = nonzero(cfg.idle_timeout);
    let lg = tokio::time::timeout(cfg.login_timeout, login_phase(&mut rd, &mut wr, &mut login));
    let r = tokio::select! {
        r = lg => r,
        _ = conn.closed(idle) => return,
        _ = stop.wait_for(|&s| s) => return,
    };
    let sess = match r {
        Ok(Ok(s)) => s,
        Ok(Err(why)) => {
            if let Some(why) = why {
                shared
                    .log
                    .log("login", &format!("login from {peer} failed: {why}"));
            }
            let _ = wr.shutdown().await;
            return;
        }
        Err(_) => {
            shared.log.log(
                "login",
                &format!(
                    "login from {peer} did not finish within {:?}",
                    cfg.login_timeout
                ),
            );
            return;
        }
    };
    let lu = match &sess.kind {
        SessionKind::Normal(t) => Some((
            LuState::of(&t.device),
            Arc::new(Nexus::new(&sess.initiator, sess.isid, &t.name)),
        )),
        SessionKind::Discovery => None,
    };
    // Detached however the session ends (a panic in its task included).
    // A login with the ISID of a session still in reinstates it (RFC
    // 7143): the old session is told to close (see `LuState::attach`).
    let attached = lu.as_ref().map(|(lu, nexus)| {
        let (a, reinstates) = Attached::new(lu, nexus);
        if reinstates {
            shared.log.log(
                "session",
                &format!(
                    "{} reinstated its session with ISID {:02x?}: the old one is closed",
                    nexus.initiator, nexus.isid
                ),
            );
        }
        a
    });
    let resets = lu.as_ref().map(|(lu, _)| lu.resets());
    let reinstated = attached.as_ref().map(|a| a.reinstated.clone());
    let mut ffp = Ffp {
        resets,
        reinstated,
        lu,
        digests: Digests {
            header: sess.params.header_digest,
            data: sess.params.data_digest,
        },
        sess,
        shared: shared.clone(),
        peer,
        local,
        out: Vec::new(),
        tasks: HashMap::new(),
        task_bytes: 0,
        running: tokio::task::JoinSet::new(),
        running_itts: HashMap::new(),
        running_bytes: 0,
        aborted: HashSet::new(),
        next_ttt: 1,
        text_rest: None,
    };
    ffp.run(rd, wr, &clock, &conn, stop).await;
}

/// A session's nexus counted among its unit's ([`LuState::attach`]) until
/// this is dropped.
struct Attached {
    lu: Arc<LuState>,
    nexus: Arc<Nexus>,
    /// Moves when a later login reinstates the nexus.
    reinstated: watch::Receiver<u64>,
}

impl Attached {
    /// The session's attachment, and whether its login reinstated the
    /// nexus.
    fn new(lu: &Arc<LuState>, nexus: &Arc<Nexus>) -> (Attached, bool) {
        let (reinstated, reinstates) = lu.attach(nexus);
        let a = Attached {
            lu: lu.clone(),
            nexus: nexus.clone(),
            reinstated,
        };
        (a, reinstates)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.lu.detach(&self.nexus);
    }
}

/// The next reset of the unit (never, for a discovery session).
async fn next_reset(rx: &mut Option<watch::Receiver<u64>>) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(r) => r.changed().await,
        None => std::future::pending().await,
    }
}

/// Reads login requests until the full feature phase; Err(Some(why)) on a
/// failed login, Err(None) if the client went away.
async fn login_phase<R, W>(
    rd: &mut R,
    wr: &mut W,
    login: &mut Login,
) -> Result<Session, Option<String>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let p = match pdu::read_pdu(rd, Digests::default(), LOGIN_MAX_DATA).await {
            Ok(p) => p,
            Err(ReadError::Io(_)) => return Err(None),
            Err(ReadError::Pdu(e)) => return Err(Some(e.to_string())),
        };
        let (rsp, outcome) = match login.step(&p) {
            Step::Continue(r) => (r, None),
            Step::Fail(r, why) => (r, Some(Err(Some(why)))),
            Step::Done(r, s) => (r, Some(Ok(*s))),
        };
        let sent = async {
            wr.write_all(&rsp.encode(Digests::default())).await?;
            wr.flush().await
        };
        if sent.await.is_err() {
            return Err(None);
        }
        if let Some(o) = outcome {
            return o;
        }
    }
}

/// The logical unit a command addresses, as [`scsi::execute`] sees it.
fn unit<'a>(
    t: &'a IscsiTarget,
    read_only: bool,
    limits: scsi::Limits,
    lun: u64,
    lu: &'a LuState,
    nexus: &'a Nexus,
    epoch: u64,
) -> Unit<'a> {
    Unit {
        dev: &*t.device,
        read_only,
        name: &t.name,
        limits,
        lun,
        lu,
        nexus,
        epoch,
    }
}

/// The first `len` bytes of a read's slices.
struct Span<'a> {
    slices: &'a [&'a [u8]],
    /// Where each slice starts in the read.
    starts: Vec<usize>,
    len: usize,
}

impl<'a> Span<'a> {
    fn new(slices: &'a [&'a [u8]], len: usize) -> Span<'a> {
        let mut at = 0;
        let starts = slices
            .iter()
            .map(|s| {
                let from = at;
                at += s.len();
                from
            })
            .collect();
        Span {
            slices,
            starts,
            len,
        }
    }

    /// The slices that make bytes `off..off + n` (inside the read).
    fn range(&self, off: usize, n: usize) -> Vec<&'a [u8]> {
        let end = off + n;
        // The first slice that ends after `off`.
        let first = self
            .starts
            .partition_point(|&from| from <= off)
            .saturating_sub(1);
        let mut out = Vec::new();
        for (s, &from) in self.slices[first..].iter().zip(&self.starts[first..]) {
            let to = from + s.len();
            if from >= end {
                break;
            }
            if to <= off {
                continue;
            }
            out.push(&s[off.saturating_sub(from)..s.len() - to.saturating_sub(end)]);
        }
        out
    }
}

/// A command running on the blocking pool, as it comes back.
struct Done {
    itt: u32,
    lun_field: [u8; 8],
    edtl: u32,
    cmd: Cmd,
    /// Bytes of data the command carried (a write).
    out_len: u32,
    overflow: u32,
    target: Arc<IscsiTarget>,
    res: Result<tarn_vol::ReadData, Failure>,
}

/// What the connection's task waits for.
enum Event {
    /// A PDU from the reader task, or why it stopped (None: it ended).
    Pdu(Option<Result<Pdu, ReadError>>),
    /// A command finished (or, with `Err`, its task was lost).
    Done(Result<Done, tokio::task::Id>),
    /// Evicted, idle too long, or the server stops.
    Close,
    /// The targets changed.
    Recheck,
    /// Another session reset the logical unit.
    Reset,
    /// A new login took this session's nexus over.
    Reinstated,
}

/// A write waiting for its data.
struct WriteTask {
    /// The ORDERED (or ACA) task attribute: runs alone.
    ordered: bool,
    cmd: Cmd,
    lun_field: [u8; 8],
    edtl: u32,
    /// Bytes the command needs.
    want: u32,
    buf: Vec<u8>,
    /// Offset of the next Data-Out expected.
    received: u32,
    /// Unsolicited Data-Out still to come.
    unsolicited: bool,
    /// The outstanding R2T: its TTT and where its burst ends.
    r2t: Option<(u32, u32)>,
    r2tsn: u32,
    /// Bytes the CDB asks for beyond the expected length.
    overflow: u32,
    /// DataSN the next Data-Out of the current sequence must carry.
    data_sn: u32,
    /// A Data-Out came with the wrong DataSN: the rest of the current
    /// burst is discarded and the task ends with CHECK CONDITION.
    broken: bool,
    /// The unit's reset epoch when the command was admitted.
    epoch: u64,
}

/// A command ready to run: its task's numbers.
struct Run {
    itt: u32,
    lun_field: [u8; 8],
    edtl: u32,
    ordered: bool,
    overflow: u32,
    /// The unit's reset epoch when the command was admitted.
    epoch: u64,
}

/// Whether to go on reading.
#[derive(PartialEq, Eq)]
enum Flow {
    Go,
    Close,
}

/// A connection in the full feature phase.
struct Ffp {
    sess: Session,
    /// The logical unit's shared state and this session's I_T nexus
    /// (normal sessions).
    lu: Option<(Arc<LuState>, Arc<Nexus>)>,
    digests: Digests,
    shared: Arc<Shared>,
    peer: SocketAddr,
    local: SocketAddr,
    /// Encoded PDUs waiting to be written.
    out: Vec<u8>,
    tasks: HashMap<u32, WriteTask>,
    task_bytes: u64,
    /// Commands running on the blocking pool: task id → (ITT, bytes it
    /// holds: the larger of its expected length and what it reads).
    running: tokio::task::JoinSet<Done>,
    running_itts: HashMap<tokio::task::Id, (u32, u32, u64)>,
    /// Bytes the running commands may return (their expected lengths):
    /// with the waiting writes' bytes, bounded by
    /// [`IscsiConfig::max_pending_write_bytes`] before more is read.
    running_bytes: u64,
    /// Running tasks whose response is dropped (aborted by task
    /// management).
    aborted: HashSet<u32>,
    next_ttt: u32,
    /// The rest of a text response too long for one PDU: its TTT and bytes.
    text_rest: Option<(u32, Vec<u8>)>,
    /// The logical unit's resets (normal sessions).
    resets: Option<watch::Receiver<u64>>,
    /// Moves when a later login reinstates this session's nexus (normal
    /// sessions; see [`LuState::attach`]).
    reinstated: Option<watch::Receiver<u64>>,
}

impl Ffp {
    async fn run<R, W>(
        &mut self,
        rd: BufReader<R>,
        mut wr: BufWriter<W>,
        clock: &tarn_conn::ProgressClock,
        conn: &Conn,
        mut stop: watch::Receiver<bool>,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin,
    {
        let idle = nonzero(self.shared.cfg.idle_timeout);
        let reply_timeout = nonzero(self.shared.cfg.reply_timeout);
        let max = self.sess.params.target_mrdsl;
        let depth = self.shared.cfg.queue_depth.max(1) as usize;
        // The reader decodes PDUs ahead into a small channel, so waiting
        // for a PDU and for a finished command can be one select (a PDU
        // read half-way is never dropped). Its size bounds what a
        // connection holds beyond its budget (see the module docs).
        let mut changed = self.shared.changed.subscribe();
        // A change between this session's login (judged against the
        // table as it was when the connection came, up to the login
        // timeout before) and the subscription above would be missed:
        // check at the start, against the table as it is now. Every PDU
        // is handled only after the last change was checked (a command
        // sent with the last login request must not slip in first).
        changed.mark_changed();
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let digests = self.digests;
        let reader = tokio::spawn(async move {
            let mut rd = rd;
            loop {
                let r = pdu::read_pdu(&mut rd, digests, max).await;
                let end = r.is_err();
                if tx.send(r).await.is_err() || end {
                    break;
                }
            }
        });
        // A PDU read while the gate below was shut that is not a ping or
        // task management: it waits here, and nothing more is read, until
        // there is room again.
        let mut held: Option<Pdu> = None;
        loop {
            if !self.out.is_empty() && !flush(&mut wr, &mut self.out, reply_timeout, clock).await {
                conn.state().close();
                reader.abort();
                self.settle().await;
                return;
            }
            // With nothing running, the PDUs are taken in whatever waits:
            // the writes waiting for data may hold the whole budget, and
            // only their Data-Out (behind this gate) can move them on;
            // what a new command could add is bounded at its admission.
            let room = self.running.is_empty()
                || self.running.len() < depth
                    && self.running_bytes + self.task_bytes
                        < self.shared.cfg.max_pending_write_bytes;
            if room {
                if let Some(p) = held.take() {
                    if self.access_revoked(&mut changed)
                        || self.handle(p, conn).await == Flow::Close
                    {
                        break;
                    }
                    continue;
                }
            }
            let busy = !self.running.is_empty();
            // With the gate shut one more PDU is read, so that a ping
            // (NOP-Out) or task management sent while the window is full
            // is answered without waiting for a command to end: an
            // initiator whose pings go unanswered drops the connection.
            let ev = tokio::select! {
                r = rx.recv(), if held.is_none() => Event::Pdu(r),
                Some(d) = self.running.join_next_with_id(), if busy => {
                    Event::Done(d.map(|(_, d)| d).map_err(|e| e.id()))
                }
                _ = conn.closed(idle) => Event::Close,
                _ = stop.wait_for(|&s| s) => Event::Close,
                Ok(()) = changed.changed() => Event::Recheck,
                Ok(()) = next_reset(&mut self.resets) => Event::Reset,
                Ok(()) = next_reset(&mut self.reinstated) => Event::Reinstated,
            };
            match ev {
                Event::Pdu(Some(Ok(p)))
                    if !room && !matches!(p.opcode(), op::NOP_OUT | op::TASK_MGMT) =>
                {
                    held = Some(p);
                }
                Event::Pdu(Some(Ok(p))) => {
                    if self.access_revoked(&mut changed)
                        || self.handle(p, conn).await == Flow::Close
                    {
                        break;
                    }
                }
                Event::Pdu(Some(Err(ReadError::Pdu(e)))) => {
                    self.log(&format!("closed the connection of {}: {e}", self.peer));
                    break;
                }
                Event::Pdu(_) | Event::Close => break,
                Event::Done(d) => self.finish(d),
                Event::Recheck => {
                    if self.revoked() {
                        break;
                    }
                }
                Event::Reset => {
                    let epoch = self.resets.as_mut().map_or(0, |rx| *rx.borrow_and_update());
                    self.end_tasks_before(epoch);
                }
                Event::Reinstated => break,
            }
        }
        reader.abort();
        // Commands still running are let finish (they cannot be stopped
        // on the device); their answers go out if the peer still reads.
        self.settle().await;
        if !self.out.is_empty() {
            let _ = flush(&mut wr, &mut self.out, reply_timeout, clock).await;
        }
        let _ = wr.shutdown().await;
    }

    /// Waits for every running command and queues its answer (or drops
    /// it, if it was aborted).
    async fn settle(&mut self) {
        while let Some(d) = self.running.join_next_with_id().await {
            self.finish(d.map(|(_, d)| d).map_err(|e| e.id()));
        }
    }

    /// After the targets changed: true if this session's target is still
    /// served, with the same device, and would let this initiator in on
    /// the same terms (networks, initiator names, CHAP credentials,
    /// read-only). A session that would not be admitted now is closed, so
    /// revoking access (removing a share, narrowing its networks, a new
    /// secret) takes effect on the sessions already in, not only on new
    /// logins. Discovery sessions hold no device and go on.
    /// Whether the target table changed since `changed` was last looked
    /// at and this session may no longer use its target (logged).
    fn access_revoked<T>(&self, changed: &mut watch::Receiver<T>) -> bool {
        if !changed.has_changed().unwrap_or(false) {
            return false;
        }
        changed.borrow_and_update();
        self.revoked()
    }

    /// Whether this session may no longer use its target (logged).
    fn revoked(&self) -> bool {
        if self.still_admitted() {
            return false;
        }
        self.log(&format!(
            "closed the session of {} ({}): its target was removed or its access changed",
            self.peer, self.sess.initiator
        ));
        true
    }

    fn still_admitted(&self) -> bool {
        let SessionKind::Normal(old) = &self.sess.kind else {
            return true;
        };
        let table = self.shared.table();
        let Some(new) = table.targets.iter().find(|t| t.name == old.name) else {
            return false;
        };
        Arc::ptr_eq(&new.device, &old.device)
            && new.allows(self.peer.ip())
            && new.admits(&self.sess.initiator)
            && new.chap == old.chap
            && new.mutual_chap == old.mutual_chap
            // The share's own flag: the volume's (`readonly`) is read at
            // each command, and may be turned off again later.
            && new.read_only == old.read_only
    }

    fn log(&self, msg: &str) {
        self.shared.log.log("protocol", msg);
    }

    fn params(&self) -> crate::login::Params {
        self.sess.params
    }

    /// Fills StatSN (advanced if `status`), ExpCmdSN and MaxCmdSN (the
    /// window less the commands running, see the module docs), and
    /// queues the PDU.
    fn send(&mut self, mut p: Pdu, status: bool) {
        let data = std::mem::take(&mut p.data);
        self.send_with(p, status, &[&data]);
    }

    /// [`Self::send`] with `data` (slices in order) as the data segment,
    /// encoded straight into the output buffer.
    fn send_with(&mut self, mut p: Pdu, status: bool, data: &[&[u8]]) {
        p.set_u32(24, self.sess.stat_sn);
        if status {
            self.sess.stat_sn = self.sess.stat_sn.wrapping_add(1);
        }
        let exp = self.sess.exp_cmd_sn;
        p.set_u32(28, exp);
        let window = self
            .shared
            .cfg
            .queue_depth
            .saturating_sub(1)
            .saturating_sub(self.running.len() as u32);
        p.set_u32(32, exp.wrapping_add(window));
        p.encode_into(self.digests, data, &mut self.out);
    }

    fn reject(&mut self, bad: &Pdu, why: u8) {
        let mut p = Pdu::new(op::REJECT);
        p.set_flags(FLAG_F);
        p.bhs[2] = why;
        p.set_itt(RESERVED_TAG);
        p.data = bad.bhs.to_vec();
        self.send(p, true);
    }

    /// Checks a command's CmdSN against the window and advances
    /// ExpCmdSN; false: drop the command silently.
    fn accept_cmd_sn(&mut self, p: &Pdu) -> bool {
        if p.immediate() {
            return true;
        }
        let sn = p.u32_at(24);
        let d = sn.wrapping_sub(self.sess.exp_cmd_sn);
        if d >= self.shared.cfg.queue_depth {
            return false;
        }
        self.sess.exp_cmd_sn = sn.wrapping_add(1);
        true
    }

    async fn handle(&mut self, p: Pdu, conn: &Conn) -> Flow {
        match p.opcode() {
            op::NOP_OUT => {
                if p.itt() == RESERVED_TAG {
                    // A ping answer or a no-reply ping: nothing to say.
                    return Flow::Go;
                }
                if !self.accept_cmd_sn(&p) {
                    return Flow::Go;
                }
                let mut r = Pdu::new(op::NOP_IN);
                r.set_flags(FLAG_F);
                r.set_lun_field(p.lun_field());
                r.set_itt(p.itt());
                r.set_u32(20, RESERVED_TAG);
                let n = p.data.len().min(self.params().initiator_mrdsl as usize);
                r.data = p.data[..n].to_vec();
                self.send(r, true);
                Flow::Go
            }
            op::SCSI_CMD => self.scsi_command(p, conn).await,
            op::DATA_OUT => self.data_out(p, conn).await,
            op::TASK_MGMT => {
                if !self.accept_cmd_sn(&p) {
                    return Flow::Go;
                }
                self.task_mgmt(&p).await
            }
            op::TEXT => {
                if !self.accept_cmd_sn(&p) {
                    return Flow::Go;
                }
                self.text(&p)
            }
            op::LOGOUT => {
                let _ = self.accept_cmd_sn(&p);
                let why = p.flags() & 0x7f;
                if why <= 1 {
                    // Nothing may follow the Logout Response: commands
                    // still running are answered first, and writes still
                    // waiting for data are dropped.
                    self.settle().await;
                    self.tasks.clear();
                    self.task_bytes = 0;
                }
                let mut r = Pdu::new(op::LOGOUT_RSP);
                r.set_flags(FLAG_F);
                // Closing the session or this connection both end the
                // (one-connection) session; recovery is not supported.
                r.bhs[2] = if why <= 1 { 0 } else { 2 };
                r.set_itt(p.itt());
                self.send(r, true);
                if why <= 1 {
                    Flow::Close
                } else {
                    Flow::Go
                }
            }
            op::LOGIN => {
                self.reject(&p, reason::PROTOCOL_ERROR);
                Flow::Go
            }
            _ => {
                self.reject(&p, reason::NOT_SUPPORTED);
                Flow::Go
            }
        }
    }

    fn target(&self) -> Option<Arc<IscsiTarget>> {
        match &self.sess.kind {
            SessionKind::Normal(t) => Some(t.clone()),
            SessionKind::Discovery => None,
        }
    }

    fn limits(&self) -> scsi::Limits {
        scsi::Limits {
            max_transfer: self.shared.cfg.max_transfer,
        }
    }

    async fn scsi_command(&mut self, p: Pdu, conn: &Conn) -> Flow {
        let Some(target) = self.target() else {
            self.reject(&p, reason::PROTOCOL_ERROR);
            return Flow::Go;
        };
        if !self.accept_cmd_sn(&p) {
            return Flow::Go;
        }
        let itt = p.itt();
        if itt == RESERVED_TAG
            || self.tasks.contains_key(&itt)
            || self.running_itts.values().any(|&(i, ..)| i == itt)
        {
            self.reject(&p, reason::INVALID_FIELD);
            return Flow::Go;
        }
        let lun_field = p.lun_field();
        let lun = scsi::lun_of(lun_field);
        let edtl = p.u32_at(20);
        let flags = p.flags();
        // Task attribute: ORDERED (2) and ACA (4) run alone.
        let ordered = matches!(flags & 0x07, 2 | 4);
        let cmd = match scsi::parse(p.cdb(), lun, self.limits()) {
            Ok(c) => c,
            Err(s) => {
                self.respond(itt, scsi::status::CHECK_CONDITION, Some(s), 0, 0);
                return Flow::Go;
            }
        };
        // A unit attention waiting for this nexus answers the command in
        // its place (INQUIRY and REPORT LUNS never report one; REQUEST
        // SENSE returns it as its data). See `crate::lu`.
        let epoch = match &self.lu {
            Some((lu, nexus)) => {
                // The unit is LUN 0: a command to another LUN (one that
                // parses for any LUN, as REQUEST SENSE does) is not its.
                let reports =
                    lun == 0 && !matches!(cmd, Cmd::Inquiry { .. } | Cmd::ReportLuns { .. });
                match lu.admit(nexus, reports) {
                    Admission::Run(e) => e,
                    Admission::Attention(s) => {
                        if let Cmd::RequestSense { alloc, desc } = cmd {
                            let data = scsi::sense_data(s, desc, alloc);
                            self.data_in(itt, lun_field, edtl, data.into());
                        } else {
                            self.respond(itt, scsi::status::CHECK_CONDITION, Some(s), 0, 0);
                        }
                        return Flow::Go;
                    }
                }
            }
            None => 0,
        };
        // An ORDERED task must follow every older task, including writes
        // still waiting for their data, and every newer task must follow
        // an ORDERED one that waits for data. Neither can wait here (the
        // data comes through this loop), so such a command is refused
        // with TASK SET FULL, which the initiator retries; initiators
        // send SIMPLE tasks, for which this never happens.
        if (ordered && !self.tasks.is_empty()) || self.tasks.values().any(|t| t.ordered) {
            self.respond(itt, scsi::status::TASK_SET_FULL, None, 0, 0);
            return Flow::Go;
        }
        let mut cmd = cmd;
        let mut need = cmd.data_out_len();
        if matches!(cmd, Cmd::CompareAndWrite { .. }) && edtl != need {
            // COMPARE AND WRITE must carry exactly the blocks its CDB
            // names, twice (a CDB of 0 blocks with data is a count that
            // did not fit in the CDB's byte).
            self.respond(
                itt,
                scsi::status::CHECK_CONDITION,
                Some(Sense::INVALID_FIELD_IN_CDB),
                0,
                0,
            );
            return Flow::Go;
        }
        if need == 0 {
            let run = Run {
                itt,
                lun_field,
                edtl,
                ordered,
                overflow: 0,
                epoch,
            };
            return self.exec(run, cmd, Vec::new(), conn).await;
        }
        // A WRITE whose expected length is below what its CDB says is
        // carried out for the whole blocks the initiator sends, and
        // answered with an overflow residual for the rest (as SAM asks
        // of a transport that carries less than the command's length).
        let mut overflow = 0;
        if flags & 0x20 != 0 && edtl < need {
            if !edtl.is_multiple_of(scsi::BLOCK as u32) {
                // Part of a block cannot be written: carrying out the whole
                // ones and answering GOOD would drop the rest of the bytes
                // the initiator was told were taken. Nothing is written
                // (FCP-4's second choice for an overflow), with the
                // residual said all the same.
                self.respond(
                    itt,
                    scsi::status::CHECK_CONDITION,
                    Some(Sense::INVALID_FIELD_IN_IU),
                    0x04,
                    need - edtl,
                );
                return Flow::Go;
            }
            let blocks = edtl / scsi::BLOCK as u32;
            let short = match cmd {
                Cmd::Write { lba, fua, .. } => Some(Cmd::Write { lba, blocks, fua }),
                Cmd::WriteVerify { lba, bytchk, .. } => Some(Cmd::WriteVerify {
                    lba,
                    blocks,
                    bytchk,
                }),
                _ => None,
            };
            if let Some(c) = short {
                overflow = need - edtl;
                need = edtl;
                cmd = c;
            }
        }
        if need == 0 {
            let run = Run {
                itt,
                lun_field,
                edtl,
                ordered,
                overflow,
                epoch,
            };
            return self.exec(run, cmd, Vec::new(), conn).await;
        }
        let exact = matches!(cmd, Cmd::WriteSame { .. } | Cmd::CompareAndWrite { .. });
        if flags & 0x20 == 0 || edtl < need || (exact && edtl != need) {
            // The command needs more data than the initiator means to
            // send (or, for WRITE SAME and COMPARE AND WRITE, other than
            // exactly what the CDB says).
            self.respond(
                itt,
                scsi::status::CHECK_CONDITION,
                Some(Sense::INVALID_FIELD_IN_CDB),
                0,
                0,
            );
            return Flow::Go;
        }
        if cmd.writes() && target.is_read_only() {
            self.respond(
                itt,
                scsi::status::CHECK_CONDITION,
                Some(Sense::WRITE_PROTECTED),
                0,
                0,
            );
            return Flow::Go;
        }
        let prm = self.params();
        if (!p.data.is_empty() && !prm.immediate_data) || p.data.len() as u32 > prm.first_burst {
            self.reject(&p, reason::PROTOCOL_ERROR);
            return Flow::Close;
        }
        if self.task_bytes + need as u64 > self.shared.cfg.max_pending_write_bytes {
            self.respond(itt, scsi::status::TASK_SET_FULL, None, 0, 0);
            return Flow::Go;
        }
        let take = p.data.len().min(need as usize);
        // Room for all of it at once (`need` is within the pending-write
        // budget checked above): grown Data-Out by Data-Out, the buffer
        // was reallocated and copied over again as it doubled.
        let mut buf = Vec::with_capacity(need as usize);
        buf.extend_from_slice(&p.data[..take]);
        let task = WriteTask {
            ordered,
            cmd,
            lun_field,
            edtl,
            want: need,
            buf,
            received: p.data.len() as u32,
            unsolicited: !p.is_final() && !prm.initial_r2t,
            r2t: None,
            r2tsn: 0,
            overflow,
            data_sn: 0,
            broken: false,
            epoch,
        };
        self.task_bytes += need as u64;
        self.tasks.insert(itt, task);
        self.advance(itt, conn).await
    }

    /// Runs a write whose data is all there, or asks for more.
    async fn advance(&mut self, itt: u32, conn: &Conn) -> Flow {
        let max_burst = self.params().max_burst;
        let ttt = self.next_ttt;
        let Some(t) = self.tasks.get_mut(&itt) else {
            return Flow::Go;
        };
        if t.unsolicited || t.r2t.is_some() {
            return Flow::Go;
        }
        if t.received >= t.want {
            let Some(t) = self.tasks.remove(&itt) else {
                return Flow::Go;
            };
            self.task_bytes -= t.want as u64;
            let run = Run {
                itt,
                lun_field: t.lun_field,
                edtl: t.edtl,
                ordered: t.ordered,
                overflow: t.overflow,
                epoch: t.epoch,
            };
            return self.exec(run, t.cmd, t.buf, conn).await;
        }
        let len = (t.want - t.received).min(max_burst);
        let mut r = Pdu::new(op::R2T);
        r.set_flags(FLAG_F);
        r.set_lun_field(t.lun_field);
        r.set_itt(itt);
        r.set_u32(20, ttt);
        r.set_u32(36, t.r2tsn);
        r.set_u32(40, t.received);
        r.set_u32(44, len);
        t.r2t = Some((ttt, t.received + len));
        t.r2tsn += 1;
        t.data_sn = 0;
        self.next_ttt = ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        self.send(r, false);
        Flow::Go
    }

    async fn data_out(&mut self, p: Pdu, conn: &Conn) -> Flow {
        let itt = p.itt();
        let first_burst = self.params().first_burst;
        let Some(t) = self.tasks.get_mut(&itt) else {
            // Aborted or refused before its data came.
            return Flow::Go;
        };
        let ttt = p.u32_at(20);
        let off = p.u32_at(40);
        let len = p.data.len() as u32;
        let end = off.checked_add(len);
        let solicited = match t.r2t {
            Some((tt, _)) if tt == ttt => true,
            _ if ttt == RESERVED_TAG && t.unsolicited => false,
            _ => {
                self.reject(&p, reason::PROTOCOL_ERROR);
                return Flow::Close;
            }
        };
        let limit = match (solicited, t.r2t) {
            (true, Some((_, e))) => e,
            _ => first_burst.min(t.edtl),
        };
        if t.broken {
            // The rest of a burst whose DataSN went wrong: discarded;
            // its end (F bit) concludes the task.
            if p.is_final() {
                return self.conclude_broken(itt);
            }
            return Flow::Go;
        }
        let Some(end) = end.filter(|&e| off == t.received && e <= limit && e <= t.edtl) else {
            self.reject(&p, reason::INVALID_FIELD);
            return Flow::Close;
        };
        if p.u32_at(36) != t.data_sn {
            // A DataSN out of order means an earlier Data-Out was lost
            // (RFC 7143 section 7.8), which is handled as a digest error
            // (section 7.7): at error recovery level 0 the PDU is
            // rejected, the rest of the burst is awaited (the initiator
            // sends it anyway) and the task ends with CHECK CONDITION,
            // "protocol service CRC error". The session goes on.
            t.broken = true;
            self.reject(&p, reason::DATA_DIGEST);
            if p.is_final() {
                return self.conclude_broken(itt);
            }
            return Flow::Go;
        }
        if off < t.want {
            let n = (end.min(t.want) - off) as usize;
            t.buf.extend_from_slice(&p.data[..n]);
        }
        t.received = end;
        t.data_sn = t.data_sn.wrapping_add(1);
        if solicited {
            if p.is_final() || Some(end) == t.r2t.map(|r| r.1) {
                t.r2t = None;
            }
        } else if p.is_final() {
            t.unsolicited = false;
        }
        self.advance(itt, conn).await
    }

    /// Ends a write whose Data-Out sequence broke, once its burst is
    /// over: CHECK CONDITION, ABORTED COMMAND / PROTOCOL SERVICE CRC
    /// ERROR, as RFC 7143 section 13.5.1 names it.
    fn conclude_broken(&mut self, itt: u32) -> Flow {
        if let Some(t) = self.tasks.remove(&itt) {
            self.task_bytes -= t.want as u64;
            self.respond(
                itt,
                scsi::status::CHECK_CONDITION,
                Some(Sense::PROTOCOL_CRC),
                0,
                0,
            );
        }
        Flow::Go
    }

    /// Starts a command on the blocking pool; its Data-In and status are
    /// queued when it finishes (`finish`). An ORDERED task waits
    /// for every running task first and is waited for itself.
    async fn exec(&mut self, run: Run, cmd: Cmd, data: Vec<u8>, conn: &Conn) -> Flow {
        let (Some(target), Some((lu, nexus))) = (self.target(), self.lu.clone()) else {
            return Flow::Go;
        };
        if run.ordered {
            self.settle().await;
        }
        let busy = conn.state().begin();
        let limits = self.limits();
        let lun = scsi::lun_of(run.lun_field);
        let out_len = data.len() as u32;
        let Run {
            itt,
            lun_field,
            edtl,
            overflow,
            epoch,
            ..
        } = run;
        let done = move |cmd, target, res| Done {
            itt,
            lun_field,
            edtl,
            cmd,
            out_len,
            overflow,
            target,
            res,
        };
        // A READ the device answers from memory is answered here, without
        // the hand-off to a blocking thread and back (two thread switches,
        // most of a cached read's cost). An ORDERED one keeps its order
        // through the usual path.
        if !run.ordered && matches!(cmd, Cmd::Read { .. }) {
            // Read-only is not consulted by a READ (and asking the device
            // could wait).
            let u = unit(&target, false, limits, lun, &lu, &nexus, epoch);
            if let Some(res) = scsi::execute_cached(&u, &cmd) {
                drop(busy);
                self.finish(Ok(done(cmd, target, res)));
                return Flow::Go;
            }
        }
        // What it holds while it runs: what it reads, whatever length the
        // initiator says it expects (a READ sent with an expected length
        // of 0 still reads its blocks into memory).
        let charge = edtl.max(match cmd {
            Cmd::Read { blocks, .. } | Cmd::Verify { blocks, .. } => {
                blocks.saturating_mul(scsi::BLOCK as u32)
            }
            _ => 0,
        });
        let handle = self.running.spawn(async move {
            let t2 = target.clone();
            let c2 = cmd.clone();
            let res = tokio::task::spawn_blocking(move || {
                let u = unit(&t2, t2.is_read_only(), limits, lun, &lu, &nexus, epoch);
                scsi::execute(&u, &c2, &data)
            })
            .await
            .unwrap_or(Err(Failure::Check(Sense::INTERNAL)));
            drop(busy);
            done(cmd, target, res)
        });
        self.running_itts.insert(handle.id(), (itt, charge, epoch));
        self.running_bytes += u64::from(charge);
        if run.ordered {
            self.settle().await;
        }
        Flow::Go
    }

    /// Queues the Data-In and status of a finished command, unless task
    /// management aborted it.
    fn finish(&mut self, d: Result<Done, tokio::task::Id>) {
        let d = match d {
            Ok(d) => d,
            Err(id) => {
                // The task was lost (it cannot panic: the device call's
                // panic is caught above); its initiator times it out.
                if let Some((itt, edtl, _)) = self.running_itts.remove(&id) {
                    self.running_bytes = self.running_bytes.saturating_sub(u64::from(edtl));
                    self.aborted.remove(&itt);
                    self.log(&format!("command {itt:#x} of {} was lost", self.peer));
                }
                return;
            }
        };
        let mut charged = 0;
        self.running_itts.retain(|_, &mut (i, c, _)| {
            if i == d.itt {
                charged += u64::from(c);
            }
            i != d.itt
        });
        self.running_bytes = self.running_bytes.saturating_sub(charged);
        if self.aborted.remove(&d.itt) || matches!(d.res, Err(Failure::Aborted)) {
            return;
        }
        let Done {
            itt,
            lun_field,
            edtl,
            cmd,
            out_len,
            overflow,
            target,
            res,
        } = d;
        match res {
            Ok(_) if overflow > 0 => {
                self.respond(itt, scsi::status::GOOD, None, 0x04, overflow);
            }
            Ok(_) if out_len > 0 => {
                // A write: any Data-Out beyond the command's need is an
                // underflow of the expected length.
                self.respond(
                    itt,
                    scsi::status::GOOD,
                    None,
                    0x02,
                    edtl - out_len.min(edtl),
                );
            }
            Ok(din) => self.data_in(itt, lun_field, edtl, din),
            Err(Failure::ReservationConflict) => {
                self.respond(itt, scsi::status::RESERVATION_CONFLICT, None, 0, 0);
            }
            Err(Failure::Aborted) => {}
            Err(Failure::Check(s)) => {
                if matches!(s.key, 0x03 | 0x04) {
                    self.shared.log.log(
                        "device",
                        &format!("target {:?}: {:?} failed: {s:?}", target.name, cmd),
                    );
                }
                self.respond(itt, scsi::status::CHECK_CONDITION, Some(s), 0, 0);
            }
        }
    }

    /// A SCSI Response PDU; `resid_flag` 0x04 overflow, 0x02 underflow.
    fn respond(&mut self, itt: u32, status: u8, sense: Option<Sense>, resid_flag: u8, resid: u32) {
        let mut r = Pdu::new(op::SCSI_RSP);
        let flag = if resid == 0 { 0 } else { resid_flag };
        r.set_flags(FLAG_F | flag);
        r.bhs[3] = status;
        r.set_itt(itt);
        r.set_u32(44, if flag == 0 { 0 } else { resid });
        if let Some(s) = sense {
            let f = s.fixed();
            let mut d = (f.len() as u16).to_be_bytes().to_vec();
            d.extend_from_slice(&f);
            r.data = d;
        }
        self.send(r, true);
    }

    /// Data-In PDUs for `din` (cut to the expected length) with the
    /// status in the last one; a SCSI Response if there is no data. Each
    /// PDU's data segment is encoded from the slices of the blocks `din`
    /// shares (one copy, into the output buffer).
    fn data_in(&mut self, itt: u32, lun_field: [u8; 8], edtl: u32, din: tarn_vol::ReadData) {
        let produced = din.len().min(u32::MAX as usize) as u32;
        let (rflag, resid) = match produced.cmp(&edtl) {
            std::cmp::Ordering::Greater => (0x04, produced - edtl),
            std::cmp::Ordering::Less => (0x02, edtl - produced),
            std::cmp::Ordering::Equal => (0, 0),
        };
        let slices: Vec<&[u8]> = din.slices().collect();
        let send = Span::new(&slices, produced.min(edtl) as usize);
        if send.len == 0 {
            self.respond(itt, scsi::status::GOOD, None, rflag, resid);
            return;
        }
        let prm = self.params();
        let mrdsl = prm.initiator_mrdsl.max(512) as usize;
        let burst = prm.max_burst.max(512) as usize;
        let mut off = 0usize;
        let mut sn = 0u32;
        while off < send.len {
            let burst_end = (off / burst + 1) * burst;
            let n = mrdsl.min(burst_end - off).min(send.len - off);
            let last = off + n == send.len;
            let mut p = Pdu::new(op::DATA_IN);
            let mut f = 0u8;
            if last || off + n == burst_end {
                f |= FLAG_F;
            }
            if last {
                f |= 0x01 | rflag; // S and the residual flag
                p.bhs[3] = scsi::status::GOOD;
                p.set_u32(44, resid);
            }
            p.set_flags(f);
            p.set_lun_field(lun_field);
            p.set_itt(itt);
            p.set_u32(20, RESERVED_TAG);
            p.set_u32(36, sn);
            p.set_u32(40, off as u32);
            self.send_with(p, last, &send.range(off, n));
            off += n;
            sn += 1;
        }
    }

    /// Drops the waiting tasks and the responses of the running ones
    /// (task management of this session).
    fn end_tasks(&mut self) {
        self.end_tasks_before(u64::MAX);
    }

    /// Drops the tasks admitted before reset epoch `epoch` (another
    /// session's reset moved the unit to it). A command admitted in the
    /// new epoch (after the reset, when its attention was already
    /// posted) may have been read before this session saw the reset: it
    /// is not the reset's to end.
    fn end_tasks_before(&mut self, epoch: u64) {
        let mut freed = 0;
        self.tasks.retain(|_, t| {
            let keep = t.epoch >= epoch;
            if !keep {
                freed += t.want as u64;
            }
            keep
        });
        self.task_bytes = self.task_bytes.saturating_sub(freed);
        self.aborted.extend(
            self.running_itts
                .values()
                .filter(|&&(_, _, e)| e < epoch)
                .map(|&(i, ..)| i),
        );
    }

    async fn task_mgmt(&mut self, p: &Pdu) -> Flow {
        let func = p.flags() & 0x7f;
        let lun = scsi::lun_of(p.lun_field());
        let mut close = false;
        let response = match func {
            1 => {
                let itt = p.u32_at(20);
                let waiting = self.tasks.remove(&itt);
                if let Some(t) = &waiting {
                    self.task_bytes -= t.want as u64;
                }
                if self.running_itts.values().any(|&(i, ..)| i == itt) {
                    self.aborted.insert(itt);
                    self.settle().await;
                    0
                } else if waiting.is_some() {
                    0
                } else {
                    // Completed (and answered) before the function came,
                    // or never sent: "task does not exist".
                    1
                }
            }
            2 | 4 | 5 if lun != 0 => 2,
            2 | 4 | 5 | 6 | 7 => {
                self.end_tasks();
                self.settle().await;
                // All but ABORT TASK SET end the other nexuses' tasks too
                // (the unit has one task set): see `crate::lu`.
                if func != 2 {
                    if let Some((lu, nexus)) = self.lu.clone() {
                        // A reset is reported to every nexus (this one
                        // too, as SAM-5 asks); CLEAR TASK SET to the others.
                        let (epoch, resets) = if func == 4 {
                            (lu.reset(Some(&nexus), Sense::COMMANDS_CLEARED), false)
                        } else {
                            (lu.reset(None, Sense::RESET_OCCURRED), true)
                        };
                        // This session ended its own tasks above; what it
                        // reads next came after the reset.
                        if let Some(rx) = self.resets.as_mut() {
                            rx.borrow_and_update();
                        }
                        // Wait for the writes other sessions had running;
                        // a reset also ends the SPC-2 reservation.
                        let _ = tokio::task::spawn_blocking(move || lu.finish_reset(epoch, resets))
                            .await;
                    }
                }
                close = func == 7;
                0
            }
            3 => 5,
            8 => 4,
            _ => 255,
        };
        let mut r = Pdu::new(op::TASK_MGMT_RSP);
        r.set_flags(FLAG_F);
        r.bhs[2] = response;
        r.set_itt(p.itt());
        self.send(r, true);
        if close {
            Flow::Close
        } else {
            Flow::Go
        }
    }

    fn text(&mut self, p: &Pdu) -> Flow {
        let ttt = p.u32_at(20);
        let body = if ttt != RESERVED_TAG {
            match self.text_rest.take() {
                Some((t, rest)) if t == ttt => rest,
                _ => {
                    self.reject(p, reason::INVALID_FIELD);
                    return Flow::Go;
                }
            }
        } else {
            self.text_rest = None;
            let pairs = match text::parse(&p.data) {
                Ok(x) => x,
                Err(_) => {
                    self.reject(p, reason::INVALID_FIELD);
                    return Flow::Go;
                }
            };
            let mut out = Vec::new();
            for (k, v) in pairs {
                if k == "SendTargets" {
                    out.extend(self.send_targets(&v));
                } else {
                    out.push((k, "NotUnderstood".to_string()));
                }
            }
            text::encode(&out)
        };
        let max = self.params().initiator_mrdsl as usize;
        let mut r = Pdu::new(op::TEXT_RSP);
        r.set_lun_field(p.lun_field());
        r.set_itt(p.itt());
        if body.len() > max {
            let t = self.next_ttt;
            self.next_ttt = t.wrapping_add(1).max(1);
            r.set_flags(0x40); // C: more follows
            r.set_u32(20, t);
            r.data = body[..max].to_vec();
            self.text_rest = Some((t, body[max..].to_vec()));
        } else {
            r.set_flags(FLAG_F);
            r.set_u32(20, RESERVED_TAG);
            r.data = body;
        }
        self.send(r, true);
        Flow::Go
    }

    /// `TargetName` and `TargetAddress` pairs for a SendTargets value.
    fn send_targets(&self, value: &str) -> Vec<(String, String)> {
        let ip = self.local.ip().to_canonical();
        let addr = match ip {
            std::net::IpAddr::V4(a) => format!("{a}:{},1", self.local.port()),
            std::net::IpAddr::V6(a) => format!("[{a}]:{},1", self.local.port()),
        };
        let targets: Vec<Arc<IscsiTarget>> = match &self.sess.kind {
            SessionKind::Normal(t) => {
                if value == "All" || value.is_empty() || value.eq_ignore_ascii_case(&t.name) {
                    vec![t.clone()]
                } else {
                    Vec::new()
                }
            }
            SessionKind::Discovery => self
                .shared
                .table()
                .visible_to(self.peer.ip())
                .into_iter()
                .filter(|t| t.admits(&self.sess.initiator))
                .filter(|t| value == "All" || value.eq_ignore_ascii_case(&t.name))
                .collect(),
        };
        let mut out = Vec::new();
        for t in targets {
            out.push(("TargetName".to_string(), t.name.clone()));
            out.push(("TargetAddress".to_string(), addr.clone()));
        }
        out
    }
}

/// Writes everything queued; false if that failed or the initiator took no
/// byte of it for `timeout`.
async fn flush<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    out: &mut Vec<u8>,
    timeout: Option<Duration>,
    clock: &tarn_conn::ProgressClock,
) -> bool {
    let write = async {
        w.write_all(out).await?;
        w.flush().await
    };
    // Given up when the initiator takes no byte for `timeout`, not when
    // a large batch of Data-In takes longer to read.
    let ok = clock.finish(write, timeout).await;
    out.clear();
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The slices a Data-In PDU is built from are exactly the bytes
        /// of its range of the read, whatever the blocks' sizes.
        #[test]
        fn a_span_range_is_those_bytes_of_the_read(
            lens in proptest::collection::vec(0usize..5000, 0..30),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
        ) {
            let blocks: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let slices: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
            let flat: Vec<u8> = blocks.concat();
            let span = Span::new(&slices, flat.len());
            let (x, y) = (a.index(flat.len() + 1), b.index(flat.len() + 1));
            let (off, end) = (x.min(y), x.max(y));
            let got: Vec<u8> = span.range(off, end - off).concat();
            prop_assert_eq!(&got[..], &flat[off..end]);
        }
    }
}

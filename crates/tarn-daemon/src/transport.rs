//! The daemon's admin transport: a Unix stream socket serving the API.
//!
//! Lifecycle:
//!
//! 1. Bind. The socket's directory is created mode 0700 if missing. An
//!    existing socket that answers a connect means another daemon owns it
//!    and we refuse; one that refuses connections is stale and is replaced.
//!    The socket itself is made mode 0600: only the daemon's user may talk
//!    to it.
//! 2. Serve. The accept loop sleeps in `poll(2)` on the listener and on a
//!    wake pipe, with no timeout: a stop request (a signal, whose handler
//!    writes one byte to the pipe, or `daemon.stop`) wakes it, so an idle
//!    daemon uses no CPU at all. Each connection gets a thread. A connection sends any number of request lines, each at most
//!    [`MAX_REQUEST_BYTES`]; a longer line is drained, answered with an
//!    `invalid` error, and the connection goes on. Only the daemon's own
//!    user and root are served (checked on the peer's credentials, beside
//!    the socket's mode 0600).
//!
//!    A local program holding connections open (a leak, a hung script)
//!    must not lock `tarn` commands out, so connections are admitted like
//!    the network servers' (tarn-conn): at most [`MAX_CONNECTIONS`] at
//!    once, and when all are taken an idle one (no request in progress) is
//!    closed for the newcomer: one that never sent a request if any, a
//!    silent one before one whose request is arriving (a command that has
//!    just connected is not pushed out by a burst of newcomers before its
//!    line is read), the longest idle of those; only when every connection is
//!    running a request is the newcomer answered `busy` and closed. A
//!    connection with no request for [`IDLE_TIMEOUT`] is closed, and a
//!    request line must arrive whole within [`REQUEST_TIMEOUT`] of its
//!    first byte, so a trickling client cannot hold a slot either. Each
//!    decision is counted ([`AdminStats`], in `daemon.stats`) and logged at
//!    most once per kind every 10 seconds.
//! 3. Stop, on SIGINT/SIGTERM or a `daemon.stop` request. The socket file is
//!    removed first (new clients see "no daemon"), reading is shut on every
//!    connection so no new request starts, requests already running finish
//!    (bounded wait), then [`Node::shutdown`] exports the pools. Whoever
//!    sent `daemon.stop` is answered only after that, so `tarn daemon stop`
//!    returns once the pools are safely exported. A second signal during the
//!    stop kills the process the default way.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tarn_api::params::ConnCounters;
use tarn_api::{method, read_line_bounded, ApiError, Backend, LineRead, Response};
use tarn_conn::RateLog;

use crate::error::{DaemonError, IoContext, Result};
use crate::pools::Tuning;

/// Returns early with a [`DaemonError::Message`] made like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(DaemonError::msg(format!($($arg)*)))
    };
}

/// Longest request line the daemon holds in memory.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Most connections open at once; at the limit the longest-idle one is
/// closed for a newcomer.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may go without a request before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request line may take to arrive, from its first byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a response write may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a streamed body (`dataset.send`, `dataset.receive`) may stall
/// between two reads or writes: a slow pipe (ssh, a full disk on the
/// other end) waits this long before the stream is given up.
const STREAM_STALL: Duration = Duration::from_secs(600);
/// How long a stop waits for running requests before exporting anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop waits for the last answers to be written.
const FAREWELL_TIMEOUT: Duration = Duration::from_secs(5);

/// How to run the daemon.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Path of the admin socket.
    pub socket: PathBuf,
    /// Where the daemon keeps its own state (e.g. which pools to import);
    /// read by the backend, not by the transport.
    pub state_dir: PathBuf,
    /// Connection limit; [`MAX_CONNECTIONS`] by default.
    pub max_connections: usize,
    /// Request line limit in bytes; [`MAX_REQUEST_BYTES`] by default.
    pub max_request_bytes: usize,
    /// Idle limit of a connection; [`IDLE_TIMEOUT`] by default, `None`:
    /// never.
    pub idle_timeout: Option<Duration>,
    /// Time limit of one request line; [`REQUEST_TIMEOUT`] by default.
    pub request_timeout: Duration,
    /// Stop on SIGINT/SIGTERM. The binary sets this; tests that run a daemon
    /// inside the test process leave it off.
    pub handle_signals: bool,
    /// Limits and intervals handed to every pool the daemon imports.
    pub tuning: Tuning,
    /// Where NFS and WebDAV listen (not started when absent).
    pub servers: crate::servers::ServerOptions,
}

impl DaemonOptions {
    /// Options with the default limits and no signal handling.
    pub fn new(socket: PathBuf, state_dir: PathBuf) -> Self {
        DaemonOptions {
            socket,
            state_dir,
            max_connections: MAX_CONNECTIONS,
            max_request_bytes: MAX_REQUEST_BYTES,
            idle_timeout: Some(IDLE_TIMEOUT),
            request_timeout: REQUEST_TIMEOUT,
            handle_signals: false,
            tuning: Tuning::default(),
            servers: crate::servers::ServerOptions::default(),
        }
    }
}

/// What the transport serves: the admin API, and a clean stop.
pub trait Node: Backend {
    /// Exports every pool cleanly; called once when the daemon stops, after
    /// the last running request has finished (or the drain timed out).
    /// Returns what could not be done (a pool whose export failed), which
    /// `tarn daemon stop` reports instead of success.
    fn shutdown(&self) -> Vec<String>;
}

// ---------------------------------------------------------------------------
// Signals

/// Set by the signal handler; read by the accept loop.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// The write end of the serving daemon's wake pipe, for the signal
/// handler (-1: none).
static SIGNAL_WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // An atomic store and a write(2) of one byte: both async-signal-safe.
    SIGNALLED.store(true, Ordering::SeqCst);
    let fd = SIGNAL_WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: writes one byte from a valid local to a descriptor the
        // daemon keeps open while the handler is installed; a failure (a
        // full pipe already holds a wake-up) is harmless.
        unsafe {
            libc::write(fd, [1u8].as_ptr().cast(), 1);
        }
    }
}

/// A non-blocking pipe whose read end the accept loop polls beside the
/// listener: one byte written to it wakes the loop to look at the stop
/// flags, so the loop needs no timeout.
struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakePipe {
    fn new() -> Result<WakePipe> {
        let mut fds = [-1 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe2 to
        // fill; on success both are new and owned by nobody else.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            return Err(DaemonError::msg(format!(
                "cannot make the wake pipe: {err}"
            )));
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(WakePipe { read, write })
    }

    /// Wakes the loop (never blocks: a full pipe already holds a wake-up).
    fn wake(&self) {
        // SAFETY: one byte from a valid local to our open write end.
        unsafe {
            libc::write(self.write.as_raw_fd(), [1u8].as_ptr().cast(), 1);
        }
    }

    /// Empties the pipe after a wake-up.
    fn drain(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads into a valid local buffer of its length from our
        // open, non-blocking read end; stops at EAGAIN or EOF.
        while unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {
        }
    }
}

/// SIGINT/SIGTERM handlers for the daemon's lifetime; the previous
/// dispositions come back on [`SignalGuard::restore`] or drop.
struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    fn install() -> Result<Self> {
        SIGNALLED.store(false, Ordering::SeqCst);
        let mut guard = SignalGuard {
            previous: Vec::new(),
        };
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: both structs are plain C data, zero is a valid initial
            // value, and the handler only performs an atomic store.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &action, &mut old) != 0 {
                    let err = io::Error::last_os_error();
                    return Err(DaemonError::msg(format!(
                        "cannot install the handler for signal {sig}: {err}"
                    )));
                }
                guard.previous.push((sig, old));
            }
        }
        Ok(guard)
    }

    fn restore(&mut self) {
        SIGNAL_WAKE_FD.store(-1, Ordering::SeqCst);
        for (sig, old) in self.previous.drain(..) {
            // SAFETY: `old` was filled in by sigaction for this signal.
            unsafe {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        self.restore();
    }
}

// ---------------------------------------------------------------------------
// Socket

/// The bound listener and the identity of its socket file, so the daemon
/// removes only the file it created.
struct Bound {
    listener: UnixListener,
    path: PathBuf,
    dev_ino: (u64, u64),
}

impl Bound {
    fn remove_socket(&self) {
        match fs::symlink_metadata(&self.path) {
            Ok(md) if (md.dev(), md.ino()) == self.dev_ino => {
                if let Err(e) = fs::remove_file(&self.path) {
                    log(&format!(
                        "cannot remove socket {}: {e}",
                        self.path.display()
                    ));
                }
            }
            _ => {}
        }
    }
}

fn bind_socket(path: &Path) -> Result<Bound> {
    let shown = path.display();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .io_context(|| {
                    format!(
                        "cannot create the socket directory {}; create it or choose another --socket",
                        dir.display()
                    )
                })?;
        }
        // Another user who can write the directory could swap our socket
        // for theirs; a sticky directory such as /tmp protects its entries.
        let md = fs::metadata(dir).io_context(|| format!("cannot examine {}", dir.display()))?;
        // Whoever owns the directory can delete our socket and put theirs
        // in its place, sticky bit or not.
        let own = tarn_api::peer::own_uid();
        if !tarn_api::peer::allowed(md.uid(), own) {
            bail!(
                "the socket directory {} belongs to uid {}, not to this user (uid {own}) or root; \
                 choose another --socket",
                dir.display(),
                md.uid()
            );
        }
        if md.mode() & 0o022 != 0 && md.mode() & 0o1000 == 0 {
            bail!(
                "the socket directory {} is writable by other users; \
                 make it private (chmod 700 {}) or choose another --socket",
                dir.display(),
                dir.display()
            );
        }
    }
    match fs::symlink_metadata(path) {
        Ok(md) if !md.file_type().is_socket() => {
            bail!("{shown} exists and is not a socket; remove it or choose another --socket")
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => bail!(
                "a tarn daemon is already listening on {shown}\n\
                 hint: stop it with `tarn daemon stop`, or start this one with another --socket"
            ),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                fs::remove_file(path).io_context(|| {
                    format!("cannot remove the stale socket {shown}; remove it by hand")
                })?;
            }
            Err(e) => {
                bail!("{shown} exists but cannot be checked ({e}); remove it if no daemon uses it")
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => bail!("cannot examine {shown}: {e}"),
    }
    let listener = UnixListener::bind(path)
        .io_context(|| format!("cannot listen on {shown}; choose another --socket"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .io_context(|| format!("cannot restrict {shown} to mode 0600"))?;
    let md = fs::symlink_metadata(path).io_context(|| format!("cannot examine {shown}"))?;
    listener
        .set_nonblocking(true)
        .io_context(|| format!("cannot make {shown} non-blocking"))?;
    Ok(Bound {
        listener,
        path: path.to_path_buf(),
        dev_ino: (md.dev(), md.ino()),
    })
}

fn log(message: &str) {
    if message.starts_with("cannot") {
        log::warn!("tarn daemon: {message}");
    } else {
        log::info!("tarn daemon: {message}");
    }
}

/// Tells systemd where the daemon stands, for a `Type=notify` service
/// (packaging/tarn.service): `READY=1` once the admin socket and the
/// servers are up, `STOPPING=1` when it stops. Outside systemd (no
/// `NOTIFY_SOCKET`) it does nothing.
pub fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|sock| {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_bytes();
        match bytes.strip_prefix(b"@") {
            #[cfg(target_os = "linux")]
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)
            }
            _ => sock.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = sent {
        log(&format!("cannot tell systemd {state:?}: {e}"));
    }
}

// ---------------------------------------------------------------------------
// Connections

/// Counters of the admin socket's admission decisions since the start.
#[derive(Default)]
struct AdminCounters {
    accepted: AtomicU64,
    refused_full: AtomicU64,
    refused_user: AtomicU64,
    evicted: AtomicU64,
    idle_closed: AtomicU64,
    request_timeouts: AtomicU64,
}

/// The admin socket's counters as `daemon.stats` reports them.
pub type AdminStats = ConnCounters;

/// State shared by the accept loop and the connection threads.
struct Shared {
    stop: AtomicBool,
    /// Wakes the accept loop when `stop` is set.
    wake: WakePipe,
    conns: Mutex<Conns>,
    changed: Condvar,
    max_request_bytes: usize,
    max_connections: usize,
    idle_timeout: Option<Duration>,
    request_timeout: Duration,
    counters: AdminCounters,
    log: RateLog,
}

/// What the accept loop knows of an open connection.
struct Open {
    /// A handle on the socket, to shut it at eviction or stop.
    stream: UnixStream,
    activity: Arc<Mutex<Activity>>,
}

/// Whether a connection is running a request, and since when it is idle.
struct Activity {
    /// Running a request, or writing its answer: not to be evicted.
    busy: bool,
    /// End of the last request (or the accept).
    idle_since: Instant,
    /// A request has been answered on this connection.
    served: bool,
    /// Bytes of a request have been read and its answer is not yet sent:
    /// the client is talking, not idling.
    arriving: bool,
    /// Evicted: the connection must not start another request.
    closing: bool,
}

#[derive(Default)]
struct Conns {
    /// Every open connection.
    open: HashMap<u64, Open>,
    next_id: u64,
    /// Connections waiting in `daemon.stop` for the stop to finish.
    waiting_for_stop: usize,
    /// The backend has been shut down.
    stopped: bool,
    /// What the stop could not do ([`Node::shutdown`]), for the requests
    /// that asked for it.
    stop_failures: Vec<String>,
}

fn lock_activity(a: &Mutex<Activity>) -> MutexGuard<'_, Activity> {
    a.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `done` holds or `timeout` passes; answers whether it held.
    fn wait_until(&self, timeout: Duration, done: impl Fn(&Conns) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut conns = self.lock();
        while !done(&conns) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            conns = self
                .changed
                .wait_timeout(conns, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Asks the accept loop to stop and waits until the backend is shut down.
    fn stop_and_wait(&self) -> Vec<String> {
        let mut conns = self.lock();
        conns.waiting_for_stop += 1;
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        self.changed.notify_all();
        while !conns.stopped {
            conns = self.changed.wait(conns).unwrap_or_else(|e| e.into_inner());
        }
        conns.waiting_for_stop -= 1;
        self.changed.notify_all();
        conns.stop_failures.clone()
    }

    /// The counters, for `daemon.stats`.
    fn stats(&self) -> AdminStats {
        let c = &self.counters;
        AdminStats {
            open: self.lock().open.len() as u64,
            accepted: c.accepted.load(Ordering::Relaxed),
            refused_full: c.refused_full.load(Ordering::Relaxed),
            refused_unlisted: c.refused_user.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            idle_closed: c.idle_closed.load(Ordering::Relaxed),
            request_timeouts: c.request_timeouts.load(Ordering::Relaxed),
            ..AdminStats::default()
        }
    }

    /// Closes an idle connection to make room, the least valuable one: a
    /// connection that never sent a request before one that has (a
    /// command's connection between its first and its next request is
    /// spared), a silent one before one whose request is arriving (read
    /// in part, or waiting unread in the socket: a command that has just
    /// connected must not be pushed out by a burst of newcomers before its
    /// thread reads its line), and of those the one idle the longest.
    /// Answers whether one was closed. Called with the table locked.
    ///
    /// The socket is peeked lazily, in the order of what the connection
    /// threads have marked: usually only the first candidate is, however
    /// many connections the table holds.
    fn evict_one(&self, conns: &mut Conns) -> bool {
        let mut marked: Vec<(bool, bool, Instant, u64)> = conns
            .open
            .iter()
            .filter_map(|(id, o)| {
                let a = lock_activity(&o.activity);
                (!a.busy && !a.closing).then_some((a.served, a.arriving, a.idle_since, *id))
            })
            .collect();
        marked.sort_unstable();
        // A peek can only rank a candidate later than its mark, so once a
        // mark ranks at or after the best found, nothing later wins.
        let mut best: Option<(bool, bool, Instant, u64)> = None;
        for key in marked {
            if best.is_some_and(|b| key >= b) {
                break;
            }
            let (served, arriving, since, id) = key;
            let waiting = !arriving
                && conns
                    .open
                    .get(&id)
                    .is_some_and(|o| bytes_waiting(&o.stream));
            let real = (served, arriving || waiting, since, id);
            best = Some(best.map_or(real, |b| b.min(real)));
        }
        let Some((_, _, since, id)) = best else {
            return false;
        };
        let Some(open) = conns.open.remove(&id) else {
            return false;
        };
        lock_activity(&open.activity).closing = true;
        let _ = open.stream.shutdown(std::net::Shutdown::Both);
        self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        self.log.log(
            "evicted",
            &format!(
                "connection limit ({}) reached: closed a connection idle for {} ms for a newcomer",
                self.max_connections,
                since.elapsed().as_millis()
            ),
        );
        self.changed.notify_all();
        true
    }
}

/// Whether bytes wait unread on `stream` (a request its thread has not
/// read yet), without consuming or blocking.
fn bytes_waiting(stream: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: `byte` is one writable byte that outlives the call, and
    // `stream` keeps the descriptor open; MSG_PEEK | MSG_DONTWAIT neither
    // consumes data nor blocks. Exercised by
    // `bytes_waiting_peeks_without_consuming` (and through `evict_one` by
    // `a_request_arriving_is_not_evicted_before_silent_connections`).
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// Removes a connection from [`Conns`] when its thread ends, however it ends.
struct Slot {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut conns = self.shared.lock();
        conns.open.remove(&self.id);
        self.shared.changed.notify_all();
    }
}

/// Answers a connection we will not serve, without blocking the accept loop.
fn refuse(mut stream: UnixStream, error: ApiError) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(&Response::new(None, Err(error)).to_line());
}

fn admit(stream: UnixStream, shared: &Arc<Shared>, backend: &Arc<dyn Node>) {
    let _ = stream.set_nonblocking(false);
    let own = tarn_api::peer::own_uid();
    match tarn_api::peer::peer_uid(&stream) {
        Ok(uid) if tarn_api::peer::allowed(uid, own) => {}
        Ok(uid) => {
            shared.counters.refused_user.fetch_add(1, Ordering::Relaxed);
            shared.log.log(
                "user",
                &format!("refused a connection from uid {uid}: only uid {own} and root are served"),
            );
            refuse(
                stream,
                ApiError::invalid(format!(
                    "this tarn daemon serves only its own user (uid {own}) and root"
                )),
            );
            return;
        }
        Err(e) => {
            log(&format!("cannot check who connected (refused): {e}"));
            return;
        }
    }
    let max_connections = shared.max_connections;
    let (id, activity) = {
        let mut conns = shared.lock();
        if conns.open.len() >= max_connections && !shared.evict_one(&mut conns) {
            drop(conns);
            shared.counters.refused_full.fetch_add(1, Ordering::Relaxed);
            shared.log.log(
                "full",
                &format!(
                    "refused a connection: all {max_connections} connections are running requests"
                ),
            );
            refuse(
                stream,
                ApiError::busy(format!(
                    "the tarn daemon is already serving its limit of {max_connections} connections, \
                     all running requests; retry in a moment"
                )),
            );
            return;
        }
        let handle = match stream.try_clone() {
            Ok(handle) => handle,
            Err(e) => {
                drop(conns);
                refuse(
                    stream,
                    ApiError::busy(format!("the daemon is out of resources: {e}")),
                );
                return;
            }
        };
        let activity = Arc::new(Mutex::new(Activity {
            busy: false,
            idle_since: Instant::now(),
            served: false,
            arriving: false,
            closing: false,
        }));
        let id = conns.next_id;
        conns.next_id += 1;
        conns.open.insert(
            id,
            Open {
                stream: handle,
                activity: Arc::clone(&activity),
            },
        );
        (id, activity)
    };
    shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
    let slot = Slot {
        shared: Arc::clone(shared),
        id,
    };
    let backend = Arc::clone(backend);
    let spawned = thread::Builder::new()
        .name(format!("tarn-conn-{id}"))
        .spawn(move || {
            let slot = slot;
            serve_connection(stream, &slot.shared, &activity, &*backend);
        });
    if let Err(e) = spawned {
        log(&format!("cannot start a thread for a connection: {e}"));
    }
}

/// The reading side of a connection, with a deadline for each read.
struct Timed {
    stream: UnixStream,
    deadline: Option<Instant>,
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = match self.deadline {
            None => None,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Some(left)
            }
        };
        self.stream.set_read_timeout(timeout)?;
        match self.stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut.into()),
            other => other,
        }
    }
}

fn timed_out(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
}

/// Tells a client why its connection is being closed (best effort: it
/// may not be reading).
fn farewell(stream: &mut UnixStream, message: String) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = stream.write_all(&Response::new(None, Err(ApiError::busy(message))).to_line());
}

fn serve_connection(
    stream: UnixStream,
    shared: &Shared,
    activity: &Mutex<Activity>,
    backend: &dyn Backend,
) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let read_half = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            refuse(
                stream,
                ApiError::busy(format!("the daemon is out of resources: {e}")),
            );
            return;
        }
    };
    let mut reader = BufReader::with_capacity(
        64 * 1024,
        Timed {
            stream: read_half,
            deadline: None,
        },
    );
    let mut writer = stream;
    let mut line = Vec::new();
    loop {
        // Between requests: the next one must start within the idle timeout.
        if reader.buffer().is_empty() {
            reader.get_mut().deadline = shared.idle_timeout.map(|t| Instant::now() + t);
            match reader.fill_buf() {
                Ok([]) => return,
                Ok(_) => lock_activity(activity).arriving = true,
                Err(e) if timed_out(&e) => {
                    shared.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                    let idle = shared.idle_timeout.unwrap_or_default().as_secs();
                    farewell(
                        &mut writer,
                        format!("closed after {idle} s without a request; connect again"),
                    );
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
        // A request has started: it must arrive whole in time.
        reader.get_mut().deadline = Some(Instant::now() + shared.request_timeout);
        let response = match read_line_bounded(&mut reader, &mut line, shared.max_request_bytes) {
            Ok(LineRead::Eof) => return,
            Err(e) if timed_out(&e) => {
                shared
                    .counters
                    .request_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                let limit = shared.request_timeout.as_secs_f64();
                shared.log.log(
                    "slow",
                    &format!("closed a connection whose request line took over {limit} s"),
                );
                farewell(
                    &mut writer,
                    format!("closed: a request line must arrive within {limit} s"),
                );
                return;
            }
            Err(_) => return,
            Ok(LineRead::TooLong) => Response::new(
                None,
                Err(ApiError::invalid(format!(
                    "request line is longer than {} bytes and was dropped; \
                     send large data through files (object.write), not JSON",
                    shared.max_request_bytes
                ))),
            ),
            Ok(LineRead::Line) => {
                let text = line.trim_ascii();
                if text.is_empty() {
                    lock_activity(activity).arriving = !reader.buffer().is_empty();
                    continue;
                }
                {
                    let mut a = lock_activity(activity);
                    if a.closing {
                        return; // evicted while its request arrived
                    }
                    a.busy = true;
                }
                if let Some(request) = streaming(text) {
                    // The body follows on this connection, which ends with it.
                    stream_body(request, &mut reader, &mut writer, backend);
                    lock_activity(activity).busy = false;
                    return;
                }
                // Busy until the answer is written: a connection whose
                // request ran must not be evicted before its answer is out
                // (the client would be told nothing of a change made), nor
                // look, between the two, like a newcomer that was never
                // served.
                answer(text, shared, backend)
            }
        };
        let written = writer.write_all(&response.to_line());
        {
            let mut a = lock_activity(activity);
            a.busy = false;
            a.idle_since = Instant::now();
            a.served = true;
            a.arriving = !reader.buffer().is_empty();
        }
        if written.is_err() {
            return;
        }
    }
}

/// The request on `line` when it calls a method with a streamed body.
fn streaming(line: &[u8]) -> Option<tarn_api::Request> {
    let request = tarn_api::parse_request(line).ok()?;
    method::STREAMING
        .contains(&request.method.as_str())
        .then_some(request)
}

/// Reads of a streamed body: each may wait [`STREAM_STALL`].
struct Stalling<'a>(&'a mut BufReader<Timed>);

impl Read for Stalling<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.get_mut().deadline = Some(Instant::now() + STREAM_STALL);
        self.0.read(buf)
    }
}

/// Serves a method with a streamed body (`tarn_api::wire::FrameWriter`):
/// `dataset.send` writes its stream's frames, the end frame, then its
/// response line; `dataset.receive` reads the frames that follow its
/// request and then answers. The connection ends after either.
fn stream_body(
    request: tarn_api::Request,
    reader: &mut BufReader<Timed>,
    writer: &mut UnixStream,
    backend: &dyn Backend,
) {
    let id = request.id;
    let _ = writer.set_write_timeout(Some(STREAM_STALL));
    let bad =
        |e: serde_json::Error| ApiError::invalid(format!("bad params for {}: {e}", request.method));
    let bug = || {
        ApiError::internal(format!(
            "the daemon hit a bug while handling {}; see the daemon's log",
            request.method
        ))
    };
    let outcome: Result<serde_json::Value, ApiError> = if request.method == method::DATASET_SEND {
        let mut frames = tarn_api::wire::FrameWriter::new(&mut *writer);
        let r = serde_json::from_value::<tarn_api::params::SendParams>(request.params.clone())
            .map_err(bad)
            .and_then(|p| {
                catch_unwind(AssertUnwindSafe(|| backend.dataset_send(&p, &mut frames)))
                    .unwrap_or_else(|_| Err(bug()))
            })
            .and_then(|r| serde_json::to_value(r).map_err(|e| ApiError::internal(e.to_string())));
        // The end frame, whatever happened: the client reads its way to
        // the response line. A client gone away ends it here.
        if frames.finish().is_err() {
            return;
        }
        r
    } else {
        let r = serde_json::from_value::<tarn_api::params::ReceiveParams>(request.params.clone())
            .map_err(bad)
            .and_then(|p| {
                let mut body = tarn_api::wire::FrameReader::new(Stalling(reader));
                catch_unwind(AssertUnwindSafe(|| backend.dataset_receive(&p, &mut body)))
                    .unwrap_or_else(|_| Err(bug()))
            })
            .and_then(|r| serde_json::to_value(r).map_err(|e| ApiError::internal(e.to_string())));
        r
    };
    let _ = writer.write_all(&Response::new(id, outcome).to_line());
    let _ = writer.flush();
}

fn answer(line: &[u8], shared: &Shared, backend: &dyn Backend) -> Response {
    let request = match tarn_api::parse_request(line) {
        Ok(request) => request,
        Err((id, error)) => return Response::new(id, Err(error)),
    };
    if request.method == method::DAEMON_STOP {
        let failures = shared.stop_and_wait();
        if !failures.is_empty() {
            return Response::new(
                request.id,
                Err(ApiError::io(format!(
                    "the daemon stopped, but not cleanly: {}",
                    failures.join("; ")
                ))),
            );
        }
        return Response::new(request.id, Ok(serde_json::Value::Null));
    }
    let (id, called) = (request.id, request.method.clone());
    let stats = request.method == method::DAEMON_STATS;
    let mut response = catch_unwind(AssertUnwindSafe(|| tarn_api::dispatch(backend, request)))
        .unwrap_or_else(|_| {
            Response::new(
                id,
                Err(ApiError::internal(format!(
                    "the daemon hit a bug while handling {called}; see the daemon's log"
                ))),
            )
        });
    // The backend knows its servers; the admin socket's counters are here.
    if stats {
        if let (Some(result), Ok(admin)) = (
            response.result.as_mut(),
            serde_json::to_value(shared.stats()),
        ) {
            result["admin"] = admin;
        }
    }
    response
}

// ---------------------------------------------------------------------------
// The daemon

/// What the daemon takes before it opens any pool: its admin socket and
/// the stop signals. Taken first so that a start that cannot serve (another
/// daemon on the socket, a folder that is not private) fails before it
/// imports and mounts anything, and so that SIGINT/SIGTERM during a long
/// start (pools importing, intent logs replaying) asks for a clean stop
/// once the start is over instead of killing the process with its pools
/// imported and its filesystems mounted. Connections that come meanwhile
/// wait in the socket's backlog.
pub struct Prepared {
    bound: Bound,
    signals: Option<SignalGuard>,
}

impl Prepared {
    /// Binds `opts.socket` and installs the signal handlers (when
    /// `opts.handle_signals`).
    pub fn take(opts: &DaemonOptions) -> Result<Prepared> {
        let bound = bind_socket(&opts.socket)?;
        let signals = if opts.handle_signals {
            match SignalGuard::install() {
                Ok(g) => Some(g),
                Err(e) => {
                    bound.remove_socket();
                    return Err(e);
                }
            }
        } else {
            None
        };
        Ok(Prepared { bound, signals })
    }

    /// The start failed: removes the socket and gives the signals back.
    pub fn abandon(self) {
        self.bound.remove_socket();
    }
}

/// Serves the admin API on `opts.socket` until SIGINT/SIGTERM (when
/// `opts.handle_signals`) or a `daemon.stop` request, then shuts the backend
/// down and removes the socket. Returns an error only if it cannot start.
pub fn run_daemon(opts: DaemonOptions, backend: Arc<dyn Node>) -> Result<()> {
    let prepared = Prepared::take(&opts)?;
    serve(opts, backend, prepared)
}

/// [`run_daemon`] with the socket and signals taken before the backend
/// was started (see [`Prepared`]). A stop signal that came during the
/// start stops the daemon at once, cleanly.
pub fn serve(opts: DaemonOptions, backend: Arc<dyn Node>, prepared: Prepared) -> Result<()> {
    let Prepared { bound, mut signals } = prepared;
    log(&format!(
        "version {}, pid {}, listening on {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        opts.socket.display()
    ));
    // The node is up: a failure from here on takes it down first.
    let wake = match WakePipe::new() {
        Ok(w) => w,
        Err(e) => {
            for f in backend.shutdown() {
                log(&format!("stopping: {f}"));
            }
            bound.remove_socket();
            return Err(e);
        }
    };
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        wake,
        conns: Mutex::new(Conns::default()),
        changed: Condvar::new(),
        max_request_bytes: opts.max_request_bytes,
        max_connections: opts.max_connections.max(1),
        idle_timeout: opts.idle_timeout.filter(|t| !t.is_zero()),
        request_timeout: opts.request_timeout.max(Duration::from_millis(1)),
        counters: AdminCounters::default(),
        log: RateLog::new("tarn daemon", Duration::from_secs(10)),
    });
    if signals.is_some() {
        // From now on a signal also wakes the loop out of poll(2).
        SIGNAL_WAKE_FD.store(shared.wake.write.as_raw_fd(), Ordering::SeqCst);
    }
    notify_systemd("READY=1\nSTATUS=serving");

    loop {
        if shared.stop.load(Ordering::SeqCst) {
            log("stop requested over the admin socket");
            break;
        }
        if signals.is_some() && SIGNALLED.load(Ordering::SeqCst) {
            log("stop requested by signal");
            break;
        }
        let mut pfds = [
            libc::pollfd {
                fd: bound.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: shared.wake.read.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for the duration of the call.
        let ready = unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) };
        if ready <= 0 {
            continue; // EINTR from a signal: look at the flags again
        }
        if pfds[1].revents != 0 {
            shared.wake.drain();
            continue;
        }
        match bound.listener.accept() {
            Ok((stream, _)) => admit(stream, &shared, &backend),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                log(&format!("cannot accept a connection: {e}"));
                thread::sleep(Duration::from_millis(100));
            }
        }
    }

    notify_systemd("STOPPING=1\nSTATUS=exporting pools");
    if let Some(guard) = signals.as_mut() {
        guard.restore();
        log("stopping: exporting pools (a second Ctrl-C exits at once)");
    } else {
        log("stopping: exporting pools");
    }
    bound.remove_socket();
    drop(bound);
    shared.stop.store(true, Ordering::SeqCst);
    {
        let conns = shared.lock();
        for open in conns.open.values() {
            let _ = open.stream.shutdown(std::net::Shutdown::Read);
        }
    }
    let drained = shared.wait_until(DRAIN_TIMEOUT, |c| c.open.len() <= c.waiting_for_stop);
    if !drained {
        log("requests still running after the drain timeout; exporting anyway");
    }
    let failures = backend.shutdown();
    for f in &failures {
        log(&format!("stopping: {f}"));
    }
    {
        let mut conns = shared.lock();
        conns.stop_failures = failures;
        conns.stopped = true;
        shared.changed.notify_all();
    }
    if !shared.wait_until(FAREWELL_TIMEOUT, |c| c.open.is_empty()) {
        let conns = shared.lock();
        for open in conns.open.values() {
            let _ = open.stream.shutdown(std::net::Shutdown::Both);
        }
    }
    log("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bytes_waiting_peeks_without_consuming() {
        let (mut client, server) = UnixStream::pair().unwrap();
        assert!(!bytes_waiting(&server), "nothing sent yet");
        client.write_all(b"{\"id\"").unwrap();
        assert!(bytes_waiting(&server), "a request is arriving");
        assert!(bytes_waiting(&server), "peeking consumed nothing");
        let mut got = [0u8; 5];
        (&server).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"{\"id\"", "the bytes are all still there");
        assert!(!bytes_waiting(&server), "read: nothing waits");
        drop(client);
        assert!(!bytes_waiting(&server), "a closed peer is silent");
    }
}

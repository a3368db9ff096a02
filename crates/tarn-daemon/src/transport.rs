//! The daemon's admin transport: a Unix stream socket serving the API.
//!
//! Lifecycle:
//!
//! 1. Bind. The socket's directory is created mode 0700 if missing. An
//!    existing socket that answers a connect means another daemon owns it
//!    and we refuse; one that refuses connections is stale and is replaced.
//!    The socket itself is made mode 0600: only the daemon's user may talk
//!    to it.
//! 2. Serve. A non-blocking accept loop polls the listener with a short
//!    timeout so it can notice a stop request; each connection gets a
//!    thread, at most [`MAX_CONNECTIONS`] at once (one more is answered
//!    `busy` and closed). A connection sends any number of request lines,
//!    each at most [`MAX_REQUEST_BYTES`]; a longer line is drained, answered
//!    with an `invalid` error, and the connection goes on.
//! 3. Stop, on SIGINT/SIGTERM or a `daemon.stop` request. The socket file is
//!    removed first (new clients see "no daemon"), reading is shut on every
//!    connection so no new request starts, requests already running finish
//!    (bounded wait), then [`Node::shutdown`] exports the pools. Whoever
//!    sent `daemon.stop` is answered only after that, so `tarn daemon stop`
//!    returns once the pools are safely exported. A second signal during the
//!    stop kills the process the default way.

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tarn_api::{method, read_line_bounded, ApiError, Backend, LineRead, Response};

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
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How often the accept loop looks for a stop request.
const POLL_INTERVAL_MS: i32 = 200;
/// How long a response write may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
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
    fn shutdown(&self);
}

// ---------------------------------------------------------------------------
// Signals

/// Set by the signal handler; read by the accept loop.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(true, Ordering::SeqCst);
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
    let _ = writeln!(io::stderr(), "tarn daemon: {message}");
}

// ---------------------------------------------------------------------------
// Connections

/// State shared by the accept loop and the connection threads.
struct Shared {
    stop: AtomicBool,
    conns: Mutex<Conns>,
    changed: Condvar,
    max_request_bytes: usize,
}

#[derive(Default)]
struct Conns {
    /// A handle on every open connection, to shut its reading side at stop.
    streams: HashMap<u64, UnixStream>,
    next_id: u64,
    /// Connections waiting in `daemon.stop` for the stop to finish.
    waiting_for_stop: usize,
    /// The backend has been shut down.
    stopped: bool,
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
    fn stop_and_wait(&self) {
        let mut conns = self.lock();
        conns.waiting_for_stop += 1;
        self.stop.store(true, Ordering::SeqCst);
        self.changed.notify_all();
        while !conns.stopped {
            conns = self.changed.wait(conns).unwrap_or_else(|e| e.into_inner());
        }
        conns.waiting_for_stop -= 1;
        self.changed.notify_all();
    }
}

/// Removes a connection from [`Conns`] when its thread ends, however it ends.
struct Slot {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut conns = self.shared.lock();
        conns.streams.remove(&self.id);
        self.shared.changed.notify_all();
    }
}

/// Answers a connection we will not serve, without blocking the accept loop.
fn refuse(mut stream: UnixStream, error: ApiError) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(&Response::new(None, Err(error)).to_line());
}

fn admit(
    stream: UnixStream,
    shared: &Arc<Shared>,
    backend: &Arc<dyn Node>,
    max_connections: usize,
) {
    let _ = stream.set_nonblocking(false);
    let id = {
        let mut conns = shared.lock();
        if conns.streams.len() >= max_connections {
            drop(conns);
            refuse(
                stream,
                ApiError::busy(format!(
                    "the tarn daemon is already serving its limit of {max_connections} connections; \
                     retry in a moment"
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
        let id = conns.next_id;
        conns.next_id += 1;
        conns.streams.insert(id, handle);
        id
    };
    let slot = Slot {
        shared: Arc::clone(shared),
        id,
    };
    let backend = Arc::clone(backend);
    let spawned = thread::Builder::new()
        .name(format!("tarn-conn-{id}"))
        .spawn(move || {
            let slot = slot;
            serve_connection(stream, &slot.shared, &*backend);
        });
    if let Err(e) = spawned {
        log(&format!("cannot start a thread for a connection: {e}"));
    }
}

fn serve_connection(stream: UnixStream, shared: &Shared, backend: &dyn Backend) {
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
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut writer = stream;
    let mut line = Vec::new();
    loop {
        let response = match read_line_bounded(&mut reader, &mut line, shared.max_request_bytes) {
            Ok(LineRead::Eof) | Err(_) => return,
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
                    continue;
                }
                answer(text, shared, backend)
            }
        };
        if writer.write_all(&response.to_line()).is_err() {
            return;
        }
    }
}

fn answer(line: &[u8], shared: &Shared, backend: &dyn Backend) -> Response {
    let request = match tarn_api::parse_request(line) {
        Ok(request) => request,
        Err((id, error)) => return Response::new(id, Err(error)),
    };
    if request.method == method::DAEMON_STOP {
        shared.stop_and_wait();
        return Response::new(request.id, Ok(serde_json::Value::Null));
    }
    let (id, called) = (request.id, request.method.clone());
    catch_unwind(AssertUnwindSafe(|| tarn_api::dispatch(backend, request))).unwrap_or_else(|_| {
        Response::new(
            id,
            Err(ApiError::internal(format!(
                "the daemon hit a bug while handling {called}; see the daemon's log"
            ))),
        )
    })
}

// ---------------------------------------------------------------------------
// The daemon

/// Serves the admin API on `opts.socket` until SIGINT/SIGTERM (when
/// `opts.handle_signals`) or a `daemon.stop` request, then shuts the backend
/// down and removes the socket. Returns an error only if it cannot start.
pub fn run_daemon(opts: DaemonOptions, backend: Arc<dyn Node>) -> Result<()> {
    let bound = bind_socket(&opts.socket)?;
    let mut signals = if opts.handle_signals {
        Some(SignalGuard::install()?)
    } else {
        None
    };
    log(&format!(
        "version {}, pid {}, listening on {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        opts.socket.display()
    ));
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        conns: Mutex::new(Conns::default()),
        changed: Condvar::new(),
        max_request_bytes: opts.max_request_bytes,
    });
    let max_connections = opts.max_connections.max(1);

    loop {
        if shared.stop.load(Ordering::SeqCst) {
            log("stop requested over the admin socket");
            break;
        }
        if signals.is_some() && SIGNALLED.load(Ordering::SeqCst) {
            log("stop requested by signal");
            break;
        }
        let mut pfd = libc::pollfd {
            fd: bound.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_INTERVAL_MS) };
        if ready <= 0 {
            continue; // timeout, or EINTR from a signal: look at the flags again
        }
        match bound.listener.accept() {
            Ok((stream, _)) => admit(stream, &shared, &backend, max_connections),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                log(&format!("cannot accept a connection: {e}"));
                thread::sleep(Duration::from_millis(100));
            }
        }
    }

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
        for stream in conns.streams.values() {
            let _ = stream.shutdown(std::net::Shutdown::Read);
        }
    }
    let drained = shared.wait_until(DRAIN_TIMEOUT, |c| c.streams.len() <= c.waiting_for_stop);
    if !drained {
        log("requests still running after the drain timeout; exporting anyway");
    }
    backend.shutdown();
    {
        let mut conns = shared.lock();
        conns.stopped = true;
        shared.changed.notify_all();
    }
    if !shared.wait_until(FAREWELL_TIMEOUT, |c| c.streams.is_empty()) {
        let conns = shared.lock();
        for stream in conns.streams.values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
    log("stopped");
    Ok(())
}

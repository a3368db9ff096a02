//! The replication port: another tarn sends snapshots here over TLS
//! (`tarn replicate SNAP --to tarn://host:port/DATASET`).
//!
//! # Theory
//!
//! **Who may do what.** A sender proves itself with a token this daemon
//! made (`tarn replication token add LABEL DATASET`): 32 random bytes,
//! shown once, of which only the SHA-256 is kept (in the state directory,
//! `replication-tokens.json`, mode 0600). A token is good for one dataset
//! and everything below it, and for four things only: listing those
//! datasets and their snapshots, reading their properties, receiving a
//! stream into one of them, and abandoning a partial receive there. It
//! cannot read data, send, destroy or touch anything else: a stolen token
//! lets its holder add snapshots below one dataset, nothing more. Raw
//! streams of encrypted datasets arrive sealed; this daemon never needs
//! their key.
//!
//! **The wire** is the admin API's: one JSON request per line, one answer
//! per line, and for `dataset.receive` the stream as frames after the
//! request (`tarn_api::wire::FrameWriter`), ending the connection. The
//! first request must be `replication.hello` with the token; a session
//! that fails it is closed after three tries. The TLS certificate is the
//! node's (the one WebDAV and NBD use); senders pin its SHA-256 (`tarn
//! replication info` prints it), so no certificate authority is involved.
//!
//! **What a sender chooses.** Only where below its dataset a stream goes
//! and whether a broken one is kept to resume. The port itself decides
//! the rest: never a rollback (`-F` destroys snapshots), never a mount,
//! and of the properties a stream carries only those of how data is
//! stored ([`PROPS_ALLOWED`]): a mountpoint would mount the sender's
//! files anywhere on this machine, a reservation would take the pool's
//! room. Nor does a raw stream's key wrapping replace the one a copy
//! has: a changed passphrase does not travel through the port, so a
//! sender (or whoever stole its token) cannot make the copies here
//! unopenable with the passphrase that opens them.
//!
//! **Limits.** At most [`MAX_SESSIONS`] sessions; when full, the oldest
//! that has not said hello is closed for a newcomer. The TLS handshake
//! and the hello must be done within [`HELLO_TIMEOUT`], each later
//! request must come within [`IDLE_TIMEOUT`], a line is at most 1 MiB,
//! three mistakes (bad lines, wrong tokens) close the session, and the
//! token is checked again before each request (deleting it ends the
//! session). A stream must bring [`MIN_PROGRESS`] every
//! [`PROGRESS_WINDOW`]. Every stream is checked record by record as it
//! is applied (tarn-send), so a sender can break off, lie or send
//! garbage: the receive fails and is undone (or kept to resume), and the
//! daemon goes on. Stopping the daemon ends the sessions and waits for
//! their receives to wind down before the pools are exported.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tarn_api::params::{
    DatasetGetParams, HelloParams, NameParams, ReceiveParams, TokenAdded, TokenInfo,
};
use tarn_api::{method, read_line_bounded, ApiError, Backend, LineRead, Response};

use crate::error::{DaemonError, Result};

/// Sessions served at once.
pub const MAX_SESSIONS: usize = 16;
/// Longest pause inside a stream.
pub const STREAM_STALL: Duration = Duration::from_secs(600);
/// Longest request line.
const MAX_LINE: usize = 1 << 20;
/// Where the tokens' hashes are kept, in the state directory.
pub const TOKENS_FILE: &str = "replication-tokens.json";

/// Where the HTTPS API's tokens' hashes are kept, in the state directory.
pub const API_TOKENS_FILE: &str = "api-tokens.json";

/// One token as kept: its hash, never the token. A replication token has
/// a dataset, an HTTPS API token a user.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TokenRec {
    label: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    dataset: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    user: String,
    /// Lowercase hex SHA-256 of the token's text.
    sha256: String,
    created_unix: u64,
    /// An API token: the guid of the pool its user was in when it was
    /// made. A pool exported and another made or imported under its name
    /// has users of its own, whom the token must not act as (None: a
    /// token made before tokens were bound, taken as bound to the name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool_guid: Option<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokenFile {
    tokens: Vec<TokenRec>,
}

/// The tokens of this node (see the module docs): the replication
/// port's, each good for a dataset, or the HTTPS API's, each acting as a
/// user (the same keeping, in another file).
pub struct Tokens {
    path: PathBuf,
    lock: Mutex<()>,
    api: bool,
}

/// `n` random bytes in hex, for secrets and ids.
pub(crate) fn random_hex(n: usize) -> std::result::Result<String, ApiError> {
    let mut raw = vec![0u8; n];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| ApiError::internal("no randomness for a token"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// The SHA-256 of `s` in hex: what is kept of a token.
pub(crate) fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{what} {}: {e}", path.display()))
}

/// Writes `value` as JSON to `path`, readable by the daemon's user only,
/// durably and atomically (a temporary file renamed over it).
pub(crate) fn save_private<T: serde::Serialize>(
    path: &Path,
    value: &T,
) -> std::result::Result<(), ApiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec_pretty(value).map_err(|e| ApiError::internal(e.to_string()))?;
    let write = || -> std::io::Result<()> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A left-over temporary file keeps its mode at open: 0600 now.
        use std::os::unix::fs::PermissionsExt;
        out.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        out.write_all(&json)?;
        out.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| io_error("cannot write", path, e))
}

/// Reads the JSON at `path` (the default when there is no file).
pub(crate) fn load_json<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
) -> std::result::Result<T, ApiError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| io_error("cannot read", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(io_error("cannot read", path, e)),
    }
}

impl Tokens {
    /// The replication tokens kept in `state_dir`.
    pub fn new(state_dir: &Path) -> Tokens {
        Tokens {
            path: state_dir.join(TOKENS_FILE),
            lock: Mutex::new(()),
            api: false,
        }
    }

    /// The HTTPS API tokens kept in `state_dir`.
    pub fn api(state_dir: &Path) -> Tokens {
        Tokens {
            path: state_dir.join(API_TOKENS_FILE),
            lock: Mutex::new(()),
            api: true,
        }
    }

    fn what(&self) -> &'static str {
        if self.api {
            "API"
        } else {
            "replication"
        }
    }

    fn load(&self) -> std::result::Result<TokenFile, ApiError> {
        load_json(&self.path)
    }

    fn save(&self, f: &TokenFile) -> std::result::Result<(), ApiError> {
        save_private(&self.path, f)
    }

    /// Makes a token for `label`, good for `dataset` and below (an API
    /// token: acting as the user `dataset`).
    pub fn add(&self, label: &str, dataset: &str) -> std::result::Result<TokenAdded, ApiError> {
        self.add_bound(label, dataset, None)
    }

    /// [`Tokens::add`] of an API token acting as the user `scope`
    /// (POOL/USER) of the pool whose guid is `pool_guid`: it acts as no
    /// user of another pool that takes the name later.
    pub fn add_bound(
        &self,
        label: &str,
        dataset: &str,
        pool_guid: Option<u64>,
    ) -> std::result::Result<TokenAdded, ApiError> {
        let label_ok = !label.is_empty()
            && label.len() <= 64
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
        if !label_ok {
            return Err(ApiError::invalid(format!(
                "token label '{label}': 1 to 64 letters, digits, '-', '_', '.', ':'"
            )));
        }
        if self.api {
            // POOL/NAME: names are per pool.
            let Some((pool, name)) = dataset.split_once('/') else {
                return Err(ApiError::invalid("an API token acts as POOL/USER"));
            };
            tarn_api::access::check_user_name(name)?;
            if pool.is_empty() || pool.contains(['/', '@']) {
                return Err(ApiError::invalid(format!("'{pool}' is not a pool name")));
            }
        }
        let ds_ok = self.api
            || !dataset.is_empty()
                && !dataset.contains(['@', '%'])
                && dataset
                    .split('/')
                    .all(|p| !p.is_empty() && p != "." && p != "..");
        if !ds_ok {
            return Err(ApiError::invalid(format!(
                "'{dataset}' is not a dataset name (POOL or POOL/DATASET)"
            )));
        }
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        if f.tokens.iter().any(|t| t.label == label) {
            return Err(ApiError::exists(format!(
                "an {} token '{label}' exists; delete it first",
                self.what()
            )));
        }
        let token = random_hex(32)?;
        let (ds, user) = if self.api {
            (String::new(), dataset.to_string())
        } else {
            (dataset.to_string(), String::new())
        };
        f.tokens.push(TokenRec {
            label: label.to_string(),
            dataset: ds,
            user,
            sha256: sha256_hex(&token),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            pool_guid,
        });
        self.save(&f)?;
        Ok(TokenAdded {
            label: label.to_string(),
            token,
        })
    }

    /// The tokens, without their secrets.
    pub fn list(&self) -> std::result::Result<Vec<TokenInfo>, ApiError> {
        Ok(self
            .load()?
            .tokens
            .into_iter()
            .map(|t| TokenInfo {
                label: t.label,
                dataset: if self.api { t.user } else { t.dataset },
                created_unix: t.created_unix,
            })
            .collect())
    }

    /// Removes the token `label`.
    pub fn del(&self, label: &str) -> std::result::Result<(), ApiError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        let before = f.tokens.len();
        f.tokens.retain(|t| t.label != label);
        if f.tokens.len() == before {
            return Err(ApiError::not_found(format!(
                "no {} token '{label}'",
                self.what()
            )));
        }
        self.save(&f)
    }

    /// Removes every token of `scope` (an API token's POOL/USER, when
    /// that user is removed: a user added again later under the name must
    /// not inherit them); a scope ending in `/` (POOL/, when the pool is
    /// destroyed) removes every token under it.
    pub fn del_scope(&self, scope: &str) -> std::result::Result<(), ApiError> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut f = self.load()?;
        let before = f.tokens.len();
        f.tokens.retain(|t| {
            let s = if self.api { &t.user } else { &t.dataset };
            if scope.ends_with('/') {
                !s.starts_with(scope)
            } else {
                s != scope
            }
        });
        if f.tokens.len() == before {
            return Ok(());
        }
        self.save(&f)
    }

    /// The dataset `token` is good for (an API token: the user it acts
    /// as), if it is one of ours, whatever pool it was made for.
    #[cfg(test)]
    pub(crate) fn check(&self, token: &str) -> Option<String> {
        self.check_bound(token).map(|(scope, _)| scope)
    }

    /// [`Tokens::check`] with the guid of the pool an API token is bound
    /// to (see [`Tokens::add_bound`]).
    pub(crate) fn check_bound(&self, token: &str) -> Option<(String, Option<u64>)> {
        // Hashes are compared, not tokens: how long a comparison takes
        // tells a guesser nothing about a token it does not have.
        let want = sha256_hex(token.trim());
        let f = self.load().ok()?;
        f.tokens.into_iter().find(|t| t.sha256 == want).map(|t| {
            if self.api {
                (t.user, t.pool_guid)
            } else {
                (t.dataset, t.pool_guid)
            }
        })
    }
}

/// The dataset `token` is good for on the replication port: one of ours,
/// made for the pool that has the scope's pool name now (a token made
/// before tokens were bound is taken as bound to the name).
fn token_scope(tokens: &Tokens, backend: &Target, token: &str) -> Option<String> {
    let (scope, guid) = tokens.check_bound(token)?;
    if let Some(g) = guid {
        let pool = scope.split('/').next()?;
        let node = backend.upgrade()?;
        let now = node
            .pool_list()
            .ok()?
            .into_iter()
            .find(|p| p.name == pool)
            .and_then(|p| u64::from_str_radix(&p.guid, 16).ok())?;
        if now != g {
            return None;
        }
    }
    Some(scope)
}

/// True when `name` (a dataset or snapshot) is `scope` or below it.
fn in_scope(scope: &str, name: &str) -> bool {
    name.strip_prefix(scope)
        .is_some_and(|r| r.is_empty() || r.starts_with('/') || r.starts_with('@'))
}

/// Properties a stream may set on the replication port: how the data is
/// stored, nothing about where it is mounted or how much room it holds.
pub const PROPS_ALLOWED: &[&str] = &[
    "compression",
    "checksum",
    "recordsize",
    "atime",
    "copies",
    "sync",
    "readonly",
];
/// Time for the TLS handshake and the hello, together.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Time between two requests after the hello.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A stream must bring at least [`MIN_PROGRESS`] bytes every this long.
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(120);
/// See [`PROGRESS_WINDOW`].
pub const MIN_PROGRESS: u64 = 256 << 10;
/// How long [`Replication::stop`] waits for sessions to wind down.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// A session as the accept loop sees it: its socket (to end it), whether
/// it said hello, and when it came.
struct Slot {
    stream: TcpStream,
    hello: Arc<AtomicBool>,
    since: Instant,
}

type Slots = Arc<Mutex<HashMap<u64, Slot>>>;

/// The running replication port.
pub struct Replication {
    addr: SocketAddr,
    fingerprint: String,
    stop: Arc<AtomicBool>,
    sessions: Slots,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Replication {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// SHA-256 of its certificate (`AB:CD:...`).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Stops accepting, ends every session and waits (a while) for them
    /// to wind down: a receive in progress fails and is undone, or kept
    /// to resume, before the pools are exported.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            for s in sessions.values() {
                let _ = s.stream.shutdown(Shutdown::Both);
            }
        }
        let t0 = Instant::now();
        while t0.elapsed() < STOP_WAIT {
            if self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log::warn!("tarn daemon: replication sessions still running after {STOP_WAIT:?}; going on");
    }
}

impl Drop for Replication {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop();
        }
    }
}

/// What a session calls: the node, while it exists.
pub(crate) type Target = Weak<dyn Backend + Send + Sync>;

/// Removes a session's slot however it ends (a panic included).
struct SlotGuard(Slots, u64);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// Makes room for a newcomer when every slot is taken: the oldest
/// session that has not said hello is closed; false when all have.
fn make_room(sessions: &mut HashMap<u64, Slot>) -> bool {
    if sessions.len() < MAX_SESSIONS {
        return true;
    }
    let oldest = sessions
        .iter()
        .filter(|(_, s)| !s.hello.load(Ordering::Relaxed))
        .min_by_key(|(_, s)| s.since)
        .map(|(id, _)| *id);
    match oldest.and_then(|id| sessions.remove(&id)) {
        Some(s) => {
            let _ = s.stream.shutdown(Shutdown::Both);
            true
        }
        None => false,
    }
}

/// Starts the replication port on `addr` with the node's certificate.
pub(crate) fn start(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    fingerprint: String,
    tokens: Arc<Tokens>,
    backend: Target,
) -> Result<Replication> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| DaemonError::msg(format!("replication: cannot listen on {addr}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| DaemonError::msg(format!("replication: {e}")))?;
    // Polled, so a stop needs no connection to wake it.
    listener
        .set_nonblocking(true)
        .map_err(|e| DaemonError::msg(format!("replication: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let sessions: Slots = Arc::default();
    let (stop2, sessions2) = (stop.clone(), sessions.clone());
    let accept = std::thread::Builder::new()
        .name("replication".into())
        .spawn(move || {
            let mut next: u64 = 0;
            while !stop2.load(Ordering::SeqCst) {
                let stream = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    Err(_) => {
                        // Out of descriptors and the like: back off.
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let _ = stream.set_nonblocking(false);
                next += 1;
                let id = next;
                let hello = Arc::new(AtomicBool::new(false));
                {
                    let mut s = sessions2.lock().unwrap_or_else(|e| e.into_inner());
                    let Ok(clone) = stream.try_clone() else {
                        continue;
                    };
                    if !make_room(&mut s) {
                        let _ = stream.shutdown(Shutdown::Both);
                        continue;
                    }
                    s.insert(
                        id,
                        Slot {
                            stream: clone,
                            hello: hello.clone(),
                            since: Instant::now(),
                        },
                    );
                }
                let guard = SlotGuard(sessions2.clone(), id);
                let (tls, tokens, backend) = (tls.clone(), tokens.clone(), backend.clone());
                let _ = std::thread::Builder::new()
                    .name("replication-session".into())
                    .spawn(move || {
                        let _guard = guard;
                        let _ = catch_unwind(AssertUnwindSafe(|| {
                            serve(stream, tls, &tokens, &backend, &hello)
                        }));
                    });
            }
        })
        .map_err(|e| DaemonError::msg(format!("replication: {e}")))?;
    log::info!("tarn daemon: replication listening on {addr} (TLS, certificate {fingerprint})");
    Ok(Replication {
        addr,
        fingerprint,
        stop,
        sessions,
        accept: Some(accept),
    })
}

/// The session's socket, with a deadline on every read: the TLS layer
/// reads through it, so a handshake, a line or a stream that trickles is
/// cut off by the deadline, not only by a pause.
struct Timed {
    sock: TcpStream,
    /// Reads fail after this instant.
    deadline: Option<Instant>,
    /// A stream: at least [`MIN_PROGRESS`] bytes per [`PROGRESS_WINDOW`].
    progress: Option<(Instant, u64)>,
}

fn timed_out(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string())
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let now = Instant::now();
        let mut wait = STREAM_STALL;
        if let Some(d) = self.deadline {
            if now >= d {
                return Err(timed_out("the replication session's time is up"));
            }
            wait = wait.min(d - now);
        }
        if let Some((since, bytes)) = &mut self.progress {
            if now.duration_since(*since) >= PROGRESS_WINDOW {
                if *bytes < MIN_PROGRESS {
                    return Err(timed_out("the stream arrives too slowly"));
                }
                (*since, *bytes) = (now, 0);
            }
            wait = wait.min(
                PROGRESS_WINDOW.saturating_sub(now.duration_since(*since))
                    + Duration::from_millis(1),
            );
        }
        self.sock
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        let n = self.sock.read(buf)?;
        if let Some((_, bytes)) = &mut self.progress {
            *bytes += n as u64;
        }
        Ok(n)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, Timed>;

fn reply(
    r: &mut BufReader<Tls>,
    id: Option<u64>,
    out: std::result::Result<serde_json::Value, ApiError>,
) -> bool {
    let w = r.get_mut();
    w.write_all(&Response::new(id, out).to_line()).is_ok() && w.flush().is_ok()
}

fn json<T: Serialize>(
    v: std::result::Result<T, ApiError>,
) -> std::result::Result<serde_json::Value, ApiError> {
    v.and_then(|v| serde_json::to_value(v).map_err(|e| ApiError::internal(e.to_string())))
}

fn params<T: serde::de::DeserializeOwned>(
    m: &str,
    p: serde_json::Value,
) -> std::result::Result<T, ApiError> {
    serde_json::from_value(p).map_err(|e| ApiError::invalid(format!("bad params for {m}: {e}")))
}

/// Ends a session politely after a stream: the answer is sent, the TLS
/// session closed, and what the sender still sends is read and dropped
/// for a moment, so the answer is not lost to a reset.
fn close(mut r: BufReader<Tls>) {
    let s = r.get_mut();
    s.conn.send_close_notify();
    let _ = s.flush();
    let _ = s.sock.sock.shutdown(Shutdown::Write);
    s.sock.deadline = Some(Instant::now() + Duration::from_secs(2));
    s.sock.progress = None;
    let mut sink = [0u8; 64 << 10];
    let mut left: usize = 16 << 20;
    while left > 0 {
        match s.sock.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// How often a stream being received checks that its token still
/// stands.
const RECHECK: Duration = Duration::from_secs(1);

/// A stream that fails once `valid` says its token was deleted (asked at
/// most every [`RECHECK`]).
struct Revocable<'a, R> {
    inner: R,
    valid: &'a dyn Fn() -> bool,
    checked: Instant,
}

impl<R: Read> Read for Revocable<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.checked.elapsed() >= RECHECK {
            self.checked = Instant::now();
            if !(self.valid)() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the replication token was deleted while its stream came",
                ));
            }
        }
        self.inner.read(buf)
    }
}

/// Mistakes a session may make before it is closed.
const MAX_FAILURES: u32 = 3;

/// One session (see the module docs).
fn serve(
    stream: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    tokens: &Tokens,
    backend: &Target,
    said_hello: &AtomicBool,
) {
    let _ = stream.set_write_timeout(Some(STREAM_STALL));
    let Ok(conn) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let sock = Timed {
        sock: stream,
        deadline: Some(Instant::now() + HELLO_TIMEOUT),
        progress: None,
    };
    let mut r = BufReader::with_capacity(256 << 10, rustls::StreamOwned::new(conn, sock));
    // The token as presented, checked again before each request: a token
    // deleted meanwhile ends the session.
    let mut token: Option<String> = None;
    let mut failures = 0;
    let mut line = Vec::new();
    loop {
        if token.is_some() {
            r.get_mut().sock.deadline = Some(Instant::now() + IDLE_TIMEOUT);
        }
        match read_line_bounded(&mut r, &mut line, MAX_LINE) {
            Ok(LineRead::Line) => {}
            Ok(LineRead::TooLong) => {
                reply(
                    &mut r,
                    None,
                    Err(ApiError::invalid("request line too long")),
                );
                return;
            }
            Ok(LineRead::Eof) | Err(_) => return,
        }
        let text = line.trim_ascii();
        let req = match tarn_api::parse_request(text) {
            Ok(req) => req,
            Err((id, e)) => {
                failures += 1;
                if !reply(&mut r, id, Err(e)) || failures >= MAX_FAILURES {
                    return;
                }
                continue;
            }
        };
        let (id, m) = (req.id, req.method.as_str());
        if m == method::REPLICATION_HELLO {
            let out = params::<HelloParams>(m, req.params).and_then(|h| {
                let ds = token_scope(tokens, backend, &h.token).ok_or_else(|| {
                    ApiError::invalid("that is not a replication token of this daemon")
                })?;
                Ok((h.token, ds))
            });
            match out {
                Ok((t, ds)) => {
                    token = Some(t);
                    said_hello.store(true, Ordering::Relaxed);
                    if !reply(&mut r, id, Ok(serde_json::json!({ "dataset": ds }))) {
                        return;
                    }
                }
                Err(e) => {
                    failures += 1;
                    if !reply(&mut r, id, Err(e)) || failures >= MAX_FAILURES {
                        return;
                    }
                }
            }
            continue;
        }
        let Some(scope) = token
            .as_deref()
            .and_then(|t| token_scope(tokens, backend, t))
        else {
            reply(
                &mut r,
                id,
                Err(ApiError::invalid(
                    "start with replication.hello and a token this daemon has",
                )),
            );
            return;
        };
        let Some(node) = backend.upgrade() else {
            reply(&mut r, id, Err(ApiError::busy("the daemon is stopping")));
            return;
        };
        let outside = |name: &str| {
            ApiError::invalid(format!(
                "'{name}' is outside '{scope}', which this token may receive into"
            ))
        };
        let out = match m {
            method::DATASET_LIST => json(node.dataset_list(true).map(|all| {
                all.into_iter()
                    .filter(|d| in_scope(&scope, &d.name))
                    .collect::<Vec<_>>()
            })),
            method::DATASET_GET => params::<DatasetGetParams>(m, req.params).and_then(|p| {
                if !in_scope(&scope, &p.name) {
                    return Err(outside(&p.name));
                }
                json(node.dataset_get(&p.name, &p.properties))
            }),
            method::DATASET_RECEIVE_ABORT => params::<NameParams>(m, req.params).and_then(|p| {
                if !in_scope(&scope, &p.name) || p.name.contains('@') {
                    return Err(outside(&p.name));
                }
                json(node.dataset_receive_abort(&p.name))
            }),
            method::DATASET_RECEIVE => {
                let out = params::<ReceiveParams>(m, req.params).and_then(|p| {
                    if !in_scope(&scope, &p.name) || p.name.contains('@') {
                        return Err(outside(&p.name));
                    }
                    // What a sender may choose here: where, and whether to
                    // keep a broken stream. Never a rollback (it destroys
                    // snapshots), a mount, or properties beyond how data is
                    // stored (a mountpoint on this machine, a reservation).
                    let p = ReceiveParams {
                        name: p.name,
                        force: false,
                        resumable: p.resumable,
                        no_mount: true,
                        exclude: Vec::new(),
                        props_allowed: Some(PROPS_ALLOWED.iter().map(|s| s.to_string()).collect()),
                        keep_wrapping: true,
                    };
                    let s = r.get_mut();
                    s.sock.deadline = None;
                    s.sock.progress = Some((Instant::now(), 0));
                    // The token is checked again while the stream comes
                    // (one request may carry any number of streams): a
                    // token deleted meanwhile ends the receive too.
                    let still = || {
                        token
                            .as_deref()
                            .and_then(|t| token_scope(tokens, backend, t))
                            .is_some_and(|s| s == scope)
                    };
                    let mut body = Revocable {
                        inner: tarn_api::wire::FrameReader::new(&mut r),
                        valid: &still,
                        checked: Instant::now(),
                    };
                    json(node.dataset_receive(&p, &mut body))
                });
                // The connection ends with a stream.
                r.get_mut().sock.progress = None;
                reply(&mut r, id, out);
                close(r);
                return;
            }
            other => Err(ApiError::invalid(format!(
                "{other} is not served on the replication port"
            ))),
        };
        if !reply(&mut r, id, out) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_whole_names() {
        assert!(in_scope("vault/b", "vault/b"));
        assert!(in_scope("vault/b", "vault/b/c"));
        assert!(in_scope("vault/b", "vault/b@s"));
        assert!(!in_scope("vault/b", "vault/bc"));
        assert!(!in_scope("vault/b", "vault"));
        assert!(!in_scope("vault/b", "vault/a/b"));
    }

    #[test]
    fn tokens_are_kept_as_hashes_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tokens::new(dir.path());
        let a = t.add("nas", "vault/nas").unwrap();
        assert_eq!(a.token.len(), 64);
        let kept = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).unwrap();
        assert!(!kept.contains(&a.token), "the token itself is not kept");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(TOKENS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(t.check(&a.token).as_deref(), Some("vault/nas"));
        assert_eq!(t.check(&"0".repeat(64)), None);
        assert!(t.add("nas", "vault/x").is_err(), "labels are unique");
        for (label, ds) in [
            ("", "v"),
            ("a b", "v"),
            ("ok", "v/../x"),
            ("ok", "v@s"),
            ("ok", ""),
        ] {
            assert!(t.add(label, ds).is_err(), "{label:?} {ds:?}");
        }
        let b = t.add("laptop", "vault/laptop").unwrap();
        assert_eq!(t.list().unwrap().len(), 2);
        t.del("nas").unwrap();
        assert_eq!(t.check(&a.token), None, "a deleted token stops working");
        assert_eq!(t.check(&b.token).as_deref(), Some("vault/laptop"));
        assert!(t.del("nas").is_err());
    }

    #[test]
    fn api_tokens_go_with_their_user_or_pool() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tokens::api(dir.path());
        let alice = t.add("a", "tank/alice").unwrap();
        let alicia = t.add("b", "tank/alicia").unwrap();
        let bob = t.add("c", "tank/bob").unwrap();
        let other = t.add("d", "tankx/bob").unwrap();
        t.del_scope("tank/alice").unwrap();
        assert_eq!(t.check(&alice.token), None);
        assert!(t.check(&alicia.token).is_some(), "whole names only");
        t.del_scope("tank/").unwrap();
        assert_eq!(t.check(&alicia.token), None);
        assert_eq!(t.check(&bob.token), None);
        assert!(
            t.check(&other.token).is_some(),
            "another pool keeps its own"
        );
    }
}

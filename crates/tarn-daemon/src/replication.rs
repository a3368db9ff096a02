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
//! **Limits.** At most [`MAX_SESSIONS`] sessions at once (more are closed
//! at once); a request line must arrive within [`LINE_TIMEOUT`] and be at
//! most 1 MiB; a stream may stall [`STREAM_STALL`] between frames. Every
//! stream is checked record by record as it is applied (tarn-send), so a
//! sender can break off, lie or send garbage: the receive fails and is
//! undone (or kept to resume, with `-s`), and the daemon goes on.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tarn_api::params::{
    DatasetGetParams, HelloParams, NameParams, ReceiveParams, TokenAdded, TokenInfo,
};
use tarn_api::{method, read_line_bounded, ApiError, Backend, LineRead, Response};

use crate::error::{DaemonError, Result};

/// Sessions served at once.
pub const MAX_SESSIONS: usize = 16;
/// Time for a request line (and the TLS handshake).
pub const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause inside a stream.
pub const STREAM_STALL: Duration = Duration::from_secs(600);
/// Longest request line.
const MAX_LINE: usize = 1 << 20;
/// Where the tokens' hashes are kept, in the state directory.
pub const TOKENS_FILE: &str = "replication-tokens.json";

/// One token as kept: its hash, never the token.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TokenRec {
    label: String,
    dataset: String,
    /// Lowercase hex SHA-256 of the token's text.
    sha256: String,
    created_unix: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokenFile {
    tokens: Vec<TokenRec>,
}

/// The tokens of this node (see the module docs).
pub struct Tokens {
    path: PathBuf,
    lock: Mutex<()>,
}

fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{what} {}: {e}", path.display()))
}

impl Tokens {
    /// The tokens kept in `state_dir`.
    pub fn new(state_dir: &Path) -> Tokens {
        Tokens {
            path: state_dir.join(TOKENS_FILE),
            lock: Mutex::new(()),
        }
    }

    fn load(&self) -> std::result::Result<TokenFile, ApiError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io_error("cannot read the tokens in", &self.path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenFile::default()),
            Err(e) => Err(io_error("cannot read", &self.path, e)),
        }
    }

    fn save(&self, f: &TokenFile) -> std::result::Result<(), ApiError> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = self.path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(f).map_err(|e| ApiError::internal(e.to_string()))?;
        let write = || -> std::io::Result<()> {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            out.write_all(&json)?;
            out.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| io_error("cannot write", &self.path, e))
    }

    /// Makes a token for `label`, good for `dataset` and below.
    pub fn add(&self, label: &str, dataset: &str) -> std::result::Result<TokenAdded, ApiError> {
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
        let ds_ok = !dataset.is_empty()
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
                "a replication token '{label}' exists; delete it first"
            )));
        }
        let mut raw = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
            .map_err(|_| ApiError::internal("no randomness for a token"))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        f.tokens.push(TokenRec {
            label: label.to_string(),
            dataset: dataset.to_string(),
            sha256: sha256_hex(&token),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
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
                dataset: t.dataset,
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
                "no replication token '{label}'"
            )));
        }
        self.save(&f)
    }

    /// The dataset `token` is good for, if it is one of ours.
    fn check(&self, token: &str) -> Option<String> {
        // Hashes are compared, not tokens: how long a comparison takes
        // tells a guesser nothing about a token it does not have.
        let want = sha256_hex(token.trim());
        let f = self.load().ok()?;
        f.tokens
            .into_iter()
            .find(|t| t.sha256 == want)
            .map(|t| t.dataset)
    }
}

/// True when `name` (a dataset or snapshot) is `scope` or below it.
fn in_scope(scope: &str, name: &str) -> bool {
    name.strip_prefix(scope)
        .is_some_and(|r| r.is_empty() || r.starts_with('/') || r.starts_with('@'))
}

/// The running replication port.
pub struct Replication {
    addr: SocketAddr,
    fingerprint: String,
    stop: Arc<AtomicBool>,
    sessions: Arc<Mutex<HashMap<u64, TcpStream>>>,
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

    /// Stops accepting and ends every session (a receive in progress
    /// fails and is undone, or kept to resume).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for s in sessions.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
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
    let stop = Arc::new(AtomicBool::new(false));
    let sessions: Arc<Mutex<HashMap<u64, TcpStream>>> = Arc::default();
    let (stop2, sessions2) = (stop.clone(), sessions.clone());
    let accept = std::thread::Builder::new()
        .name("replication".into())
        .spawn(move || {
            let next = AtomicU64::new(0);
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = conn else { continue };
                let id = next.fetch_add(1, Ordering::Relaxed);
                {
                    let mut s = sessions2.lock().unwrap_or_else(|e| e.into_inner());
                    if s.len() >= MAX_SESSIONS {
                        let _ = stream.shutdown(Shutdown::Both);
                        continue;
                    }
                    if let Ok(c) = stream.try_clone() {
                        s.insert(id, c);
                    }
                }
                let (tls, tokens, backend, sessions) = (
                    tls.clone(),
                    tokens.clone(),
                    backend.clone(),
                    sessions2.clone(),
                );
                let spawned = std::thread::Builder::new()
                    .name("replication-session".into())
                    .spawn(move || {
                        serve(stream, tls, &tokens, &backend);
                        sessions
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&id);
                    });
                if spawned.is_err() {
                    sessions2
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id);
                }
            }
        })
        .map_err(|e| DaemonError::msg(format!("replication: {e}")))?;
    eprintln!("tarn daemon: replication listening on {addr} (TLS, certificate {fingerprint})");
    Ok(Replication {
        addr,
        fingerprint,
        stop,
        sessions,
        accept: Some(accept),
    })
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// Reads of a stream's frames: each may wait [`STREAM_STALL`].
struct Body<'a>(&'a mut BufReader<Tls>);

impl Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

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

/// One session (see the module docs).
fn serve(stream: TcpStream, tls: Arc<rustls::ServerConfig>, tokens: &Tokens, backend: &Target) {
    let _ = stream.set_read_timeout(Some(LINE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(STREAM_STALL));
    let Ok(conn) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let mut r = BufReader::with_capacity(256 << 10, rustls::StreamOwned::new(conn, stream));
    let mut scope: Option<String> = None;
    let mut failures = 0;
    let mut line = Vec::new();
    loop {
        let _ = r.get_ref().sock.set_read_timeout(Some(LINE_TIMEOUT));
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
        if text.is_empty() {
            continue;
        }
        let req = match tarn_api::parse_request(text) {
            Ok(req) => req,
            Err((id, e)) => {
                if !reply(&mut r, id, Err(e)) {
                    return;
                }
                continue;
            }
        };
        let (id, m) = (req.id, req.method.as_str());
        if m == method::REPLICATION_HELLO {
            let out = params::<HelloParams>(m, req.params).and_then(|h| {
                tokens.check(&h.token).ok_or_else(|| {
                    ApiError::invalid("that is not a replication token of this daemon")
                })
            });
            match out {
                Ok(ds) => {
                    scope = Some(ds.clone());
                    if !reply(&mut r, id, Ok(serde_json::json!({ "dataset": ds }))) {
                        return;
                    }
                }
                Err(e) => {
                    failures += 1;
                    if !reply(&mut r, id, Err(e)) || failures >= 3 {
                        return;
                    }
                }
            }
            continue;
        }
        let Some(scope) = scope.as_deref() else {
            reply(
                &mut r,
                id,
                Err(ApiError::invalid(
                    "start with replication.hello and a token",
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
                    .filter(|d| in_scope(scope, &d.name))
                    .collect::<Vec<_>>()
            })),
            method::DATASET_GET => params::<DatasetGetParams>(m, req.params).and_then(|p| {
                if !in_scope(scope, &p.name) {
                    return Err(outside(&p.name));
                }
                json(node.dataset_get(&p.name, &p.properties))
            }),
            method::DATASET_RECEIVE_ABORT => params::<NameParams>(m, req.params).and_then(|p| {
                if !in_scope(scope, &p.name) || p.name.contains('@') {
                    return Err(outside(&p.name));
                }
                json(node.dataset_receive_abort(&p.name))
            }),
            method::DATASET_RECEIVE => {
                let out = params::<ReceiveParams>(m, req.params).and_then(|p| {
                    if !in_scope(scope, &p.name) || p.name.contains('@') {
                        return Err(outside(&p.name));
                    }
                    let _ = r.get_ref().sock.set_read_timeout(Some(STREAM_STALL));
                    let mut body = tarn_api::wire::FrameReader::new(Body(&mut r));
                    json(node.dataset_receive(&p, &mut body))
                });
                // The connection ends with a stream.
                reply(&mut r, id, out);
                r.get_mut().conn.send_close_notify();
                let _ = r.get_mut().flush();
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
}

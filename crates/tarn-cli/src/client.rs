//! A blocking client of the daemon's admin socket.
//!
//! One connection, one request at a time. Transport failures become `anyhow`
//! errors that tell the operator what to do; API failures come back as
//! [`tarn_api::ApiError`] inside the `anyhow::Error`, so callers can downcast to read
//! the code.

use std::io::{self, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use tarn_api::params::{NoParams, PingResult};
use tarn_api::{method, read_line_bounded, LineRead, Request, Response, API_VERSION};

/// Longest response line the client accepts.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The daemon closed the connection before answering a request: it
/// stopped, or closed the connection to make room for another (a fresh
/// connection's first request, a ping, may be sent again).
#[derive(Debug)]
pub struct ClosedUnanswered {
    message: String,
    /// False when the connection was closed before the request could be
    /// written: nothing of it was carried out (the daemon closes only a
    /// connection with no request in flight, and one it never read in
    /// full is not one), so any request may be sent again.
    pub sent: bool,
}

impl std::fmt::Display for ClosedUnanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ClosedUnanswered {}

/// A connection to a tarn daemon.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    line: Vec<u8>,
}

impl Client {
    /// Connects to the daemon listening on `path`.
    pub fn connect(path: &Path) -> anyhow::Result<Client> {
        let shown = path.display();
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => anyhow!(
                "no tarn daemon is listening on {shown}\n\
                 hint: start one with `tarn daemon` (or set TARN_SOCKET / --socket to where it listens)"
            ),
            io::ErrorKind::PermissionDenied => anyhow!(
                "cannot connect to the tarn daemon on {shown}: permission denied\n\
                 hint: the socket is open only to the user running the daemon; run this as that user"
            ),
            _ => anyhow!("cannot connect to the tarn daemon on {shown}: {e}"),
        })?;
        // Only a daemon run by this user or root hears our requests (and
        // the passwords some carry): another local user may have put a
        // socket where we look.
        let own = tarn_api::peer::own_uid();
        match tarn_api::peer::peer_uid(&stream) {
            Ok(uid) if tarn_api::peer::allowed(uid, own) => {}
            Ok(uid) => bail!(
                "the tarn daemon on {shown} runs as uid {uid}, not as this user (uid {own}) or root; \
                 not talking to it\n\
                 hint: another user may have put that socket there; use --socket or TARN_SOCKET \
                 to name your daemon's"
            ),
            Err(e) => bail!("cannot check who listens on {shown}: {e}"),
        }
        let reader = BufReader::new(
            stream
                .try_clone()
                .with_context(|| format!("cannot use the connection to {shown}"))?,
        );
        Ok(Client {
            path: path.to_path_buf(),
            reader,
            writer: stream,
            next_id: 1,
            line: Vec::new(),
        })
    }

    /// Whether this connection can no longer carry a request: the daemon
    /// closed it (idle too long, evicted, stopped) or sent something unasked
    /// (the reason it closed it). Looked at before reusing a connection
    /// that waited between requests, such as `pool iostat 60`'s.
    pub fn closed_by_daemon(&self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let mut byte = 0u8;
        // SAFETY: one writable byte; MSG_PEEK | MSG_DONTWAIT neither consumes
        // data nor blocks, and the descriptor is open while `self` lives.
        let n = unsafe {
            libc::recv(
                self.writer.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }

    /// The socket this client talks to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Calls `method` and returns its raw JSON result.
    pub fn call(&mut self, method: &str, params: &impl Serialize) -> anyhow::Result<Value> {
        let (id, line) = self.request_line(method, params)?;
        let shown = self.path.display().to_string();
        let lost = |e: io::Error| {
            let sent = !matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            );
            anyhow::Error::from(ClosedUnanswered {
                message: format!(
                    "lost the connection to the tarn daemon on {shown} ({e}); \
                     it may have stopped; see its log"
                ),
                sent,
            })
        };
        if let Err(e) = self.writer.write_all(&line) {
            // The daemon may have answered (e.g. `busy`) and closed before
            // reading: prefer its answer to the write error.
            return match self.read_response() {
                Ok(response) => unwrap_response(response, id),
                Err(_) => Err(lost(e)),
            };
        }
        let response = self.read_response()?;
        unwrap_response(response, id)
    }

    /// The request line of a call to `method`, and its id.
    fn request_line(
        &mut self,
        method: &str,
        params: &impl Serialize,
    ) -> anyhow::Result<(u64, Vec<u8>)> {
        let id = self.next_id;
        self.next_id += 1;
        let params = serde_json::to_value(params)
            .with_context(|| format!("cannot encode the parameters of {method}"))?;
        let request = Request {
            id: Some(id),
            method: method.to_string(),
            params,
        };
        let mut line = serde_json::to_vec(&request)
            .with_context(|| format!("cannot encode the request {method}"))?;
        line.push(b'\n');
        Ok((id, line))
    }

    /// Calls a method whose reply carries a streamed body
    /// (`dataset.send`): the body is copied into `out`, then the result
    /// returned. The connection is used up.
    pub fn call_body_out(
        &mut self,
        method: &str,
        params: &impl Serialize,
        out: &mut dyn Write,
    ) -> anyhow::Result<Value> {
        let (id, line) = self.request_line(method, params)?;
        self.writer
            .write_all(&line)
            .context("lost the connection to the tarn daemon")?;
        let mut body = tarn_api::wire::FrameReader::new(&mut self.reader);
        let copied = io::copy(&mut body, out);
        let response = self.read_response();
        match (copied, response) {
            (Ok(_), Ok(r)) => unwrap_response(r, id),
            // The daemon's own error says more than a broken body.
            (Err(_), Ok(r)) if r.error.is_some() => unwrap_response(r, id),
            (Err(e), _) => Err(anyhow!("the stream: {e}")),
            (Ok(_), Err(e)) => Err(e),
        }
    }

    /// Calls a method whose request carries a streamed body
    /// (`dataset.receive`): `input` is sent after the request, then the
    /// result returned. The connection is used up.
    pub fn call_body_in(
        &mut self,
        method: &str,
        params: &impl Serialize,
        input: &mut dyn io::Read,
    ) -> anyhow::Result<Value> {
        let (id, line) = self.request_line(method, params)?;
        let mut input_failed = None;
        let sent = self.writer.write_all(&line).and_then(|()| {
            let mut frames = tarn_api::wire::FrameWriter::new(&mut self.writer);
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let n = match input.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        input_failed = Some(e);
                        return Ok(());
                    }
                };
                frames.write_all(&buf[..n])?;
            }
            frames.finish().map(|_| ())
        });
        if let Some(e) = input_failed {
            // The body ends without its end frame: the daemon undoes what
            // it started and answers; wait for that, then say why.
            let _ = self.writer.shutdown(std::net::Shutdown::Write);
            let _ = self.read_response();
            return Err(anyhow!("reading the stream: {e}"));
        }
        // The daemon may have answered early (a target that exists, a bad
        // stream) and closed: its answer beats the write error.
        match (sent, self.read_response()) {
            (_, Ok(r)) => unwrap_response(r, id),
            (Err(e), Err(_)) => Err(anyhow!("sending the stream to the daemon: {e}")),
            (Ok(()), Err(e)) => Err(e),
        }
    }

    /// Calls `method` and decodes its result as `R`.
    pub fn call_as<R: DeserializeOwned>(
        &mut self,
        method: &str,
        params: &impl Serialize,
    ) -> anyhow::Result<R> {
        let value = self.call(method, params)?;
        serde_json::from_value(value).with_context(|| {
            format!(
                "the daemon's answer to {method} does not have the expected shape; \
                 are the daemon and this client the same version? (`tarn daemon ping`)"
            )
        })
    }

    /// Asks the daemon which admin API it speaks, and refuses one of
    /// another major version: its answers could be misread.
    pub fn check_api_version(&mut self) -> anyhow::Result<PingResult> {
        let ping: PingResult = self.call_as(method::DAEMON_PING, &NoParams {})?;
        if !tarn_api::api_compatible(&ping.api_version) {
            let theirs = if ping.api_version.is_empty() {
                "an older, unversioned admin API".to_string()
            } else {
                format!("admin API {}", ping.api_version)
            };
            bail!(
                "the tarn daemon on {} (tarn {}, pid {}) speaks {theirs}; this tarn speaks admin \
                 API {API_VERSION}\n\
                 hint: use the tarn command of the daemon's version, or restart the daemon \
                 with this one",
                self.path.display(),
                ping.version,
                ping.pid,
            );
        }
        Ok(ping)
    }

    fn read_response(&mut self) -> anyhow::Result<Response> {
        let shown = self.path.display();
        match read_line_bounded(&mut self.reader, &mut self.line, MAX_RESPONSE_BYTES) {
            Ok(LineRead::Line) => serde_json::from_slice(&self.line)
                .with_context(|| format!("the daemon on {shown} sent an unreadable answer")),
            Ok(LineRead::TooLong) => {
                bail!("the daemon on {shown} sent an answer longer than {MAX_RESPONSE_BYTES} bytes")
            }
            Ok(LineRead::Eof) => Err(ClosedUnanswered {
                message: format!(
                    "the tarn daemon on {shown} closed the connection without answering; \
                     it may have stopped or crashed; see its log"
                ),
                sent: true,
            }
            .into()),
            Err(e) => bail!("lost the connection to the tarn daemon on {shown}: {e}"),
        }
    }
}

fn unwrap_response(response: Response, id: u64) -> anyhow::Result<Value> {
    if let Some(error) = response.error {
        // An error without an id answers the connection as a whole (`busy`).
        if response.id.is_none() || response.id == Some(id) {
            return Err(error.into());
        }
    }
    if response.id != Some(id) {
        bail!(
            "the daemon answered request {:?} while request {id} was waiting",
            response.id
        );
    }
    Ok(response.result.unwrap_or(Value::Null))
}

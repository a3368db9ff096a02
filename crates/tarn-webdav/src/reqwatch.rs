//! Sees each request's target as the client sent it.
//!
//! The HTTP stack drops a `#fragment` from the request target before the
//! request reaches us, so `DELETE /share/dir/#x` arrives as
//! `DELETE /share/dir/` and would remove the whole collection — most
//! likely a client that forgot to encode a `#` in a file name. A fragment
//! is not allowed in a request target (RFC 9112 §3.2), so the server
//! refuses such requests with 400; to know, it watches the bytes of the
//! connection: [`Watched`] wraps the connection's stream and feeds what
//! is read to a [`Tracker`], which follows HTTP/1.1 message framing
//! (request heads parsed with the same parser the HTTP stack uses,
//! bodies skipped by `Content-Length` or chunk sizes) and queues each
//! request's method and target. The request handler then takes the entry
//! matching its request ([`Heads::had_fragment`]).
//!
//! If the tracker ever loses the framing (a malformed message, which the
//! HTTP stack refuses too), it stops tracking that connection; requests
//! then go through as before.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest request head followed; the HTTP stack refuses larger ones.
const MAX_HEAD: usize = 512 << 10;
/// Largest chunk-size line or trailer section followed.
const MAX_LINE: usize = 16 << 10;
/// Heads queued and not yet taken (pipelined requests).
const MAX_QUEUED: usize = 64;
/// Most headers in a head, as the HTTP stack allows.
const MAX_HEADERS: usize = 100;

/// One request head: method, target without fragment, and whether the
/// target carried one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The method, as sent.
    pub method: String,
    /// The request target up to any `#`.
    pub target: String,
    /// True if the target had a `#fragment`.
    pub fragment: bool,
}

/// The heads seen on one connection, in order, shared between the
/// stream wrapper and the request handler.
#[derive(Clone, Default)]
pub struct Heads(Arc<Mutex<VecDeque<Head>>>);

impl Heads {
    fn push(&self, h: Head) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_QUEUED {
            q.pop_front();
        }
        q.push_back(h);
    }

    /// True if the head of the request `method target` (the target as
    /// the HTTP stack reports it, fragment removed) carried a fragment.
    /// Heads queued before it are dropped (requests the HTTP stack
    /// refused); if none matches, false.
    pub fn had_fragment(&self, method: &str, target: &str) -> bool {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(h) = q.pop_front() {
            if h.method == method && h.target == target {
                return h.fragment;
            }
        }
        false
    }
}

enum State {
    /// Reading a head; `scanned` bytes of `buf` hold no end of head.
    Head { buf: Vec<u8> },
    /// Skipping a body of known length.
    Body(u64),
    /// Reading a chunk-size line.
    ChunkSize(Vec<u8>),
    /// Skipping chunk data, then its CRLF.
    ChunkData(u64),
    /// Skipping the CRLF after chunk data (bytes left).
    ChunkEnd(u8),
    /// Reading trailer lines up to an empty one (length of the current
    /// line, total seen).
    Trailer(usize, usize),
    /// Framing lost: nothing more is tracked.
    Lost,
}

/// Follows HTTP/1.1 request framing over the bytes of a connection.
pub struct Tracker {
    state: State,
    heads: Heads,
}

impl Tracker {
    /// A tracker at the start of a connection, queueing into `heads`.
    pub fn new(heads: Heads) -> Tracker {
        Tracker {
            state: State::Head { buf: Vec::new() },
            heads,
        }
    }

    /// True once framing was lost.
    pub fn lost(&self) -> bool {
        matches!(self.state, State::Lost)
    }

    /// Feeds bytes read from the connection.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match &mut self.state {
                State::Lost => return,
                State::Head { buf } => {
                    let old = buf.len();
                    buf.extend_from_slice(data);
                    // Parse only once an empty line may have arrived.
                    let from = old.saturating_sub(3);
                    let ended = buf[from..].windows(2).any(|w| w == b"\n\n")
                        || buf[from..].windows(3).any(|w| w == b"\n\r\n");
                    if !ended {
                        if buf.len() > MAX_HEAD {
                            self.state = State::Lost;
                        }
                        return;
                    }
                    let buf = std::mem::take(buf);
                    match self.head(&buf) {
                        Parsed::Head(used) => {
                            let used = used.saturating_sub(old).min(data.len());
                            data = &data[used..];
                        }
                        // e.g. empty lines before the request line
                        Parsed::Partial if buf.len() <= MAX_HEAD => {
                            self.state = State::Head { buf };
                            return;
                        }
                        Parsed::Partial => {
                            self.state = State::Lost;
                            return;
                        }
                        Parsed::Bad => {
                            self.state = State::Lost;
                            return;
                        }
                    }
                }
                State::Body(left) => {
                    let n = (*left).min(data.len() as u64);
                    *left -= n;
                    data = &data[n as usize..];
                    if *left == 0 {
                        self.state = State::Head { buf: Vec::new() };
                    }
                }
                State::ChunkSize(line) => {
                    let nl = data.iter().position(|&b| b == b'\n');
                    let take = nl.map_or(data.len(), |i| i + 1);
                    line.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if nl.is_none() {
                        if line.len() > MAX_LINE {
                            self.state = State::Lost;
                        }
                        continue;
                    }
                    self.state = match httparse::parse_chunk_size(line) {
                        Ok(httparse::Status::Complete((_, 0))) => State::Trailer(0, 0),
                        Ok(httparse::Status::Complete((_, n))) => State::ChunkData(n),
                        _ => State::Lost,
                    };
                }
                State::ChunkData(left) => {
                    let n = (*left).min(data.len() as u64);
                    *left -= n;
                    data = &data[n as usize..];
                    if *left == 0 {
                        self.state = State::ChunkEnd(2);
                    }
                }
                State::ChunkEnd(left) => {
                    let want: &[u8] = if *left == 2 { b"\r\n" } else { b"\n" };
                    if data[0] != want[0] {
                        self.state = State::Lost;
                        return;
                    }
                    data = &data[1..];
                    *left -= 1;
                    if *left == 0 {
                        self.state = State::ChunkSize(Vec::new());
                    }
                }
                State::Trailer(line, total) => {
                    let b = data[0];
                    data = &data[1..];
                    *total += 1;
                    if *total > MAX_LINE {
                        self.state = State::Lost;
                        return;
                    }
                    match b {
                        b'\n' if *line == 0 => self.state = State::Head { buf: Vec::new() },
                        b'\n' => *line = 0,
                        b'\r' => {}
                        _ => *line += 1,
                    }
                }
            }
        }
    }

    /// Parses a complete head in `buf`, queues it and sets the body
    /// state.
    fn head(&mut self, buf: &[u8]) -> Parsed {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => match self.framing(&req) {
                Some(()) => Parsed::Head(n),
                None => Parsed::Bad,
            },
            Ok(httparse::Status::Partial) => Parsed::Partial,
            Err(_) => Parsed::Bad,
        }
    }

    /// Queues the head of `req` and sets the state for its body.
    fn framing(&mut self, req: &httparse::Request<'_, '_>) -> Option<()> {
        let method = req.method?.to_string();
        let raw = req.path?;
        let (target, fragment) = match raw.split_once('#') {
            Some((t, _)) => (t.to_string(), true),
            None => (raw.to_string(), false),
        };
        if method == "CONNECT" {
            return None;
        }
        let mut chunked = None;
        let mut length: Option<u64> = None;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let v = std::str::from_utf8(h.value).ok()?;
                let last = v.rsplit(',').next()?.trim();
                chunked = Some(last.eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("content-length") {
                let v: u64 = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
                if length.is_some_and(|l| l != v) {
                    return None;
                }
                length = Some(v);
            }
        }
        self.heads.push(Head {
            method,
            target,
            fragment,
        });
        self.state = match (chunked, length) {
            (Some(true), _) => State::ChunkSize(Vec::new()),
            (Some(false), _) => return None,
            (None, Some(n)) if n > 0 => State::Body(n),
            (None, _) => State::Head { buf: Vec::new() },
        };
        Some(())
    }
}

enum Parsed {
    /// A head, of this many bytes.
    Head(usize),
    /// More bytes needed.
    Partial,
    /// Not a request head the HTTP stack would take.
    Bad,
}

/// A connection stream whose reads are fed to a [`Tracker`].
pub struct Watched<I> {
    io: I,
    tracker: Tracker,
}

impl<I> Watched<I> {
    /// Wraps `io`, queueing request heads into `heads`.
    pub fn new(io: I, heads: Heads) -> Watched<I> {
        Watched {
            io,
            tracker: Tracker::new(heads),
        }
    }

    /// The wrapped stream, for the connection's lingering close.
    pub fn into_inner(self) -> I {
        self.io
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            if !this.tracker.lost() {
                this.tracker.feed(&buf.filled()[before..]);
            }
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads_of(stream: &[u8], split: usize) -> (Vec<Head>, bool) {
        let heads = Heads::default();
        let mut t = Tracker::new(heads.clone());
        for piece in stream.chunks(split.max(1)) {
            t.feed(piece);
        }
        let q = heads.0.lock().unwrap().iter().cloned().collect();
        (q, t.lost())
    }

    #[test]
    fn follows_bodies_and_chunks_in_any_split() {
        let stream = b"PUT /s/a HTTP/1.1\r\nHost: h\r\nContent-Length: 32\r\n\r\n\
DELETE /s/x#y HTTP/1.1\r\n\r\n123456\
PUT /s/b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\nGET /\r\n19;ext=1\r\nDELETE /s/#z HTTP/1.1\r\n\r\n\r\n0\r\nX-T: 1\r\n\r\n\
\r\nDELETE /s/dir/#ment HTTP/1.1\r\nHost: h\r\n\r\nGET /s/f?q=1 HTTP/1.1\r\n\r\n";
        for split in [1, 2, 3, 7, 64, stream.len()] {
            let (q, lost) = heads_of(stream, split);
            assert!(!lost, "split {split}: {q:?}");
            let got: Vec<(&str, &str, bool)> = q
                .iter()
                .map(|h| (h.method.as_str(), h.target.as_str(), h.fragment))
                .collect();
            assert_eq!(
                got,
                vec![
                    ("PUT", "/s/a", false),
                    ("PUT", "/s/b", false),
                    ("DELETE", "/s/dir/", true),
                    ("GET", "/s/f?q=1", false),
                ],
                "split {split}"
            );
        }
    }

    #[test]
    fn matching_skips_refused_heads() {
        let heads = Heads::default();
        let mut t = Tracker::new(heads.clone());
        t.feed(b"GET /a#x HTTP/1.1\r\n\r\nDELETE /b#y HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\n");
        assert!(heads.had_fragment("DELETE", "/b"));
        assert!(!heads.had_fragment("GET", "/c"));
        assert!(!heads.had_fragment("GET", "/a"), "already dropped");
    }

    #[test]
    fn garbage_loses_framing_without_panicking() {
        let (_, lost) = heads_of(b"\x00\x01 not http\r\n\r\n", 3);
        assert!(lost);
        let (_, lost) = heads_of(b"PUT / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 5);
        assert!(lost);
        let (_, lost) = heads_of(
            b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            5,
        );
        assert!(lost);
    }
}

//! One connection, from accept to close.
//!
//! Admission comes first ([`Admission::admit`]): a connection over the
//! per-address or global limit is closed at once (a plain-HTTP client gets
//! a 503 if its socket takes it without waiting). The TLS handshake, and
//! every request head after it, must arrive within the header timeout, so
//! a client that connects and says nothing holds a slot only that long;
//! an idle connection may also be evicted for a newcomer
//! ([`Conn::closed`]).
//!
//! Each request holds a [`Busy`] guard from its head until its response
//! body is done, which is how admission tells an idle connection (may be
//! evicted) from one serving a request (may not). A panic while handling
//! the request or producing its body is caught: the request is answered
//! 500 (or its body cut short) and the connection closed, the server goes
//! on.
//!
//! **Lingering close.** When hyper is done with a connection (not when
//! the server stops), the socket is taken back, its write side shut, and
//! whatever the client still sends read and dropped for up to [`LINGER`],
//! so the kernel does not reset a connection whose answer the client has
//! not read yet (see [`linger`]).
//!
//! The body types live here because they carry per-connection duties:
//! [`ReqBody`] remembers a body that failed to decode (answered 400, not
//! dav-server's 502) and [`RespBody`] holds the `Busy` guard, catches
//! panics and completes PROPFIND answers ([`PropFix`]).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use dav_server::body::Body;
use http::{header, Request, Response, StatusCode};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tarn_conn::{Admission, Busy, Conn};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::route::{handle, simple};
use super::State;
use crate::panics;
use crate::propfix::PropFix;
use crate::reqwatch::{Heads, Watched};

#[cfg(not(feature = "tls"))]
#[derive(Clone)]
pub(super) enum NoTls {}

#[cfg(feature = "tls")]
type Acceptor = tokio_rustls::TlsAcceptor;
#[cfg(not(feature = "tls"))]
type Acceptor = NoTls;

/// The answer to a plain-HTTP client turned away at accept: written if
/// the socket takes it at once, never waited for.
const BUSY_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
Connection: close\r\nContent-Length: 0\r\n\r\n";

pub(super) async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    tls: Option<Acceptor>,
    mut shutdown: watch::Receiver<bool>,
    adm: Arc<Admission>,
) {
    loop {
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // e.g. EMFILE: back off instead of spinning.
                    log::warn!("tarn-webdav: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let conn = match adm.admit(peer.ip()) {
            Ok(c) => c,
            Err(_) => {
                if tls.is_none() {
                    let _ = sock.try_write(BUSY_503);
                }
                drop(sock);
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let (st, tls, sd) = (state.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tls {
                #[cfg(feature = "tls")]
                Some(acc) => {
                    let handshake = tokio::time::timeout(st.header_timeout, acc.accept(sock));
                    let s = tokio::select! {
                        r = handshake => r,
                        _ = conn.closed(None) => return,
                    };
                    if let Ok(Ok(s)) = s {
                        serve_conn(s, peer, conn, st, sd).await;
                    }
                }
                #[cfg(not(feature = "tls"))]
                Some(n) => match n {},
                None => serve_conn(sock, peer, conn, st, sd).await,
            }
        });
    }
}

async fn serve_conn<I>(
    io: I,
    peer: SocketAddr,
    conn: Conn,
    state: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeout = state.header_timeout;
    let heads = Heads::default();
    // A client that stops reading its answer counts as idle after a
    // while (it may be evicted), and is closed after [`STALL_CLOSE`].
    let (io, clock) = tarn_conn::Progress::new(io);
    let io = Watched::new(io, heads.clone());
    let activity = conn.state().clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let st = state.clone();
        let heads = heads.clone();
        let busy = activity.begin();
        // Boxed so the connection is `Unpin` and its socket can be taken
        // back for the lingering close.
        Box::pin(async move {
            Ok::<_, Infallible>(serve_request(req, peer.ip(), st, heads, busy).await)
        })
    });
    let mut http = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(io), svc);
    if *shutdown.borrow() {
        Pin::new(&mut http).graceful_shutdown();
    }
    // Run to the end: hyper flushes the last answer and shuts the write
    // side (FIN) before it returns; only then is the socket taken back.
    let stopping = tokio::select! {
        _ = Pin::new(&mut http) => false,
        // Evicted for a newcomer while idle: just close.
        _ = conn.closed(None) => return,
        _ = clock.watch(conn.state(), STALL_CLOSE) => return,
        _ = shutdown.changed() => {
            Pin::new(&mut http).graceful_shutdown();
            let _ = Pin::new(&mut http).await;
            true
        }
    };
    if stopping || *shutdown.borrow() {
        return;
    }
    let io = http.into_parts().io.into_inner().into_inner().into_inner();
    tokio::select! {
        _ = linger(io) => {}
        _ = conn.closed(None) => {}
        _ = shutdown.changed() => {}
    }
}

/// How long a client may take none of an answer before its connection is
/// closed (a download it stopped reading).
const STALL_CLOSE: Duration = Duration::from_secs(120);

/// How long a closing connection keeps reading what its client still sends.
const LINGER: Duration = Duration::from_secs(2);

/// The lingering close of a connection whose last answer is written and
/// flushed: FIN (again, if hyper sent it already, or first, after an
/// error), then read and drop whatever the client still sends until it
/// closes too (or [`LINGER`] passes). Closing a socket with unread bytes makes the
/// kernel send a reset, and a client still uploading (a PUT answered 507
/// when the pool filled, a 413, a 401 before the body) would lose the
/// answer it had not read yet to that reset.
async fn linger<I: AsyncRead + AsyncWrite + Unpin>(mut io: I) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(LINGER, async {
        let _ = io.shutdown().await;
        let mut sink = vec![0u8; 64 << 10];
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// One request: panics caught (500, one log line), the request's
/// [`Busy`] guard held until its response body is done.
async fn serve_request(
    req: Request<Incoming>,
    ip: IpAddr,
    st: Arc<State>,
    heads: Heads,
    busy: Busy,
) -> Response<RespBody> {
    let what = format!("{} {:.200} from {ip}", req.method(), req.uri().path());
    let start = std::time::Instant::now();
    let method = req.method().clone();
    let stats = st.clone();
    let done = panics::Caught(Box::pin(handle(req, ip, st, heads))).await;
    if let Some(s) = stats.method_stats(method.as_str()) {
        let ok = done
            .as_ref()
            .is_ok_and(|(r, _)| !r.status().is_server_error());
        s.record(start, ok);
    }
    match done {
        Ok((resp, fix)) => resp.map(|b| RespBody::new(b, busy, fix, what)),
        Err(p) => {
            panics::report(&what, p.as_ref());
            let mut r = simple(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n");
            r.headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            r.map(|b| RespBody::new(b, busy, None, what))
        }
    }
}

/// A request body handed to dav-server: the connection's (a decoding
/// error is remembered, so the request is answered 400 rather than with
/// the library's 502), or one read ahead.
pub(super) enum ReqBody {
    Stream(Incoming, Arc<AtomicBool>),
    Read(Option<Bytes>),
}

impl HttpBody for ReqBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            ReqBody::Stream(b, failed) => Pin::new(b).poll_frame(cx).map_err(|e| {
                failed.store(true, Ordering::Relaxed);
                std::io::Error::new(std::io::ErrorKind::InvalidData, e)
            }),
            ReqBody::Read(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Stream(b, _) => b.is_end_stream(),
            ReqBody::Read(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Stream(b, _) => b.size_hint(),
            ReqBody::Read(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Read(None) => SizeHint::with_exact(0),
        }
    }
}

/// A response body: dav-server's, possibly completed by [`PropFix`],
/// holding the request's [`Busy`] guard until it is done, and with
/// panics while it is produced caught (the connection is then closed).
pub(crate) struct RespBody {
    inner: Body,
    fix: Option<PropFix>,
    done: bool,
    _busy: Busy,
    what: String,
}

impl RespBody {
    fn new(inner: Body, busy: Busy, fix: Option<PropFix>, what: String) -> RespBody {
        RespBody {
            inner,
            fix,
            done: false,
            _busy: busy,
            what,
        }
    }
}

impl HttpBody for RespBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let inner = &mut this.inner;
            let polled = panics::catch(
                &this.what,
                std::panic::AssertUnwindSafe(|| Pin::new(inner).poll_frame(cx)),
            );
            let frame = match polled {
                None => {
                    this.done = true;
                    return Poll::Ready(Some(Err(std::io::Error::other(
                        "panic while producing the response",
                    ))));
                }
                Some(Poll::Pending) => return Poll::Pending,
                Some(Poll::Ready(f)) => f,
            };
            let Some(fix) = &mut this.fix else {
                return Poll::Ready(frame);
            };
            match frame {
                Some(Ok(f)) => match f.into_data() {
                    Ok(data) => {
                        let out = fix.feed(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(f) => return Poll::Ready(Some(Ok(f))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    let out = fix.finish();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.fix.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.fix.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

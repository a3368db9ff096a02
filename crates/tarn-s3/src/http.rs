//! A minimal blocking HTTP/1.1 client: one kept-alive connection, plain
//! or TLS (rustls, roots from the system's bundle), requests with a
//! `Content-Length` body, responses with a length, chunked, or to the end
//! of the connection. What an S3 client needs and no more; every size a
//! server sends is bounded before it is believed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::S3Error;

/// Largest response body accepted (a stream chunk is far smaller).
const MAX_BODY: usize = 256 << 20;
/// Largest status line or header line.
const MAX_LINE: usize = 16 << 10;
/// How long a read or write may stall.
const IO_TIMEOUT: Duration = Duration::from_secs(120);

/// Where requests go: scheme, host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// HTTPS.
    pub tls: bool,
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Endpoint {
    /// Parses `http://host[:port]` or `https://host[:port]` (a trailing
    /// `/` is allowed, a path is not).
    pub fn parse(url: &str) -> Result<Endpoint, S3Error> {
        let bad = || S3Error::Config(format!("endpoint '{url}': use http(s)://host[:port]"));
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad());
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() || rest.contains('/') {
            return Err(bad());
        }
        let default = if tls { 443 } else { 80 };
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, after) = r.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None if after.is_empty() => default,
                None => return Err(bad()),
            };
            (h.to_string(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
                None => (rest.to_string(), default),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Endpoint { tls, host, port })
    }

    /// The `Host` header's value.
    pub fn host_header(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A response: status, headers (lowercase names) and body.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header of that (lowercase) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One kept-alive connection to an endpoint, made again when it closes.
pub struct Client {
    endpoint: Endpoint,
    tls: Option<Arc<rustls::ClientConfig>>,
    conn: Option<BufReader<Stream>>,
}

/// The system's trusted roots: `SSL_CERT_FILE`, else the usual bundles.
fn roots() -> Result<rustls::RootCertStore, S3Error> {
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(f) = std::env::var_os("SSL_CERT_FILE") {
        candidates.push(f.into());
    }
    for f in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ] {
        candidates.push(f.into());
    }
    for path in candidates {
        let Ok(iter) = CertificateDer::pem_file_iter(&path) else {
            continue;
        };
        let mut store = rustls::RootCertStore::empty();
        for cert in iter.flatten() {
            let _ = store.add(cert);
        }
        if !store.is_empty() {
            return Ok(store);
        }
    }
    Err(S3Error::Config(
        "no trusted certificates found for HTTPS (set SSL_CERT_FILE to a PEM bundle)".into(),
    ))
}

impl Client {
    /// A client for `endpoint` (connects on the first request).
    pub fn new(endpoint: Endpoint) -> Result<Client, S3Error> {
        let tls = if endpoint.tls {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| S3Error::Config(format!("TLS: {e}")))?
                .with_root_certificates(roots()?)
                .with_no_client_auth();
            Some(Arc::new(cfg))
        } else {
            None
        };
        Ok(Client {
            endpoint,
            tls,
            conn: None,
        })
    }

    fn connect(&self) -> Result<BufReader<Stream>, S3Error> {
        let e = &self.endpoint;
        let tcp = TcpStream::connect((e.host.as_str(), e.port))
            .map_err(|err| S3Error::Io(format!("connect to {}:{}: {err}", e.host, e.port)))?;
        let _ = tcp.set_nodelay(true);
        tcp.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|_| tcp.set_write_timeout(Some(IO_TIMEOUT)))
            .map_err(|err| S3Error::Io(err.to_string()))?;
        let stream = match &self.tls {
            None => Stream::Plain(tcp),
            Some(cfg) => {
                let name = ServerName::try_from(e.host.clone())
                    .map_err(|_| S3Error::Config(format!("'{}' is not a host name", e.host)))?;
                let conn = rustls::ClientConnection::new(cfg.clone(), name)
                    .map_err(|err| S3Error::Io(format!("TLS: {err}")))?;
                Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
            }
        };
        Ok(BufReader::with_capacity(64 << 10, stream))
    }

    /// Sends one request and reads its response. `target` is the encoded
    /// path and query; `headers` must hold `host` and whatever signs it.
    /// A connection that fails is dropped (the next request reconnects);
    /// the error says whether to retry.
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Response, S3Error> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect()?,
        };
        let r = exchange(&mut conn, method, target, headers, body);
        match r {
            Ok((resp, keep)) => {
                if keep {
                    self.conn = Some(conn);
                }
                Ok(resp)
            }
            Err(e) => Err(e),
        }
    }
}

fn io(e: std::io::Error) -> S3Error {
    S3Error::Io(e.to_string())
}

/// Writes the request, reads the response; true when the connection may
/// carry another.
fn exchange(
    conn: &mut BufReader<Stream>,
    method: &str,
    target: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<(Response, bool), S3Error> {
    let mut head = format!("{method} {target} HTTP/1.1\r\n");
    for (k, v) in headers {
        if k.contains(['\r', '\n', ':']) || v.contains(['\r', '\n']) {
            return Err(S3Error::Config(format!("header '{k}' holds a line break")));
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let w = conn.get_mut();
    w.write_all(head.as_bytes()).map_err(io)?;
    w.write_all(body).map_err(io)?;
    w.flush().map_err(io)?;

    // Interim (1xx) responses come before the real one: read past them.
    let mut interim = 0;
    let (version, status, headers) = loop {
        let (version, status, headers) = read_head(conn)?;
        if status / 100 != 1 {
            break (version, status, headers);
        }
        interim += 1;
        if interim > 8 {
            return Err(S3Error::Protocol("too many interim responses".into()));
        }
    };
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    let close = resp
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        || version == "HTTP/1.0";
    let no_body = method == "HEAD" || status == 204 || status == 304;
    if no_body {
        return Ok((resp, !close));
    }
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let line = read_line(conn)?;
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| S3Error::Protocol(format!("bad chunk size '{line}'")))?;
            if size == 0 {
                // Trailers, then the empty line.
                let mut trailers = 0;
                while !read_line(conn)?.is_empty() {
                    trailers += 1;
                    if trailers > 200 {
                        return Err(S3Error::Protocol("too many trailers".into()));
                    }
                }
                break;
            }
            if size > MAX_BODY - resp.body.len() {
                return Err(S3Error::Protocol("response body too large".into()));
            }
            read_exactly(conn, &mut resp.body, size)?;
            let mut crlf = [0u8; 2];
            conn.read_exact(&mut crlf).map_err(io)?;
            if &crlf != b"\r\n" {
                return Err(S3Error::Protocol("a chunk not ended by CRLF".into()));
            }
        }
        return Ok((resp, !close));
    }
    match resp.header("content-length") {
        Some(v) => {
            let n: usize = v
                .parse()
                .map_err(|_| S3Error::Protocol(format!("bad content-length '{v}'")))?;
            if n > MAX_BODY {
                return Err(S3Error::Protocol("response body too large".into()));
            }
            read_exactly(conn, &mut resp.body, n)?;
            Ok((resp, !close))
        }
        None => {
            conn.take(MAX_BODY as u64 + 1)
                .read_to_end(&mut resp.body)
                .map_err(io)?;
            if resp.body.len() > MAX_BODY {
                return Err(S3Error::Protocol("response body too large".into()));
            }
            Ok((resp, false))
        }
    }
}

/// A response's status line and headers (names lowercased).
#[allow(clippy::type_complexity)]
fn read_head(
    conn: &mut BufReader<Stream>,
) -> Result<(String, u16, Vec<(String, String)>), S3Error> {
    let status_line = read_line(conn)?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("").to_string();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| S3Error::Protocol(format!("bad status line '{status_line}'")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(conn)?;
        if line.is_empty() {
            break;
        }
        if headers.len() > 200 {
            return Err(S3Error::Protocol("too many response headers".into()));
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| S3Error::Protocol(format!("bad header line '{line}'")))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    Ok((version, status, headers))
}

/// Appends `n` bytes read from `conn` to `body`, growing it as they come:
/// a length a server announces is not allocated before the bytes are
/// there (a hostile server could announce the limit and trickle).
fn read_exactly(conn: &mut impl Read, body: &mut Vec<u8>, n: usize) -> Result<(), S3Error> {
    let want = body.len() + n;
    conn.take(n as u64).read_to_end(body).map_err(io)?;
    if body.len() != want {
        return Err(S3Error::Io(
            "the connection ended inside a response body".into(),
        ));
    }
    Ok(())
}

/// One CRLF-terminated line, without it.
fn read_line(conn: &mut BufReader<Stream>) -> Result<String, S3Error> {
    let mut buf = Vec::new();
    let n = conn
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut buf)
        .map_err(io)?;
    if n == 0 {
        return Err(S3Error::Io("the server closed the connection".into()));
    }
    if buf.last() != Some(&b'\n') {
        return Err(S3Error::Protocol("a response line too long or cut".into()));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf).map_err(|_| S3Error::Protocol("a response line is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let e = Endpoint::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!((e.tls, e.host.as_str(), e.port), (false, "127.0.0.1", 9000));
        assert_eq!(e.host_header(), "127.0.0.1:9000");
        let e = Endpoint::parse("https://s3.eu-west-1.amazonaws.com/").unwrap();
        assert_eq!((e.tls, e.port), (true, 443));
        assert_eq!(e.host_header(), "s3.eu-west-1.amazonaws.com");
        let e = Endpoint::parse("http://[::1]:9000").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        assert_eq!(e.host_header(), "[::1]:9000");
        for bad in [
            "ftp://x",
            "http://",
            "http://h:port",
            "http://h/path",
            "s3.amazonaws.com",
            "http://[::1",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    /// A local server answering with the framings a store may use:
    /// content-length, chunked, and close-delimited after an interim
    /// 100; the client keeps the connection for the first two.
    #[test]
    fn responses_in_every_framing() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let answers: [&[u8]; 3] = [
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\ngone",
            ];
            for a in answers {
                // Read the request head and its (empty) body.
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" {
                        break;
                    }
                }
                w.write_all(a).unwrap();
            }
        });
        let mut c =
            Client::new(Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap()).unwrap();
        let h = vec![("host".to_string(), "x".to_string())];
        let r = c.request("GET", "/a", &h, b"").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        let r = c.request("GET", "/b", &h, b"").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
        let r = c.request("GET", "/c", &h, b"").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"gone"[..]));
        server.join().unwrap();
        assert!(c.conn.is_none(), "a closed connection is not kept");
    }

    /// A GET answered with `answer` by a server that takes one request,
    /// and that server's thread.
    fn one_answer(answer: &[u8]) -> (Result<Response, S3Error>, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let a = answer.to_vec();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(&a);
        });
        let mut c =
            Client::new(Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap()).unwrap();
        let h = vec![("host".to_string(), "x".to_string())];
        (c.request("GET", "/", &h, b""), server)
    }

    /// A server that promises an absurd body or sends garbage gets an
    /// error, not an allocation or a panic.
    #[test]
    fn lies_are_errors() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"SMTP ready\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXY",
        ] {
            let (r, server) = one_answer(answer);
            assert!(r.is_err(), "{answer:?}: {r:?}");
            server.join().unwrap();
        }
    }

    fn peak_rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// A length a server announces (here 200 MiB, in one body and in one
    /// chunk) is not allocated before the bytes come: a server that
    /// announces the limit and sends a few bytes costs a few bytes.
    #[test]
    fn an_announced_length_is_not_allocated_before_the_bytes_come() {
        let before = peak_rss_kib();
        for answer in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 209715200\r\n\r\nonly this"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nc800000\r\nonly this",
        ] {
            let (r, server) = one_answer(answer);
            assert!(r.is_err(), "a cut body: {r:?}");
            server.join().unwrap();
        }
        let grew = peak_rss_kib().saturating_sub(before);
        assert!(grew < 100 << 10, "peak memory grew by {grew} KiB");
    }
}

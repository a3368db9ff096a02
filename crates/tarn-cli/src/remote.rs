//! A session with another tarn's replication port (`tarn replicate --to
//! tarn://HOST:PORT/DATASET`): TLS whose certificate must have the SHA-256
//! the user pinned (`tarn replication info` on the receiver prints it), so
//! no certificate authority is trusted; then the admin API's line
//! protocol, opened with the token the receiver gave out.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Serialize;
use serde_json::Value;
use tarn_api::params::HelloParams;
use tarn_api::{method, read_line_bounded, LineRead, Response};

/// The replication port's default.
pub const DEFAULT_PORT: u16 = 7450;
/// How long connecting and each answer may take (a stream's answer comes
/// after the receiver applied it, which [`STREAM_WAIT`] allows for).
const WAIT: Duration = Duration::from_secs(60);
/// How long the answer to a stream may take after its last frame.
const STREAM_WAIT: Duration = Duration::from_secs(600);
/// Longest answer line.
const MAX_LINE: usize = 64 << 20;

/// `tarn://HOST[:PORT]/DATASET`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// The dataset on the receiver.
    pub dataset: String,
}

impl Target {
    /// Parses a `tarn://` address.
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let bad = || anyhow!("'{url}': use tarn://HOST[:PORT]/POOL/DATASET");
        let rest = url.strip_prefix("tarn://").ok_or_else(bad)?;
        let (hostport, dataset) = rest.split_once('/').ok_or_else(bad)?;
        let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
            let (h, after) = r.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad())?,
                None if after.is_empty() => DEFAULT_PORT,
                None => return Err(bad()),
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
                None => (hostport.to_string(), DEFAULT_PORT),
            }
        };
        let dataset = dataset.trim_end_matches('/');
        if host.is_empty() || dataset.is_empty() || dataset.contains('@') {
            return Err(bad());
        }
        Ok(Target {
            host,
            port,
            dataset: dataset.to_string(),
        })
    }
}

/// Parses a certificate fingerprint: 64 hex digits, with or without
/// colons, either case.
pub fn parse_fingerprint(s: &str) -> anyhow::Result<[u8; 32]> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    let mut out = [0u8; 32];
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("a fingerprint is the certificate's SHA-256: 64 hex digits (`tarn replication info` on the receiver)");
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("'{s}' is not a hex fingerprint"))?;
    }
    Ok(out)
}

/// Accepts exactly the certificate whose SHA-256 was pinned; signatures
/// of the handshake are checked as usual.
#[derive(Debug)]
struct Pinned {
    want: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        if got.as_ref() == self.want {
            Ok(ServerCertVerified::assertion())
        } else {
            let hex: Vec<String> = got.as_ref().iter().map(|b| format!("{b:02X}")).collect();
            Err(rustls::Error::General(format!(
                "the receiver's certificate is {}, not the one pinned with --fingerprint",
                hex.join(":")
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// An open session (see the module docs).
pub struct Remote {
    r: BufReader<Tls>,
    next_id: u64,
    /// The dataset the token may receive into.
    pub scope: String,
}

impl Remote {
    /// Connects, checks the certificate, and says hello with `token`.
    pub fn connect(t: &Target, fingerprint: &[u8; 32], token: &str) -> anyhow::Result<Remote> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                want: *fingerprint,
                provider,
            }))
            .with_no_client_auth();
        let addr = (t.host.as_str(), t.port)
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {}", t.host))?
            .next()
            .ok_or_else(|| anyhow!("{} has no address", t.host))?;
        let tcp = TcpStream::connect_timeout(&addr, WAIT)
            .with_context(|| format!("cannot connect to {}:{}", t.host, t.port))?;
        tcp.set_read_timeout(Some(WAIT))?;
        tcp.set_write_timeout(Some(STREAM_WAIT))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(t.host.clone())
            .map_err(|_| anyhow!("'{}' is not a host name", t.host))?;
        let conn =
            rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| anyhow!("TLS: {e}"))?;
        let mut me = Remote {
            r: BufReader::with_capacity(64 << 10, rustls::StreamOwned::new(conn, tcp)),
            next_id: 1,
            scope: String::new(),
        };
        let hello = me
            .call(
                method::REPLICATION_HELLO,
                &HelloParams {
                    token: token.trim().to_string(),
                },
            )
            .with_context(|| format!("{}:{}", t.host, t.port))?;
        me.scope = hello["dataset"].as_str().unwrap_or_default().to_string();
        Ok(me)
    }

    fn request(&mut self, m: &str, params: &impl Serialize) -> anyhow::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(&serde_json::json!({
            "id": id, "method": m, "params": params,
        }))?;
        line.push(b'\n');
        let w = self.r.get_mut();
        w.write_all(&line)?;
        w.flush()?;
        Ok(id)
    }

    fn response(&mut self, id: u64) -> anyhow::Result<Value> {
        let mut line = Vec::new();
        match read_line_bounded(&mut self.r, &mut line, MAX_LINE) {
            Ok(LineRead::Line) => {}
            Ok(LineRead::TooLong) => bail!("the receiver's answer is too long"),
            Ok(LineRead::Eof) => bail!("the receiver closed the connection"),
            Err(e) => return Err(anyhow!("reading the receiver's answer: {e}")),
        }
        let r: Response = serde_json::from_slice(&line)
            .map_err(|e| anyhow!("the receiver's answer is not one: {e}"))?;
        if r.id.is_some_and(|got| got != id) {
            bail!("the receiver answered another request");
        }
        match (r.result, r.error) {
            (_, Some(e)) => Err(anyhow!("the receiver: {}", e.message)),
            (Some(v), None) => Ok(v),
            (None, None) => Ok(Value::Null),
        }
    }

    /// Calls a method and returns its result.
    pub fn call(&mut self, m: &str, params: &impl Serialize) -> anyhow::Result<Value> {
        let id = self.request(m, params)?;
        self.response(id)
    }

    /// Calls a method whose request carries a stream: `fill` writes the
    /// stream into the frames it is given; then the receiver's answer.
    /// The session ends with it.
    pub fn call_with_body(
        mut self,
        m: &str,
        params: &impl Serialize,
        fill: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
    ) -> anyhow::Result<Value> {
        let id = self.request(m, params)?;
        let sent = {
            let mut frames = tarn_api::wire::FrameWriter::new(self.r.get_mut());
            fill(&mut frames).and_then(|()| {
                frames.finish()?;
                Ok(())
            })
        };
        let _ = self.r.get_ref().sock.set_read_timeout(Some(STREAM_WAIT));
        if let Err(e) = sent {
            // Either the receiver refused and closed (its answer says
            // why), or our side failed: then the body ends without its end
            // frame, and the receiver undoes (or keeps to resume) what it
            // started.
            return match self.salvage_answer() {
                Some(r) => match r.error {
                    Some(theirs) => Err(anyhow!("the receiver: {}", theirs.message)),
                    None => Err(e),
                },
                None => Err(e),
            };
        }
        self.response(id)
    }

    /// The answer the receiver sent before it closed, read without
    /// writing anything more (the unsent frames are dropped; a TLS stream
    /// would try to send them first and fail on the closed connection).
    fn salvage_answer(&mut self) -> Option<Response> {
        use std::io::Read;
        let mut got: Vec<u8> = self.r.buffer().to_vec();
        let stream = self.r.get_mut();
        let _ = stream.sock.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.sock.set_write_timeout(Some(Duration::from_secs(5)));
        stream.conn.send_close_notify();
        let _ = stream.conn.write_tls(&mut stream.sock);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut eof = false;
        loop {
            if let Some(end) = got.iter().position(|&b| b == b'\n') {
                return serde_json::from_slice(&got[..end]).ok();
            }
            if got.len() > MAX_LINE || std::time::Instant::now() > deadline {
                return None;
            }
            let mut buf = [0u8; 16 << 10];
            match stream.conn.reader().read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
            if eof {
                return None;
            }
            match stream.conn.read_tls(&mut stream.sock) {
                Ok(0) => eof = true,
                Ok(_) => {}
                Err(_) => return None,
            }
            stream.conn.process_new_packets().ok()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_fingerprints_parse() {
        let t = Target::parse("tarn://nas.local/vault/backups/home").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.dataset.as_str()),
            ("nas.local", DEFAULT_PORT, "vault/backups/home")
        );
        let t = Target::parse("tarn://[::1]:9000/vault").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9000));
        for bad in [
            "tarn://host",
            "tarn:///vault",
            "tarn://h:x/vault",
            "tarn://h/vault@snap",
            "s3://b/p",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        let fp = "AB:".repeat(31) + "AB";
        assert_eq!(parse_fingerprint(&fp).unwrap(), [0xab; 32]);
        assert_eq!(parse_fingerprint(&"cd".repeat(32)).unwrap(), [0xcd; 32]);
        assert!(parse_fingerprint("AB:CD").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }
}

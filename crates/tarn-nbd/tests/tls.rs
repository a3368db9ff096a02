//! TLS: `NBD_OPT_STARTTLS` with a tokio-rustls client and with libnbd's
//! `nbdinfo` and qemu, against a certificate signed by a throwaway CA;
//! and the FORCEDTLS policy (`tls_required`).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tarn_nbd::proto::{self, client, cmd, opt, rep};
use tarn_nbd::{NbdConfig, NbdExport, Running};
use tarn_testkit::require;
use tarn_vol::testing::MemDevice;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A CA and a server certificate for `localhost` and 127.0.0.1, written
/// to `dir` as `ca-cert.pem` (the name libnbd and qemu look for).
struct Pki {
    ca_der: CertificateDer<'static>,
    server: Arc<rustls::ServerConfig>,
}

fn pki(dir: &Path) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "tarn test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    std::fs::write(dir.join("ca-cert.pem"), ca_cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone(), ca_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    Pki {
        ca_der: ca_cert.der().clone(),
        server: Arc::new(server),
    }
}

fn tls_server(p: &Pki, required: bool, dev: Arc<MemDevice>) -> Running {
    start_with(
        NbdConfig {
            tls: Some(p.server.clone()),
            tls_required: required,
            ..NbdConfig::default()
        },
        vec![NbdExport::new("disk", dev)],
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn send_option<S: AsyncWrite + Unpin>(s: &mut S, option: u32, data: &[u8]) {
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).await.unwrap();
    s.flush().await.unwrap();
}

/// Replies to one option up to the final one: (type, data) each.
async fn option<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    o: u32,
    data: &[u8],
) -> Vec<(u32, Vec<u8>)> {
    send_option(s, o, data).await;
    let mut v = Vec::new();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).await.unwrap();
        assert_eq!(&h[..8], &proto::OPTION_REPLY_MAGIC.to_be_bytes());
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        s.read_exact(&mut d).await.unwrap();
        v.push((kind, d));
        if kind == rep::ACK || kind & (1 << 31) != 0 {
            return v;
        }
    }
}

async fn greet(s: &mut TcpStream) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).await.unwrap();
    assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
    s.write_all(&(client::FIXED_NEWSTYLE | client::NO_ZEROES).to_be_bytes())
        .await
        .unwrap();
}

fn connector(p: &Pki) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(p.ca_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

#[test]
fn starttls_with_a_rustls_client_then_read_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let dev = Arc::new(MemDevice::new(4 * MIB, 4096));
    let r = tls_server(&p, true, dev.clone());
    let addr = r.local_addr();
    rt().block_on(async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        greet(&mut s).await;
        // FORCEDTLS: options are refused until TLS is on.
        for o in [opt::LIST, opt::GO, opt::STRUCTURED_REPLY, 77] {
            let rep = option(&mut s, o, &[]).await;
            assert_eq!(rep[0].0, rep::ERR_TLS_REQD, "option {o}");
        }
        let rep = option(&mut s, opt::STARTTLS, &[]).await;
        assert_eq!(rep, [(rep::ACK, vec![])]);
        let name = ServerName::try_from("localhost").unwrap();
        let mut t = connector(&p).connect(name, s).await.expect("TLS handshake");
        let rep = option(&mut t, opt::STARTTLS, &[]).await;
        assert_eq!(rep[0].0, rep::ERR_INVALID, "STARTTLS twice");
        let list = option(&mut t, opt::LIST, &[]).await;
        assert_eq!(list[0].0, rep::SERVER);
        assert_eq!(&list[0].1[4..], b"disk");
        assert_eq!(
            option(&mut t, opt::STRUCTURED_REPLY, &[]).await[0].0,
            rep::ACK
        );
        let go = option(&mut t, opt::GO, &info_payload("disk", &[])).await;
        assert_eq!(go.last().unwrap().0, rep::ACK);
        // Write 64 KiB, read it back with a structured reply.
        let data = pattern(7, 65536);
        let mut req = Vec::new();
        for (kind, len, payload) in [
            (cmd::WRITE, 65536u32, &data[..]),
            (cmd::READ, 65536, &[][..]),
        ] {
            req.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
            req.extend_from_slice(&0u16.to_be_bytes());
            req.extend_from_slice(&kind.to_be_bytes());
            req.extend_from_slice(&(kind as u64 + 100).to_be_bytes());
            req.extend_from_slice(&4096u64.to_be_bytes());
            req.extend_from_slice(&len.to_be_bytes());
            req.extend_from_slice(payload);
            t.write_all(&req).await.unwrap();
            t.flush().await.unwrap();
            req.clear();
            let mut magic = [0u8; 4];
            t.read_exact(&mut magic).await.unwrap();
            if kind == cmd::WRITE {
                // A simple reply: error 0 and the cookie.
                let mut rest = [0u8; 12];
                t.read_exact(&mut rest).await.unwrap();
                assert_eq!(u32::from_be_bytes(magic), proto::SIMPLE_REPLY_MAGIC);
                assert_eq!(&rest[..4], &[0; 4]);
                assert_eq!(u64::from_be_bytes(rest[4..].try_into().unwrap()), 101);
            } else {
                assert_eq!(u32::from_be_bytes(magic), proto::STRUCTURED_REPLY_MAGIC);
                let mut h = [0u8; 16];
                t.read_exact(&mut h).await.unwrap();
                assert_eq!(
                    u16::from_be_bytes([h[2], h[3]]),
                    proto::reply::TYPE_OFFSET_DATA
                );
                assert_eq!(u64::from_be_bytes(h[4..12].try_into().unwrap()), 100);
                let mut body =
                    vec![0u8; u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize];
                t.read_exact(&mut body).await.unwrap();
                assert_eq!(&body[..8], &4096u64.to_be_bytes());
                assert!(body[8..] == data[..], "data read back over TLS");
            }
        }
        // Orderly disconnect: the server closes TLS properly.
        let mut disc = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
        disc.extend_from_slice(&[0, 0, 0, 2]);
        disc.extend_from_slice(&[0; 20]);
        t.write_all(&disc).await.unwrap();
        t.flush().await.unwrap();
        let mut rest = Vec::new();
        let n = t.read_to_end(&mut rest).await.expect("a clean TLS close");
        assert_eq!(n, 0);
    });
    assert!(dev.contents()[4096..4096 + 65536] == pattern(7, 65536)[..]);
}

#[test]
fn forced_tls_closes_a_clear_text_export_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let r = tls_server(&p, true, Arc::new(MemDevice::new(MIB, 4096)));
    let mut c = Raw::connect(r.local_addr());
    assert_eq!(
        c.option(opt::INFO, &info_payload("disk", &[]))[0].kind,
        rep::ERR_TLS_REQD
    );
    c.send_option(opt::EXPORT_NAME, b"disk");
    assert!(
        c.closed(),
        "EXPORT_NAME cannot fail, so the server hangs up"
    );
    // ABORT is still answered.
    let mut c = Raw::connect(r.local_addr());
    assert_eq!(c.option(opt::ABORT, &[])[0].kind, rep::ACK);
    assert!(c.closed());
}

#[test]
fn optional_tls_serves_clear_text_clients_too() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let dev = Arc::new(MemDevice::new(MIB, 4096));
    let r = tls_server(&p, false, dev.clone());
    let mut c = Raw::open(r.local_addr(), "disk");
    assert_eq!(c.write(0, &[1, 2, 3]), 0);
    c.disconnect();
    assert_eq!(&dev.contents()[..3], &[1, 2, 3]);
    // A TLS handshake that fails (the client trusts another CA) costs the
    // server nothing.
    let other = tempfile::tempdir().unwrap();
    let stranger = pki(other.path());
    rt().block_on(async {
        let mut s = TcpStream::connect(r.local_addr()).await.unwrap();
        greet(&mut s).await;
        assert_eq!(option(&mut s, opt::STARTTLS, &[]).await[0].0, rep::ACK);
        let name = ServerName::try_from("localhost").unwrap();
        assert!(connector(&stranger).connect(name, s).await.is_err());
    });
    let mut c = Raw::open(r.local_addr(), "disk");
    assert_eq!(c.read(0, 3), Ok(vec![1, 2, 3]));
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn nbdinfo_and_qemu_over_tls() {
    if !require::programs(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let dev = Arc::new(MemDevice::new(4 * MIB, 4096));
    let r = tls_server(&p, true, dev.clone());
    let port = r.local_addr().port();
    let certs = dir.path().to_str().unwrap();
    let uri = format!("nbds://127.0.0.1:{port}/disk?tls-certificates={certs}");
    let (good, out) = run(&["nbdinfo", "--json", &uri]);
    assert!(good, "{out}");
    assert!(out.contains("\"export-size\": 4194304"), "{out}");
    assert!(out.contains("\"TLS\": true"), "nbdinfo reports TLS: {out}");
    // Without TLS the forced-TLS server refuses.
    let (good, out) = run(&["nbdinfo", &format!("nbd://127.0.0.1:{port}/disk")]);
    assert!(!good, "{out}");
    // qemu with x509 credentials.
    let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={certs}");
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=disk,tls-creds=tls0");
    let (good, out) = run(&[
        "qemu-io",
        "--object",
        &object,
        "--image-opts",
        &image,
        "-c",
        "write -P 0x3c 0 256k",
        "-c",
        "read -P 0x3c 0 256k",
    ]);
    assert!(
        good && !out.contains("Pattern verification failed"),
        "{out}"
    );
    assert!(dev.contents()[..256 << 10].iter().all(|&b| b == 0x3c));
}

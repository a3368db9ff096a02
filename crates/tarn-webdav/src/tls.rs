//! TLS with rustls (ring provider): a PEM certificate and key, or a
//! self-signed certificate generated once with rcgen and kept on disk.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::server::{TlsConfig, WebdavError};

/// File names of the generated certificate and key inside the directory.
pub(crate) const CERT_FILE: &str = "webdav-cert.pem";
/// See [`CERT_FILE`].
pub(crate) const KEY_FILE: &str = "webdav-key.pem";

fn tls_err(what: impl std::fmt::Display) -> WebdavError {
    WebdavError::Tls(what.to_string())
}

/// `AB:CD:...`, the SHA-256 of a DER certificate as browsers show it.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    d.as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn load_pem(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), WebdavError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err(format!("{}: {e}", cert.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(tls_err(format!("{}: no certificate", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| tls_err(format!("{}: {e}", key.display())))?;
    Ok((certs, key))
}

fn generate(dir: &Path, names: &[String]) -> Result<(), WebdavError> {
    let mut names = names.to_vec();
    if names.is_empty() {
        names = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    }
    let ck = rcgen::generate_simple_self_signed(names).map_err(tls_err)?;
    std::fs::create_dir_all(dir)?;
    let key_path = dir.join(KEY_FILE);
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key_path)?;
        f.write_all(ck.key_pair.serialize_pem().as_bytes())?;
        f.sync_all()?;
    }
    let mut f = std::fs::File::create(dir.join(CERT_FILE))?;
    f.write_all(ck.cert.pem().as_bytes())?;
    f.sync_all()?;
    log::warn!(
        "tarn-webdav: generated a self-signed TLS certificate in {}",
        dir.display()
    );
    Ok(())
}

/// The rustls server config and the certificate's SHA-256 fingerprint.
pub(crate) fn server_config(
    cfg: &TlsConfig,
) -> Result<(Arc<rustls::ServerConfig>, String), WebdavError> {
    let (certs, key) = match cfg {
        TlsConfig::Pem { cert, key } => load_pem(cert, key)?,
        TlsConfig::SelfSigned { dir, names } => {
            let (c, k) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
            if !(c.exists() && k.exists()) {
                generate(dir, names)?;
            }
            load_pem(&c, &k)?
        }
    };
    let fp = fingerprint(&certs[0]);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut sc = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(tls_err)?;
    sc.alpn_protocols = vec![b"http/1.1".to_vec()];
    log::info!("tarn-webdav: TLS certificate SHA-256 fingerprint {fp}");
    Ok((Arc::new(sc), fp))
}

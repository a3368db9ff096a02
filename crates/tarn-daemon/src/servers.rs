//! The network front ends the daemon runs: NFSv3, WebDAV, NBD, iSCSI,
//! and the supervised Samba for SMB (`smb`).
//!
//! All serve the shares stored in the pools (see `access`): every share
//! with NFS settings is an export at `/NAME`, every share with WebDAV users
//! is a folder at `/NAME/`, a volume's share is the NBD export `NAME` and
//! the iSCSI target its record names. Whenever shares, users, pools or
//! datasets change, the daemon rebuilds every list from the pools and hands
//! them to the running servers, which swap them in without dropping
//! connections. Each share uses the dataset's one shared filesystem or
//! volume object (`filesystems`).
//!
//! NFS file handles are keyed with a secret kept in the state directory, so
//! they stay valid across daemon restarts. WebDAV speaks plain HTTP only on
//! a loopback address; elsewhere it uses TLS with a certificate given in
//! the options or a self-signed one generated at the first start.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tarn_api::access::{Access, Share};
use tarn_nfs::{Export, IpNet, NfsConfig, NfsServer};
use tarn_webdav::{Authenticator, TlsConfig, WebdavConfig};

use crate::error::{DaemonError, Result};

/// Where the front ends listen; none means not started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerOptions {
    /// NFS (and MOUNT, on the same port).
    pub nfs: Option<SocketAddr>,
    /// WebDAV.
    pub webdav: Option<SocketAddr>,
    /// NBD (volume shares).
    pub nbd: Option<SocketAddr>,
    /// NBD sessions must start TLS (STARTTLS) before anything else; with
    /// it off, TLS is offered and optional.
    pub nbd_tls_required: bool,
    /// iSCSI (volume shares).
    pub iscsi: Option<SocketAddr>,
    /// The replication port (TLS, with the same certificate).
    pub replication: Option<SocketAddr>,
    /// SMB: the address the supervised smbd listens on.
    pub smb: Option<SocketAddr>,
    /// SMB: a file of the owner's own Samba settings, read after tarn's.
    pub smb_include: Option<PathBuf>,
    /// A PEM certificate and key for WebDAV (and NBD) over TLS; a
    /// self-signed pair in the state directory when absent.
    pub tls_cert: Option<(PathBuf, PathBuf)>,
    /// Plain HTTP even off loopback (passwords cross the network in the
    /// clear: only for a trusted network or behind a TLS proxy).
    pub webdav_plain_http: bool,
    /// Where `/metrics` is served (not started when absent).
    pub metrics: Option<SocketAddr>,
    /// Where the HTTPS API is served (not started when absent).
    pub web: Option<SocketAddr>,
    /// The public origin of the API behind a reverse proxy
    /// (`https://nas.example.org`).
    pub web_origin: Option<String>,
    /// The bearer token `/metrics` asks for (required off loopback).
    pub metrics_token: Option<String>,
    /// NFS connection limits and threads.
    pub nfs_limits: NfsLimits,
    /// WebDAV connection limits.
    pub webdav_limits: WebdavLimits,
}

/// The NFS server's limits `tarn daemon` sets; the defaults are tarn-nfs's
/// own ([`NfsConfig::default`]), what each does is said there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfsLimits {
    /// Most connections at once.
    pub max_connections: usize,
    /// Most connections from one client address.
    pub max_connections_per_address: usize,
    /// Idle connections are closed after this long; zero: never.
    pub idle_timeout: Duration,
    /// Requests of one connection processed at once.
    pub max_inflight_per_connection: usize,
    /// Threads running filesystem calls.
    pub workers: usize,
}

impl Default for NfsLimits {
    fn default() -> Self {
        let c = NfsConfig::default();
        NfsLimits {
            max_connections: c.max_connections,
            max_connections_per_address: c.max_connections_per_address,
            idle_timeout: c.idle_timeout,
            max_inflight_per_connection: c.max_inflight_per_connection,
            workers: c.workers,
        }
    }
}

/// The WebDAV server's limits `tarn daemon` sets; the defaults are
/// tarn-webdav's own ([`WebdavConfig::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebdavLimits {
    /// Most connections at once.
    pub max_connections: usize,
    /// Most connections from one client address.
    pub max_connections_per_address: usize,
    /// Time for the TLS handshake, each request head, and between requests.
    pub header_read_timeout: Duration,
}

impl Default for WebdavLimits {
    fn default() -> Self {
        let c = WebdavConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        WebdavLimits {
            max_connections: c.max_connections,
            max_connections_per_address: c.max_connections_per_address,
            header_read_timeout: c.header_read_timeout,
        }
    }
}

/// What the running front ends listen on, for the demo's hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    /// NFS and MOUNT address.
    pub nfs: Option<SocketAddr>,
    /// WebDAV address.
    pub webdav: Option<SocketAddr>,
    /// NBD address.
    #[serde(default)]
    pub nbd: Option<SocketAddr>,
    /// iSCSI address.
    #[serde(default)]
    pub iscsi: Option<SocketAddr>,
    /// True when WebDAV uses TLS.
    pub webdav_tls: bool,
    /// SHA-256 fingerprint of the WebDAV certificate.
    pub tls_fingerprint: Option<String>,
}

/// The running front ends.
#[derive(Default)]
pub struct Servers {
    nfs: Mutex<Option<tarn_nfs::Running>>,
    webdav: Mutex<Option<tarn_webdav::Running>>,
    nbd: Mutex<Option<tarn_nbd::Running>>,
    iscsi: Mutex<Option<tarn_iscsi::Running>>,
    smb: Mutex<Option<crate::smb::Samba>>,
    endpoints: Mutex<Endpoints>,
}

/// A share Samba should serve, before its service mount exists.
pub struct SmbWant {
    /// Share name.
    pub name: String,
    /// The dataset.
    pub dataset: String,
    /// How it is served.
    pub share: tarn_api::access::SmbShare,
    /// The dataset's filesystem.
    pub fs: Arc<crate::filesystems::DatasetFs>,
}

/// What the servers serve: built from every pool's share records.
#[derive(Default)]
pub struct ShareLists {
    /// NFS exports (filesystems).
    pub nfs: Vec<Export>,
    /// WebDAV shares (filesystems).
    pub webdav: Vec<tarn_webdav::Share>,
    /// NBD exports (volumes).
    pub nbd: Vec<tarn_nbd::NbdExport>,
    /// iSCSI targets (volumes).
    pub iscsi: Vec<tarn_iscsi::IscsiTarget>,
    /// SMB shares (filesystems), when SMB runs.
    pub smb: Vec<SmbWant>,
    /// Users with SMB logins, when SMB runs.
    pub smb_users: Vec<crate::smb::SmbUser>,
    /// Why some shares or users are not served over SMB.
    pub smb_problems: Vec<String>,
}

/// The TLS certificate of the node's servers, as WebDAV and NBD use it.
pub(crate) fn tls_config(opts: &ServerOptions, state_dir: &Path) -> TlsConfig {
    match &opts.tls_cert {
        Some((cert, key)) => TlsConfig::Pem {
            cert: cert.clone(),
            key: key.clone(),
        },
        None => TlsConfig::SelfSigned {
            dir: state_dir.join("tls"),
            names: Vec::new(),
        },
    }
}

/// The NFS handle key: 32 random bytes kept in the state directory (0600),
/// so handles stay valid across restarts.
fn handle_key(state_dir: &Path) -> Result<[u8; 32]> {
    let path = state_dir.join("nfs-handle-key");
    let mut key = [0u8; 32];
    match std::fs::File::open(&path) {
        Ok(mut f) => {
            f.read_exact(&mut key)
                .map_err(|e| DaemonError::msg(format!("cannot read {}: {e}", path.display())))?;
            return Ok(key);
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(DaemonError::msg(format!(
                "cannot open {}: {e}",
                path.display()
            )))
        }
        Err(_) => {}
    }
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| DaemonError::msg(format!("cannot read /dev/urandom: {e}")))?;
    crate::pools::write_atomically(&path, &key, 0o600)
        .map_err(|e| DaemonError::msg(format!("cannot write {}: {e}", path.display())))?;
    Ok(key)
}

impl Servers {
    /// Starts the front ends the options ask for, serving `exports` over
    /// NFS and `shares` over WebDAV, with logins checked by `auth`.
    pub fn start(
        &self,
        opts: &ServerOptions,
        state_dir: &Path,
        lists: ShareLists,
        auth: Arc<dyn Authenticator>,
    ) -> Result<()> {
        let ShareLists {
            nfs: exports,
            webdav: shares,
            nbd,
            iscsi,
            ..
        } = lists;
        let mut ep = Endpoints::default();
        if let Some(bind) = opts.nfs {
            let l = opts.nfs_limits;
            let config = NfsConfig {
                bind,
                mount_bind: None,
                handle_key: handle_key(state_dir)?,
                max_connections: l.max_connections,
                max_connections_per_address: l.max_connections_per_address,
                idle_timeout: l.idle_timeout,
                max_inflight_per_connection: l.max_inflight_per_connection,
                workers: l.workers,
                ..NfsConfig::default()
            };
            let running = NfsServer::start(config, exports).map_err(|e| {
                DaemonError::msg(format!("cannot start the NFS server on {bind}: {e}"))
            })?;
            ep.nfs = Some(running.local_addrs().0);
            *self.nfs.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        }
        if let Some(bind) = opts.webdav {
            let mut config = WebdavConfig::new(bind);
            config.max_connections = opts.webdav_limits.max_connections;
            config.max_connections_per_address = opts.webdav_limits.max_connections_per_address;
            config.header_read_timeout = opts.webdav_limits.header_read_timeout;
            if opts.webdav_plain_http {
                config.allow_plain_http_non_loopback = true;
            } else if !bind.ip().is_loopback() {
                config.tls = Some(tls_config(opts, state_dir));
            }
            let tls = config.tls.is_some();
            let running = tarn_webdav::serve(config, shares, auth).map_err(|e| {
                DaemonError::msg(format!("cannot start the WebDAV server on {bind}: {e}"))
            })?;
            ep.webdav = Some(running.local_addr());
            ep.webdav_tls = tls;
            ep.tls_fingerprint = running.tls_fingerprint().map(|f| f.to_string());
            *self.webdav.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        }
        if let Some(bind) = opts.nbd {
            // TLS is offered with the node's certificate; clients that do
            // not ask for it are served in the clear unless it is required.
            let (tls, _) = tarn_webdav::tls_server_config(&tls_config(opts, state_dir))
                .map_err(|e| DaemonError::msg(format!("NBD over TLS: {e}")))?;
            let mut tls = (*tls).clone();
            tls.alpn_protocols.clear();
            let config = tarn_nbd::NbdConfig {
                bind,
                tls: Some(Arc::new(tls)),
                tls_required: opts.nbd_tls_required,
                ..tarn_nbd::NbdConfig::default()
            };
            let running = tarn_nbd::NbdServer::start(config, nbd).map_err(|e| {
                DaemonError::msg(format!("cannot start the NBD server on {bind}: {e}"))
            })?;
            ep.nbd = Some(running.local_addr());
            *self.nbd.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        }
        if let Some(bind) = opts.iscsi {
            let config = tarn_iscsi::IscsiConfig {
                bind,
                ..tarn_iscsi::IscsiConfig::default()
            };
            let running = tarn_iscsi::IscsiServer::start(config, iscsi).map_err(|e| {
                DaemonError::msg(format!("cannot start the iSCSI target on {bind}: {e}"))
            })?;
            ep.iscsi = Some(running.local_addr());
            *self.iscsi.lock().unwrap_or_else(|e| e.into_inner()) = Some(running);
        }
        *self.endpoints.lock().unwrap_or_else(|e| e.into_inner()) = ep;
        Ok(())
    }

    /// Hands fresh share lists to the running servers.
    pub fn update(&self, lists: ShareLists) {
        let ShareLists {
            nfs: exports,
            webdav: shares,
            nbd,
            iscsi,
            ..
        } = lists;
        if let Some(t) = self
            .iscsi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if let Err(e) = t.set_targets(iscsi) {
                log::warn!("tarn: cannot update the iSCSI targets: {e}");
            }
        }
        if let Some(n) = self.nbd.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if let Err(e) = n.set_exports(nbd) {
                log::warn!("tarn: cannot update the NBD exports: {e}");
            }
        }
        if let Some(n) = self.nfs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if let Err(e) = n.set_exports(exports) {
                log::warn!("tarn: cannot update the NFS exports: {e}");
            }
        }
        if let Some(w) = self
            .webdav
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if let Err(e) = w.set_shares(shares) {
                log::warn!("tarn: cannot update the WebDAV shares: {e}");
            }
        }
    }

    /// Starts the supervised smbd on `bind` (serving nothing until
    /// [`Servers::update_smb`]).
    pub fn start_smb(
        &self,
        bind: SocketAddr,
        include: Option<PathBuf>,
        state_dir: &Path,
    ) -> Result<()> {
        let samba = crate::smb::Samba::start(state_dir, bind, include)?;
        *self.smb.lock().unwrap_or_else(|e| e.into_inner()) = Some(samba);
        Ok(())
    }

    /// Where SMB's files go, when SMB runs.
    pub fn smb_layout(&self) -> Option<crate::smb::Layout> {
        self.smb
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.layout().clone())
    }

    /// A closer that disconnects a share's SMB clients, when SMB runs.
    pub fn smb_closer(&self) -> Option<crate::mounts::Closer> {
        self.smb
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.closer())
    }

    /// Hands Samba its shares (already mounted) and users.
    pub fn update_smb(
        &self,
        entries: &[crate::smb::SmbEntry],
        users: &[crate::smb::SmbUser],
        problems: Vec<String>,
    ) {
        if let Some(s) = self.smb.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            s.update(entries, users, problems);
        }
    }

    /// Where the servers listen.
    pub fn endpoints(&self) -> Endpoints {
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection counters of the running servers (`admin` is the
    /// transport's to fill in).
    pub fn stats(&self) -> tarn_api::params::DaemonStats {
        let nfs = self.nfs.lock().unwrap_or_else(|e| e.into_inner());
        let webdav = self.webdav.lock().unwrap_or_else(|e| e.into_inner());
        let nbd = self.nbd.lock().unwrap_or_else(|e| e.into_inner());
        let iscsi = self.iscsi.lock().unwrap_or_else(|e| e.into_inner());
        let smb = self.smb.lock().unwrap_or_else(|e| e.into_inner());
        tarn_api::params::DaemonStats {
            smb: smb.as_ref().map(|s| s.status()),
            iscsi: iscsi
                .as_ref()
                .map(|t| crate::convert::conn_counters(t.stats())),
            nbd: nbd
                .as_ref()
                .map(|n| crate::convert::conn_counters(n.stats())),
            admin: Default::default(),
            nfs: nfs
                .as_ref()
                .map(|n| crate::convert::conn_counters(n.stats())),
            webdav: webdav
                .as_ref()
                .map(|w| crate::convert::conn_counters(w.stats())),
        }
    }

    /// Requests of the file servers since they started: (protocol,
    /// operation, latency, errors).
    pub fn request_stats(&self) -> Vec<(&'static str, &'static str, tarn_stats::Snapshot, u64)> {
        let mut out = Vec::new();
        if let Some(n) = self.nfs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            out.extend(
                n.request_stats()
                    .into_iter()
                    .map(|(op, s, e)| ("nfs", op, s, e)),
            );
        }
        if let Some(w) = self
            .webdav
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            out.extend(
                w.request_stats()
                    .into_iter()
                    .map(|(op, s, e)| ("webdav", op, s, e)),
            );
        }
        out
    }

    /// Stops every server (daemon shutdown).
    pub fn stop(&self) {
        if let Some(s) = self.smb.lock().unwrap_or_else(|e| e.into_inner()).take() {
            s.stop();
        }
        if let Some(t) = self.iscsi.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.stop();
        }
        if let Some(n) = self.nbd.lock().unwrap_or_else(|e| e.into_inner()).take() {
            n.stop();
        }
        if let Some(n) = self.nfs.lock().unwrap_or_else(|e| e.into_inner()).take() {
            n.stop();
        }
        if let Some(w) = self.webdav.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.stop();
        }
    }
}

/// Client networks of a share record, leaving out (and logging) any that
/// do not parse.
fn networks(share: &str, list: &[String]) -> Vec<IpNet> {
    list.iter()
        .filter_map(|c| match c.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                log::warn!("tarn: share '{share}': ignoring bad network {c}");
                None
            }
        })
        .collect()
}

/// The NBD export of a stored share of a volume.
pub fn nbd_entry(vol: Arc<tarn_vol::Volume>, share: &Share) -> Option<tarn_nbd::NbdExport> {
    share.nbd.as_ref().map(|n| {
        let mut e = tarn_nbd::NbdExport::new(share.name.clone(), vol);
        e.description = Some(share.dataset.clone());
        e.read_only = n.read_only;
        e.clients = networks(&share.name, &n.clients);
        e
    })
}

/// The iSCSI target `i` of a stored share of a volume, its CHAP secrets
/// looked up in `users`; an error says why it cannot be served (a user or
/// a secret gone since the share was stored, a record that fails the
/// target's checks).
pub fn iscsi_entry(
    vol: Arc<tarn_vol::Volume>,
    share: &Share,
    i: &tarn_api::access::IscsiShare,
    users: &[crate::access::UserRecord],
) -> std::result::Result<tarn_iscsi::IscsiTarget, String> {
    let chap = |u: &Option<String>| -> std::result::Result<Option<tarn_iscsi::Chap>, String> {
        let Some(u) = u else { return Ok(None) };
        users
            .iter()
            .find(|r| &r.name == u)
            .and_then(|r| r.chap_secret.clone())
            .map(|secret| Some(tarn_iscsi::Chap::new(u.clone(), secret)))
            .ok_or_else(|| format!("user '{u}' or their CHAP secret is gone"))
    };
    not_open_to_all(i)?;
    let mut t = tarn_iscsi::IscsiTarget::new(i.iqn.clone(), vol);
    t.alias = Some(share.name.clone());
    t.read_only = i.read_only;
    t.chap = chap(&i.chap)?;
    t.mutual_chap = chap(&i.mutual_chap)?;
    t.initiators = i.initiators.clone();
    // No client networks (CHAP required, above): any address may try.
    if !i.clients.is_empty() {
        t.clients = networks(&share.name, &i.clients);
    }
    t.check().map_err(|e| e.to_string())?;
    Ok(t)
}

/// Refuses a stored iSCSI share with neither client networks nor CHAP:
/// checked when a share is added, and again when it is served, because
/// a pool's records may have been written elsewhere (another machine, by
/// hand), and such a target would be open to every network, without a
/// login.
fn not_open_to_all(i: &tarn_api::access::IscsiShare) -> std::result::Result<(), String> {
    if i.clients.is_empty() && i.chap.is_none() {
        return Err(
            "it has neither client networks nor CHAP, and would be open to every network".into(),
        );
    }
    Ok(())
}

/// The NFS export and the WebDAV share of one stored share.
pub fn share_entries(
    fs: Arc<crate::filesystems::DatasetFs>,
    share: &Share,
) -> (Option<Export>, Option<tarn_webdav::Share>) {
    let export = share.nfs.as_ref().map(|n| {
        let clients = networks(&share.name, &n.clients);
        let mut e = Export::new(format!("/{}", share.name), fs.clone(), clients);
        e.read_only = n.read_only;
        e.root_squash = n.root_squash;
        e.all_squash = n.all_squash;
        e.anon_uid = n.anon_uid;
        e.anon_gid = n.anon_gid;
        e
    });
    let dav = share.webdav.as_ref().map(|w| {
        let mut s = tarn_webdav::Share::new(share.name.clone(), fs.clone());
        // Its users are the users of the pool that stores it.
        s.realm = share.dataset.split('/').next().map(str::to_string);
        s.users = Some(
            w.users
                .iter()
                .map(|(u, a)| (u.clone(), *a == Access::Rw))
                .collect(),
        );
        s
    });
    (export, dav)
}

#[cfg(test)]
mod tests {
    use super::{handle_key, not_open_to_all};
    use std::os::unix::fs::PermissionsExt;

    /// A stored iSCSI share is served only with client networks or CHAP.
    #[test]
    fn a_stored_iscsi_share_open_to_every_network_is_not_served() {
        let json = |extra: &str| {
            serde_json::from_str::<tarn_api::access::IscsiShare>(&format!(
                r#"{{"iqn": "iqn.2024-01.org.tarn:vm"{extra}}}"#
            ))
            .unwrap()
        };
        assert!(not_open_to_all(&json("")).is_err());
        assert!(not_open_to_all(&json(r#", "initiators": ["iqn.x:y"]"#)).is_err());
        assert!(not_open_to_all(&json(r#", "clients": ["10.0.0.0/8"]"#)).is_ok());
        assert!(not_open_to_all(&json(r#", "chap": "alice""#)).is_ok());
    }

    #[test]
    fn the_handle_key_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = handle_key(dir.path()).unwrap();
        let b = handle_key(dir.path()).unwrap();
        assert_eq!(a, b, "restarts must see the same key");
        assert_ne!(a, [0u8; 32]);
        let mode = std::fs::metadata(dir.path().join("nfs-handle-key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            handle_key(other.path()).unwrap(),
            a,
            "random per state directory"
        );
        std::fs::write(dir.path().join("nfs-handle-key"), b"short").unwrap();
        assert!(
            handle_key(dir.path()).is_err(),
            "a damaged key is an error, not a new key"
        );
    }
}

//! `tarn daemon` and `tarn demo`: their arguments, the plain options the
//! binary runs them with, where the socket and the state live by default,
//! and the client side of `tarn daemon stop|ping|stats`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use tarn_api::method;
use tarn_api::params::{DaemonStats, NoParams, PingResult};

use crate::render;
use crate::session::{decode, Out, Session};

/// `tarn demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Folder for the demo's member files, socket and state
    #[arg(long, default_value = "tarn-demo", value_name = "DIR")]
    pub dir: PathBuf,
    /// Size of each member file (sparse: it takes only what is written)
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub size_mib: u64,
    /// NFS (and MOUNT) port on 127.0.0.1; 0 picks a free one
    #[arg(long, default_value_t = 20490, value_name = "PORT")]
    pub nfs_port: u16,
    /// WebDAV port on 127.0.0.1; 0 picks a free one
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    pub webdav_port: u16,
    /// NBD port on 127.0.0.1 (the demo's volume); 0 picks a free one
    #[arg(long, default_value_t = 10809, value_name = "PORT")]
    pub nbd_port: u16,
}

/// `tarn daemon`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DaemonArgs {
    /// Read settings from this TOML file (docs/config.md); flags given
    /// here override it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// What the daemon logs (to standard error, or the journal under
    /// systemd): error, warn, info or debug
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug"])]
    pub log_level: Option<String>,

    /// Where the daemon keeps its state [default: /var/lib/tarn for root,
    /// else $XDG_STATE_HOME/tarn or ~/.local/state/tarn]
    #[arg(long, env = "TARN_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Seconds between transaction group commits while anything is dirty
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=300))]
    pub txg_interval: Option<u64>,

    /// Dirty data a pool may hold before writers wait, in MiB (16 to
    /// 65536); 0 means a tenth of the memory, 256 MiB to 4 GiB
    #[arg(long, value_name = "MIB", value_parser = parse_dirty_max_mib)]
    pub dirty_max_mib: Option<u64>,

    /// Block cache (verified data and metadata, shared by all pools), in
    /// MiB; 0 means an eighth of the memory, at least 256 MiB
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub cache_mib: Option<u64>,

    /// Threads serving each FUSE mount's requests (the deepest queue of
    /// requests a mount keeps busy at once)
    // The bound is the FUSE layer's MAX_THREADS (a test checks they agree).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub fuse_threads: Option<u64>,

    /// Serve the shares over NFSv3 (and MOUNT, same port) on this address,
    /// e.g. 0.0.0.0:2049
    #[arg(long, value_name = "ADDR:PORT")]
    pub nfs: Option<std::net::SocketAddr>,

    /// Serve the shares over WebDAV on this address, e.g. 0.0.0.0:8443;
    /// HTTPS except on a loopback address
    #[arg(long, value_name = "ADDR:PORT")]
    pub webdav: Option<std::net::SocketAddr>,

    /// Serve the volume shares over NBD on this address, e.g.
    /// 0.0.0.0:10809 (TLS offered with the WebDAV certificate)
    #[arg(long, value_name = "ADDR:PORT")]
    pub nbd: Option<std::net::SocketAddr>,

    /// NBD clients must start TLS before anything else (`=false` turns off
    /// what a configuration file turned on)
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub nbd_tls_required: bool,

    /// Serve the volume shares over iSCSI on this address, e.g.
    /// 0.0.0.0:3260 (iSCSI's port)
    #[arg(long, value_name = "ADDR:PORT")]
    pub iscsi: Option<std::net::SocketAddr>,

    /// Take snapshots from other tarns (`tarn replicate --to tarn://`) on
    /// this address over TLS, e.g. 0.0.0.0:7450; senders need a token
    /// (`tarn replication token add`)
    #[arg(long, value_name = "ADDR:PORT")]
    pub replication: Option<std::net::SocketAddr>,

    /// Serve the SMB shares (Windows, macOS, Time Machine) on this
    /// address, e.g. 0.0.0.0:445, through a Samba smbd that tarn
    /// configures and supervises (needs root and Debian's samba)
    #[arg(long, value_name = "ADDR:PORT")]
    pub smb: Option<std::net::SocketAddr>,

    /// Serve the admin API over HTTPS for the web page and scripts on this
    /// address, e.g. 0.0.0.0:8444 (plain HTTP on a loopback address;
    /// docs/api.md)
    #[arg(long, value_name = "ADDR:PORT")]
    pub web: Option<std::net::SocketAddr>,

    /// The API's public origin when a reverse proxy serves it, e.g.
    /// https://nas.example.org: the only Origin browsers may send
    #[arg(long, value_name = "URL")]
    pub web_origin: Option<String>,

    /// Serve the daemon's counters for Prometheus at
    /// http://ADDR:PORT/metrics, e.g. 127.0.0.1:9470 (off loopback only
    /// with --metrics-token-file)
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,

    /// A file holding the bearer token scrapers must send to /metrics
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,

    /// A file of your own Samba settings (smb.conf syntax, starting with a
    /// section header), read after everything tarn writes: for settings
    /// tarn does not manage, or shares of other directories
    #[arg(long, value_name = "FILE")]
    pub smb_include: Option<PathBuf>,

    /// PEM certificate for WebDAV over HTTPS and NBD over TLS [default: a
    /// self-signed one generated in the state directory]
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Serve WebDAV over plain HTTP even off loopback: passwords then cross
    /// the network in the clear (a trusted LAN, or behind a TLS proxy);
    /// `=false` turns off what a configuration file turned on
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub webdav_plain_http: bool,

    /// Connection limits and timeouts (see docs/security.md).
    #[command(flatten)]
    pub limits: LimitArgs,

    /// Talk to a running daemon instead of starting one.
    #[command(subcommand)]
    pub action: Option<DaemonAction>,
}

/// `tarn daemon`'s connection limits and timeouts. Each is `None` unless
/// given: the daemon then uses its own default (the one `--help` shows,
/// taken from the code that enforces it). Their names, with `_` for `-`,
/// are their keys under `[limits]` in the configuration file.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "Connection limits")]
pub struct LimitArgs {
    /// Admin socket: most connections at once; at the limit the one idle
    /// the longest is closed for a newcomer
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub admin_max_connections: Option<u64>,

    /// Admin socket: close a connection after this many seconds without a
    /// request; 0: never
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub admin_idle_timeout: Option<u64>,

    /// Admin socket: a request line must arrive whole within this many
    /// seconds of its first byte
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub admin_request_timeout: Option<u64>,

    /// NFS: most connections at once; at the limit an idle one of the
    /// address holding the most is closed for a newcomer
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub nfs_max_connections: Option<u64>,

    /// NFS: most connections from one client address
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub nfs_max_connections_per_address: Option<u64>,

    /// NFS: close a connection after this many seconds without a request
    /// in progress (clients reconnect by themselves); 0: never
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub nfs_idle_timeout: Option<u64>,

    /// NFS: most requests of one connection processed at once (each holds
    /// up to 1 MiB); the connection is not read further meanwhile
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub nfs_max_inflight_per_connection: Option<u64>,

    /// NFS: threads running filesystem calls
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub nfs_workers: Option<u64>,

    /// WebDAV: most connections at once; at the limit an idle one of the
    /// address holding the most is closed for a newcomer
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub webdav_max_connections: Option<u64>,

    /// WebDAV: most connections from one client address (clients behind
    /// one NAT address share it)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub webdav_max_connections_per_address: Option<u64>,

    /// WebDAV: seconds a client has for the TLS handshake, for each request
    /// head, and between requests on a kept-alive connection
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub webdav_header_timeout: Option<u64>,
}

/// `tarn daemon stop|ping|stats`.
#[derive(Subcommand, Debug)]
pub enum DaemonAction {
    /// Export every pool and stop the daemon; returns once it has
    Stop,
    /// Check that a daemon answers, and show its version and pid
    Ping,
    /// Show how often connection limits tripped: refused, evicted and
    /// timed-out connections of the admin socket, NFS, WebDAV, NBD and
    /// iSCSI, and the state of smbd
    Stats,
}

/// How to run the daemon, as `tarn daemon` was asked: plain data the binary
/// hands to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonRun {
    /// Path of the admin socket.
    pub socket: PathBuf,
    /// error, warn, info or debug.
    pub log_level: String,
    /// Where the daemon keeps its state.
    pub state_dir: PathBuf,
    /// Seconds between transaction group commits while anything is
    /// dirty; `None`: the daemon's default.
    pub txg_interval_secs: Option<u64>,
    /// Dirty data a pool may hold before writers wait, in MiB (0: a tenth
    /// of memory); `None`: the daemon's default.
    pub dirty_max_mib: Option<u64>,
    /// Block cache shared by all pools, in MiB (0: an eighth of memory);
    /// `None`: the daemon's default.
    pub cache_mib: Option<u64>,
    /// Threads serving each FUSE mount; `None`: the daemon's default.
    pub fuse_threads: Option<u64>,
    /// Connection limits and timeouts given on the command line.
    pub limits: LimitArgs,
    /// Where NFS (and MOUNT) listen; not started when absent.
    pub nfs: Option<SocketAddr>,
    /// Where WebDAV listens; not started when absent.
    pub webdav: Option<SocketAddr>,
    /// Where NBD listens; not started when absent.
    pub nbd: Option<SocketAddr>,
    /// NBD clients must start TLS first.
    pub nbd_tls_required: bool,
    /// Where iSCSI listens; not started when absent.
    pub iscsi: Option<SocketAddr>,
    /// Where the replication port listens; not started when absent.
    pub replication: Option<SocketAddr>,
    /// Where the supervised smbd listens; not started when absent.
    pub smb: Option<SocketAddr>,
    /// The owner's own Samba settings.
    pub smb_include: Option<PathBuf>,
    /// Where the HTTPS API is served; not started when absent.
    pub web: Option<SocketAddr>,
    /// The API's public origin behind a reverse proxy.
    pub web_origin: Option<String>,
    /// Where `/metrics` is served; not started when absent.
    pub metrics: Option<SocketAddr>,
    /// The bearer token `/metrics` asks for.
    pub metrics_token: Option<String>,
    /// A PEM certificate and key for WebDAV over TLS.
    pub tls_cert: Option<(PathBuf, PathBuf)>,
    /// Plain HTTP for WebDAV even off loopback.
    pub webdav_plain_http: bool,
}

/// How to run the demo, as `tarn demo` was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoRun {
    /// Folder for the demo's member files, socket and state.
    pub dir: PathBuf,
    /// Size of each member file in MiB.
    pub size_mib: u64,
    /// NFS (and MOUNT) port on 127.0.0.1; 0 picks a free one.
    pub nfs_port: u16,
    /// WebDAV port on 127.0.0.1; 0 picks a free one.
    pub webdav_port: u16,
    /// NBD port on 127.0.0.1; 0 picks a free one.
    pub nbd_port: u16,
}

impl From<DemoArgs> for DemoRun {
    fn from(a: DemoArgs) -> DemoRun {
        DemoRun {
            dir: a.dir,
            size_mib: a.size_mib,
            nfs_port: a.nfs_port,
            webdav_port: a.webdav_port,
            nbd_port: a.nbd_port,
        }
    }
}

/// Reads a token file: one line, at least 16 characters, readable by its
/// owner only.
fn read_token(f: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(f).with_context(|| format!("cannot read {}", f.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        anyhow::bail!(
            "{} holds a token but others may read it: chmod 600 {}",
            f.display(),
            f.display()
        );
    }
    let t = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
    let t = t.trim().to_string();
    if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!(
            "{}: a token is one line of at least 16 characters without spaces",
            f.display()
        );
    }
    Ok(t)
}

/// The dirty limits per pool a user may set, in MiB (0 aside: the default).
const DIRTY_MAX_MIB: std::ops::RangeInclusive<u64> = 16..=65536;

/// `--dirty-max-mib`: 0 (the memory-scaled default) or within
/// [`DIRTY_MAX_MIB`].
fn parse_dirty_max_mib(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(n) if n == 0 || DIRTY_MAX_MIB.contains(&n) => Ok(n),
        Ok(n) => Err(format!(
            "{n} is not 0 (a tenth of the memory) or in {}..={}",
            DIRTY_MAX_MIB.start(),
            DIRTY_MAX_MIB.end()
        )),
        Err(e) => Err(format!("not a number of MiB: {e}")),
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn non_empty_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The socket path used when neither `--socket` nor `TARN_SOCKET` is given:
/// `/run/tarn/tarn.sock` for root (where the service's daemon listens,
/// whatever a login shell's `XDG_RUNTIME_DIR` says), else
/// `$XDG_RUNTIME_DIR/tarn/tarn.sock`, else `/tmp/tarn-$UID/tarn.sock`.
pub fn default_socket_path() -> PathBuf {
    if euid() == 0 {
        return PathBuf::from("/run/tarn/tarn.sock");
    }
    if let Some(dir) = non_empty_env("XDG_RUNTIME_DIR") {
        return dir.join("tarn").join("tarn.sock");
    }
    PathBuf::from(format!("/tmp/tarn-{}/tarn.sock", euid()))
}

/// The state directory used when `--state-dir` is not given:
/// `/var/lib/tarn` for root, else `$XDG_STATE_HOME/tarn`, else
/// `~/.local/state/tarn`.
pub fn default_state_dir() -> PathBuf {
    if euid() == 0 {
        return PathBuf::from("/var/lib/tarn");
    }
    if let Some(dir) = non_empty_env("XDG_STATE_HOME") {
        return dir.join("tarn");
    }
    match non_empty_env("HOME") {
        Some(home) => home.join(".local/state/tarn"),
        None => PathBuf::from(format!("/tmp/tarn-{}/state", euid())),
    }
}

/// `tarn daemon [stop|ping|stats]`: stops, pings or asks a running daemon
/// for its counters, or (with no action) answers the options to run one
/// with.
pub(crate) fn daemon_command(
    client: &mut Session,
    out: &Out,
    args: DaemonArgs,
) -> anyhow::Result<Option<DaemonRun>> {
    let DaemonArgs {
        config: _,
        log_level,
        state_dir,
        action,
        txg_interval,
        dirty_max_mib,
        cache_mib,
        fuse_threads,
        nfs,
        webdav,
        nbd,
        nbd_tls_required,
        iscsi,
        replication,
        smb,
        smb_include,
        web,
        web_origin,
        metrics,
        metrics_token_file,
        tls_cert,
        tls_key,
        webdav_plain_http,
        limits,
    } = args;
    match action {
        None => {
            // What goes together, checked on the flags and the
            // configuration file's settings at once (a flag and a key of
            // the file may each give half).
            let pairs = [
                (
                    tls_cert.is_some(),
                    tls_key.is_some(),
                    "--tls-cert and --tls-key go together",
                ),
                (
                    tls_key.is_some(),
                    tls_cert.is_some(),
                    "--tls-cert and --tls-key go together",
                ),
                (
                    smb_include.is_some(),
                    smb.is_some(),
                    "--smb-include needs --smb",
                ),
                (
                    nbd_tls_required,
                    nbd.is_some(),
                    "--nbd-tls-required needs --nbd",
                ),
                (
                    metrics_token_file.is_some(),
                    metrics.is_some(),
                    "--metrics-token-file needs --metrics",
                ),
            ];
            for (a, b, why) in pairs {
                if a && !b {
                    anyhow::bail!("{why} (from the command line or the configuration file)");
                }
            }
            if let Some(o) = &web_origin {
                let rest = o
                    .strip_prefix("https://")
                    .or_else(|| o.strip_prefix("http://"));
                if web.is_none() {
                    anyhow::bail!("--web-origin needs --web");
                }
                if rest.is_none_or(|r| r.is_empty() || r.trim_end_matches('/').contains('/')) {
                    anyhow::bail!("--web-origin {o}: an origin, like https://nas.example.org");
                }
            }
            if webdav_plain_http && tls_cert.is_some() {
                anyhow::bail!(
                    "--webdav-plain-http and a certificate (--tls-cert) contradict each other \
                     (from the command line or the configuration file); \
                     --webdav-plain-http=false turns it off"
                );
            }
            return Ok(Some(DaemonRun {
                socket: client.path.clone(),
                log_level: log_level.unwrap_or_else(|| "info".to_string()),
                state_dir: state_dir.unwrap_or_else(default_state_dir),
                txg_interval_secs: txg_interval,
                dirty_max_mib,
                cache_mib,
                fuse_threads,
                limits,
                nfs,
                webdav,
                nbd,
                nbd_tls_required,
                iscsi,
                replication,
                smb,
                smb_include: smb_include.map(|p| std::path::absolute(&p).unwrap_or(p)),
                web,
                web_origin,
                metrics,
                metrics_token: metrics_token_file.map(|f| read_token(&f)).transpose()?,
                tls_cert: tls_cert.zip(tls_key),
                webdav_plain_http,
            }));
        }
        Some(DaemonAction::Stop) => {
            client.call_quietly(out, method::DAEMON_STOP, &NoParams {})?;
        }
        Some(DaemonAction::Ping) => {
            let v = client.call(method::DAEMON_PING, &NoParams {})?;
            let ping: PingResult = decode(method::DAEMON_PING, v.clone())?;
            out.raw_or(&v, || {
                format!(
                    "tarn daemon {} (pid {}) is listening on {}\n",
                    ping.version,
                    ping.pid,
                    client.path.display()
                )
            })?;
        }
        Some(DaemonAction::Stats) => {
            let v = client.call(method::DAEMON_STATS, &NoParams {})?;
            let stats: DaemonStats = decode(method::DAEMON_STATS, v.clone())?;
            out.raw_or(&v, || render::render_daemon_stats(&stats))?;
        }
    }
    Ok(None)
}

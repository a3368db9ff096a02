//! `tarn daemon` and `tarn demo`: their arguments, the plain options the
//! binary runs them with, where the socket and the state live by default,
//! and the client side of `tarn daemon stop|ping`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use tarn_api::method;
use tarn_api::params::{NoParams, PingResult};

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
}

/// `tarn daemon`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DaemonArgs {
    /// Where the daemon keeps its state [default: /var/lib/tarn for root,
    /// else $XDG_STATE_HOME/tarn or ~/.local/state/tarn]
    #[arg(long, env = "TARN_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Seconds between transaction group commits while anything is dirty
    #[arg(long, value_name = "SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub txg_interval: u64,

    /// Dirty data a pool may hold before writers wait, in MiB
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=65536))]
    pub dirty_max_mib: u64,

    /// Block cache (verified data and metadata, shared by all pools), in
    /// MiB; 0 means an eighth of the memory, at least 256 MiB
    #[arg(long, value_name = "MIB", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1048576))]
    pub cache_mib: u64,

    /// Serve the shares over NFSv3 (and MOUNT, same port) on this address,
    /// e.g. 0.0.0.0:2049
    #[arg(long, value_name = "ADDR:PORT")]
    pub nfs: Option<std::net::SocketAddr>,

    /// Serve the shares over WebDAV on this address, e.g. 0.0.0.0:8443;
    /// HTTPS except on a loopback address
    #[arg(long, value_name = "ADDR:PORT")]
    pub webdav: Option<std::net::SocketAddr>,

    /// PEM certificate for WebDAV over HTTPS [default: a self-signed one
    /// generated in the state directory]
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Serve WebDAV over plain HTTP even off loopback: passwords then cross
    /// the network in the clear (a trusted LAN, or behind a TLS proxy)
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub webdav_plain_http: bool,

    /// Talk to a running daemon instead of starting one.
    #[command(subcommand)]
    pub action: Option<DaemonAction>,
}

/// `tarn daemon stop|ping`.
#[derive(Subcommand, Debug)]
pub enum DaemonAction {
    /// Export every pool and stop the daemon; returns once it has
    Stop,
    /// Check that a daemon answers, and show its version and pid
    Ping,
}

/// How to run the daemon, as `tarn daemon` was asked: plain data the binary
/// hands to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonRun {
    /// Path of the admin socket.
    pub socket: PathBuf,
    /// Where the daemon keeps its state.
    pub state_dir: PathBuf,
    /// Seconds between transaction group commits while anything is dirty.
    pub txg_interval_secs: u64,
    /// Dirty data a pool may hold before writers wait, in MiB.
    pub dirty_max_mib: u64,
    /// Block cache shared by all pools, in MiB; 0 for the default.
    pub cache_mib: u64,
    /// Where NFS (and MOUNT) listen; not started when absent.
    pub nfs: Option<SocketAddr>,
    /// Where WebDAV listens; not started when absent.
    pub webdav: Option<SocketAddr>,
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
}

impl From<DemoArgs> for DemoRun {
    fn from(a: DemoArgs) -> DemoRun {
        DemoRun {
            dir: a.dir,
            size_mib: a.size_mib,
            nfs_port: a.nfs_port,
            webdav_port: a.webdav_port,
        }
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
/// `$XDG_RUNTIME_DIR/tarn/tarn.sock`, else `/run/tarn/tarn.sock` for root,
/// else `/tmp/tarn-$UID/tarn.sock`.
pub fn default_socket_path() -> PathBuf {
    if let Some(dir) = non_empty_env("XDG_RUNTIME_DIR") {
        return dir.join("tarn").join("tarn.sock");
    }
    match euid() {
        0 => PathBuf::from("/run/tarn/tarn.sock"),
        uid => PathBuf::from(format!("/tmp/tarn-{uid}/tarn.sock")),
    }
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

/// `tarn daemon [stop|ping]`: stops or pings a running daemon, or (with no
/// action) answers the options to run one with.
pub(crate) fn daemon_command(
    client: &mut Session,
    out: &Out,
    args: DaemonArgs,
) -> anyhow::Result<Option<DaemonRun>> {
    let DaemonArgs {
        state_dir,
        action,
        txg_interval,
        dirty_max_mib,
        cache_mib,
        nfs,
        webdav,
        tls_cert,
        tls_key,
        webdav_plain_http,
    } = args;
    match action {
        None => {
            return Ok(Some(DaemonRun {
                socket: client.path.clone(),
                state_dir: state_dir.unwrap_or_else(default_state_dir),
                txg_interval_secs: txg_interval,
                dirty_max_mib,
                cache_mib,
                nfs,
                webdav,
                tls_cert: tls_cert.zip(tls_key),
                webdav_plain_http,
            }))
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
    }
    Ok(None)
}

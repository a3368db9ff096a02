//! The command line: parsing with clap, and one function per command that
//! sends its request and prints the answer.
//!
//! Commands stay thin: everything they do is an API call, so the web page can
//! do the same. The client turns relative paths into absolute ones (the
//! daemon has its own working directory) and checks what it can before
//! sending (vdev words, property syntax). `-o json` prints each raw result.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand};
use serde_json::Value;

use crate::api::{
    method, AddLogParams, ClearParams, CloneParams, DatasetCreateParams, DatasetDestroyParams,
    DatasetGetParams, DatasetInheritParams, DatasetListParams, DatasetRenameParams,
    DatasetSetParams, DeviceParams, ForceParams, InjectParams, MountParams, NameParams, NoParams,
    ObjectParams, ObjectReadParams, ObjectWriteParams, OptionalNameParams, PingResult, PoolParams,
    ReplaceParams, RollbackParams, ScrubParams, ShareAddParams, ShareDelParams, SnapshotParams,
    SyncResult, UnmountParams, UserAddParams, UserParams, UserPasswdParams,
};
use crate::backend::{
    Backend, CreateRequest, DatasetInfo, DatasetKind, ImportRequest, ImportResult, MountInfo,
    ObjectInfo, PropValue, ScrubAction, Share, ShareInfo, UserInfo, VdevKind, VdevSpec,
};
use crate::client::Client;
use crate::daemon::{default_socket_path, default_state_dir, run_daemon, DaemonOptions};
use crate::render;
use crate::status::{IostatEntry, PoolListEntry, PoolStatus, ScanKind, ScanState, ScanStatus};

/// tarn: a self-healing storage pool server.
#[derive(Parser, Debug)]
#[command(name = "tarn", version, max_term_width = 100)]
pub struct Cli {
    /// Admin socket of the daemon [default: $XDG_RUNTIME_DIR/tarn/tarn.sock,
    /// /run/tarn/tarn.sock for root, else /tmp/tarn-$UID/tarn.sock]
    #[arg(long, global = true, env = "TARN_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Output format, `human` or `json`; with `pool create`, also pool
    /// properties such as `-o ashift=12`
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_name = "FORMAT|PROP=VALUE",
        value_parser = parse_output_opt
    )]
    pub output: Vec<OutputOpt>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the process's arguments; on a usage error prints it and exits
    /// with status 2, as clap does.
    pub fn parse_args() -> Cli {
        Cli::try_parse_checked(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `args` (program name first) like clap's `try_parse_from`, and
    /// also refuses `-o` given at several levels of the command: clap keeps
    /// only the innermost level's values, and silently losing `-o ashift=12`
    /// or `-o json` is worse than asking the user to move them.
    pub fn try_parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let cli = Cli::try_parse_from(&args)?;
        let given = args
            .iter()
            .skip(1)
            .take_while(|a| *a != "--")
            .filter(|a| is_output_flag(a))
            .count();
        if given > cli.output.len() {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "-o is given both before and after a subcommand; put every -o after the last \
                 subcommand, e.g. `tarn pool create -o json -o ashift=12 tank ...`",
            ));
        }
        Ok(cli)
    }
}

fn is_output_flag(arg: &OsString) -> bool {
    let Some(a) = arg.to_str() else {
        return false;
    };
    a == "--output" || a.starts_with("--output=") || (a.starts_with("-o") && !a.starts_with("--"))
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Tables and trees like the `zpool` commands.
    Human,
    /// The raw result of each API call, pretty-printed.
    Json,
}

/// A value of `-o`: an output format, or a pool property for `pool create`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputOpt {
    /// `-o human` / `-o json`.
    Format(Format),
    /// `-o NAME=VALUE`.
    Property(String, String),
}

fn parse_output_opt(s: &str) -> Result<OutputOpt, String> {
    match s {
        "human" => Ok(OutputOpt::Format(Format::Human)),
        "json" => Ok(OutputOpt::Format(Format::Json)),
        _ => match s.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok(OutputOpt::Property(k.into(), v.into())),
            _ => Err(format!(
                "expected `human`, `json`, or (with `pool create`) PROP=VALUE, got {s:?}"
            )),
        },
    }
}

/// Top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon in the foreground (use a service manager to keep it
    /// running), or talk to a running one
    Daemon(DaemonArgs),
    /// Create, import, inspect and repair pools
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Raw named objects in a pool (for drills, tests and benchmarks)
    #[command(subcommand)]
    Object(ObjectCommand),
    /// Filesystems in pools: create, list, properties, rename, destroy
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Take snapshots, atomically: `tarn snapshot -r tank/home@monday`
    Snapshot {
        /// Also snapshot every filesystem below each one named
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Snapshot names, `FILESYSTEM@NAME`
        #[arg(required = true, value_name = "FS@NAME")]
        names: Vec<String>,
    },
    /// Return a filesystem to a snapshot, discarding later changes
    Rollback {
        /// Destroy snapshots newer than this one first
        #[arg(short = 'r', long)]
        recursive: bool,
        /// The snapshot, `FILESYSTEM@NAME`
        snapshot: String,
    },
    /// Make a new filesystem from a snapshot (`-o PROP=VALUE` sets properties)
    Clone {
        /// The origin snapshot
        snapshot: String,
        /// The new filesystem
        name: String,
    },
    /// Destroy a filesystem, a snapshot, or a range `fs@first%last`
    Destroy {
        /// Also destroy descendants and snapshots
        #[arg(short = 'r', long)]
        recursive: bool,
        /// What to destroy
        name: String,
    },
    /// Users who reach shares over WebDAV (stored in the pool)
    #[command(subcommand)]
    User(UserCommand),
    /// Shares: a dataset exported over NFS and/or WebDAV (stored in the pool)
    #[command(subcommand)]
    Share(ShareCommand),
    /// Mount a dataset with FUSE (no arguments: list the mounts)
    Mount {
        /// Let other users use the mount (off by default)
        #[arg(long)]
        allow_other: bool,
        /// Mount read-only
        #[arg(long)]
        read_only: bool,
        /// Dataset or snapshot
        name: Option<String>,
        /// Directory to mount on [default: the dataset's mountpoint property]
        mountpoint: Option<PathBuf>,
    },
    /// Unmount a dataset, by name or by directory
    Unmount {
        /// Dataset name or mountpoint
        name: String,
    },
    /// Try tarn: a raidz1 pool of four sparse files under ./tarn-demo, served
    /// by a daemon in the foreground until Ctrl-C
    Demo(DemoArgs),
}

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

/// `tarn pool ...`.
#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a pool: `tarn pool create tank mirror /dev/sdb /dev/sdc`
    Create {
        /// Property of the pool's data, e.g. -O compression=lz4 -O checksum=xxh3
        #[arg(short = 'O', value_name = "PROP=VALUE")]
        properties: Vec<String>,
        /// Use devices even if they seem to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Name of the new pool
        name: String,
        /// Devices, grouped by `mirror`, `raidz1` (or `raidz`), `raidz2`,
        /// `raidz3`; plain devices before any group are single vdevs
        #[arg(required = true, value_name = "VDEV")]
        vdevs: Vec<String>,
    },
    /// Import a pool, or list the pools that can be imported
    Import {
        /// Directory (or device) to search; repeatable
        #[arg(short = 'd', long = "dir", value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Import even if the pool may be in use elsewhere
        #[arg(short, long)]
        force: bool,
        /// Import even though the intent log cannot be read or replayed
        /// in full (a missing log device, device errors), keeping what
        /// precedes the damage
        #[arg(long)]
        discard_log: bool,
        /// Pool to import, by name or id; omit to list candidates
        pool: Option<String>,
        /// Import under this name instead
        new_name: Option<String>,
    },
    /// Commit and release a pool so it can be moved
    Export {
        /// Export even if the pool is busy
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
    },
    /// Destroy a pool and everything in it
    Destroy {
        /// Destroy even if the pool is busy
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
    },
    /// List pools with size, use and health
    List,
    /// Health, scan progress, device tree and errors of pools
    Status {
        /// Show only pools that need attention
        #[arg(short = 'x')]
        unhealthy: bool,
        /// Pool name; all pools when omitted
        pool: Option<String>,
    },
    /// Start, pause, resume or cancel a scrub
    Scrub {
        /// Pause the running scrub
        #[arg(short = 'p', group = "scrub_action")]
        pause: bool,
        /// Stop (cancel) the running scrub
        #[arg(short = 's', group = "scrub_action")]
        stop: bool,
        /// Resume a paused scrub
        #[arg(long, group = "scrub_action")]
        resume: bool,
        /// Wait for the scrub to end, showing progress; fail if it found
        /// errors it could not repair
        #[arg(long, conflicts_with_all = ["pause", "stop"])]
        wait: bool,
        /// Pool name
        pool: String,
    },
    /// Take a device out of service
    Offline {
        /// Pool name
        pool: String,
        /// Device
        device: String,
    },
    /// Bring a device back into service
    Online {
        /// Pool name
        pool: String,
        /// Device
        device: String,
    },
    /// Add a separate intent log device: `tarn pool add tank log [mirror] DEV...`
    Add {
        /// Use devices even if they seem to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
        /// `log`, then one device or `mirror` and devices
        #[arg(required = true, num_args = 2..)]
        vdev: Vec<String>,
    },
    /// Remove a log device
    Remove {
        /// Pool name
        pool: String,
        /// The log device
        device: String,
    },
    /// Replace a device by another and resilver onto it
    Replace {
        /// Use the new device even if it seems to belong to another pool
        #[arg(short, long)]
        force: bool,
        /// Pool name
        pool: String,
        /// Device leaving the pool
        old: String,
        /// Device taking its place
        new: String,
    },
    /// Reset error counters of a pool or one device
    Clear {
        /// Pool name
        pool: String,
        /// Device; all devices when omitted
        device: Option<String>,
    },
    /// I/O statistics: `iostat [POOL] [INTERVAL [COUNT]]`
    Iostat {
        /// Optional pool, then seconds between reports and how many; the
        /// first report shows totals since import, later ones per-second
        /// rates over each interval
        #[arg(num_args = 0..=3, value_names = ["POOL", "INTERVAL", "COUNT"])]
        args: Vec<String>,
    },
    /// Commit the pool's open transaction group now
    Sync {
        /// Pool name
        pool: String,
    },
    /// Drills: make a device misbehave (read-error, write-error, bitflip,
    /// drop-write, torn-write, latency, vanish), or `--clear` it
    Inject {
        /// Pool name
        pool: String,
        /// Member device
        device: String,
        /// Fault kind; omit with --clear
        kind: Option<String>,
        /// Share of the I/Os it hits, 0..1
        #[arg(long, default_value_t = 1.0)]
        probability: f64,
        /// Delay of a latency fault
        #[arg(long, default_value_t = 100)]
        latency_ms: u64,
        /// Remove every fault of the device
        #[arg(long)]
        clear: bool,
    },
}

/// `tarn dataset ...`.
#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    /// Create a filesystem (`-o PROP=VALUE` sets properties)
    Create {
        /// Create missing parents too
        #[arg(short = 'p', long)]
        parents: bool,
        /// Full name, e.g. tank/home/alice
        name: String,
    },
    /// Destroy a filesystem, a snapshot, or a range `fs@first%last`
    Destroy {
        /// Also destroy descendants and snapshots
        #[arg(short = 'r', long)]
        recursive: bool,
        /// What to destroy
        name: String,
    },
    /// List filesystems (and snapshots with `-t snapshot` or `-t all`)
    List {
        /// filesystem, snapshot or all
        #[arg(short = 't', long = "type", default_value = "filesystem")]
        kind: String,
        /// Only these datasets and what is below them
        names: Vec<String>,
    },
    /// Show properties with their source: `tarn dataset get all tank/home`
    Get {
        /// Comma-separated property names, or `all`
        properties: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Set a property: `tarn dataset set compression=zstd tank/home`
    Set {
        /// PROP=VALUE
        assignment: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Drop a local value so the parent's applies
    Inherit {
        /// Property name
        property: String,
        /// Datasets
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Make a clone independent of its origin snapshot
    Promote {
        /// The clone
        name: String,
    },
    /// Rename (or move) a filesystem with everything below it, or a snapshot
    Rename {
        /// Current name
        name: String,
        /// New name
        new_name: String,
    },
}

/// `tarn user ...`.
#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Add a user; asks for the password (or reads it from stdin)
    Add {
        /// The pool that stores the user [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Numeric uid of files the user creates [default: from 10000]
        #[arg(long)]
        uid: Option<u32>,
        /// Numeric gid [default: the uid]
        #[arg(long)]
        gid: Option<u32>,
        /// Read the password from the first line of stdin
        #[arg(long)]
        password_stdin: bool,
        /// Login name
        name: String,
    },
    /// Remove a user
    Del {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Login name
        name: String,
    },
    /// Change a user's password
    Passwd {
        /// The pool [default: the only pool]
        #[arg(long)]
        pool: Option<String>,
        /// Read the password from the first line of stdin
        #[arg(long)]
        password_stdin: bool,
        /// Login name
        name: String,
    },
    /// List users
    List,
}

/// `tarn share ...`.
#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// Add (or replace) a share: `tarn share add photos tank/photos --nfs
    /// 192.168.1.0/24 --webdav alice=rw --webdav bob=ro`
    Add {
        /// Share name: NFS export `/NAME`, WebDAV URL `/NAME/`
        name: String,
        /// The filesystem dataset
        dataset: String,
        /// Export over NFS to this client network (repeatable)
        #[arg(long = "nfs", value_name = "CIDR")]
        nfs: Vec<String>,
        /// The NFS export is read-only
        #[arg(long)]
        nfs_ro: bool,
        /// Let NFS clients act as root (root_squash is on by default)
        #[arg(long)]
        no_root_squash: bool,
        /// Map every NFS user to the anonymous ids
        #[arg(long)]
        all_squash: bool,
        /// Anonymous uid for squashed NFS users
        #[arg(long, default_value_t = 65534)]
        anon_uid: u32,
        /// Anonymous gid for squashed NFS users
        #[arg(long, default_value_t = 65534)]
        anon_gid: u32,
        /// Give a user WebDAV access, `NAME=rw` or `NAME=ro` (repeatable)
        #[arg(long = "webdav", value_name = "USER=rw|ro")]
        webdav: Vec<String>,
        /// Make this user the owner of the dataset's top folder
        #[arg(long, value_name = "USER")]
        owner: Option<String>,
    },
    /// Remove a share
    Del {
        /// The pool [default: the one with that share]
        #[arg(long)]
        pool: Option<String>,
        /// Share name
        name: String,
    },
    /// List shares
    List,
}

/// `tarn object ...`.
#[derive(Subcommand, Debug)]
pub enum ObjectCommand {
    /// Write a file into an object
    Put {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
        /// File to read (on the daemon's machine)
        file: PathBuf,
        /// Byte offset in the object
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Return only once the data is durable
        #[arg(long)]
        sync: bool,
    },
    /// Read an object into a file
    Get {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
        /// File to write (on the daemon's machine)
        file: PathBuf,
    },
    /// List the objects of a pool
    Ls {
        /// Pool name
        pool: String,
    },
    /// Delete an object
    Rm {
        /// Pool name
        pool: String,
        /// Object name
        name: String,
    },
}

/// Builds the backend for `tarn daemon` from its options.
pub type BackendFactory<'a> = dyn FnOnce(&DaemonOptions) -> anyhow::Result<Arc<dyn Backend>> + 'a;

/// Runs a parsed command line. `make_backend` is called only by `tarn
/// daemon`, once the options are known.
pub fn run(cli: Cli, make_backend: Box<BackendFactory<'_>>) -> anyhow::Result<ExitCode> {
    let socket = cli.socket.clone().unwrap_or_else(default_socket_path);
    let is_create = matches!(
        cli.command,
        Command::Pool(PoolCommand::Create { .. })
            | Command::Dataset(DatasetCommand::Create { .. })
            | Command::Clone { .. }
    );
    let (format, pool_props) = resolve_output(&cli.output, is_create)?;

    let mut client = Session {
        path: socket,
        client: None,
    };
    let out = Out { format };
    match cli.command {
        Command::Daemon(DaemonArgs {
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
        }) => match action {
            None => {
                let state_dir = state_dir.unwrap_or_else(default_state_dir);
                let mut opts = DaemonOptions::new(client.path, state_dir);
                opts.handle_signals = true;
                opts.tuning = crate::daemon::Tuning {
                    txg_interval_secs: txg_interval,
                    dirty_max_mib,
                    cache_mib,
                };
                opts.servers = crate::servers::ServerOptions {
                    nfs,
                    webdav,
                    tls_cert: tls_cert.zip(tls_key),
                    webdav_plain_http,
                };
                let backend = make_backend(&opts)?;
                run_daemon(opts, backend)?;
            }
            Some(DaemonAction::Stop) => {
                let v = client.call(method::DAEMON_STOP, &NoParams {})?;
                out.raw_or(&v, String::new)?;
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
        },
        Command::Pool(cmd) => pool_command(&mut client, &out, cmd, pool_props)?,
        Command::Object(cmd) => object_command(&mut client, &out, cmd)?,
        Command::Dataset(cmd) => dataset_command(&mut client, &out, cmd, pool_props)?,
        Command::User(cmd) => user_command(&mut client, &out, cmd)?,
        Command::Share(cmd) => share_command(&mut client, &out, cmd)?,
        Command::Snapshot { recursive, names } => {
            let v = client.call(
                method::DATASET_SNAPSHOT,
                &SnapshotParams { names, recursive },
            )?;
            out.raw_or(&v, String::new)?;
        }
        Command::Rollback {
            recursive,
            snapshot,
        } => {
            let params = RollbackParams {
                snapshot,
                destroy_newer: recursive,
            };
            let v = client.call(method::DATASET_ROLLBACK, &params)?;
            out.raw_or(&v, String::new)?;
        }
        Command::Clone { snapshot, name } => {
            let params = CloneParams {
                snapshot,
                name,
                properties: pool_props.into_iter().collect(),
            };
            let v = client.call(method::DATASET_CLONE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        Command::Mount {
            allow_other,
            read_only,
            name,
            mountpoint,
        } => match name {
            None => {
                let v = client.call(method::DATASET_MOUNTS, &NoParams {})?;
                let mounts: Vec<MountInfo> = decode(method::DATASET_MOUNTS, v.clone())?;
                out.raw_or(&v, || render::render_mounts(&mounts))?;
            }
            Some(name) => {
                let params = MountParams {
                    name,
                    mountpoint: mountpoint.as_deref().map(absolute).transpose()?,
                    allow_other,
                    read_only,
                };
                let v = client.call(method::DATASET_MOUNT, &params)?;
                out.raw_or(&v, String::new)?;
            }
        },
        Command::Unmount { name } => {
            // A relative directory means one below the current directory.
            let target = if name.starts_with('.') || name.contains("/.") {
                absolute(Path::new(&name))?
            } else {
                name
            };
            let v = client.call(method::DATASET_UNMOUNT, &UnmountParams { name: target })?;
            out.raw_or(&v, String::new)?;
        }
        Command::Destroy { recursive, name } => {
            let v = client.call(
                method::DATASET_DESTROY,
                &DatasetDestroyParams { name, recursive },
            )?;
            out.raw_or(&v, String::new)?;
        }
        Command::Demo(args) => crate::demo::run_demo(&args, make_backend)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `err` comes from writing to a closed stdout; such a run should
/// end quietly with success, as other Unix filters do.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Splits the `-o` values into the output format and pool properties.
fn resolve_output(
    opts: &[OutputOpt],
    is_create: bool,
) -> anyhow::Result<(Format, Vec<(String, String)>)> {
    let mut format = Format::Human;
    let mut props = Vec::new();
    for opt in opts {
        match opt {
            OutputOpt::Format(f) => format = *f,
            OutputOpt::Property(k, v) if is_create => props.push((k.clone(), v.clone())),
            OutputOpt::Property(k, v) => bail!(
                "-o {k}={v}: properties are set only by `tarn pool create`, `tarn dataset create` \
                 and `tarn clone`; \
                 elsewhere -o takes `human` or `json`"
            ),
        }
    }
    Ok((format, props))
}

/// The connection to the daemon, opened on first use so that mistakes in
/// the arguments are reported even when no daemon runs.
struct Session {
    path: PathBuf,
    client: Option<Client>,
}

impl Session {
    fn call(&mut self, method: &str, params: &impl serde::Serialize) -> anyhow::Result<Value> {
        let client = match self.client.take() {
            Some(client) => client,
            None => Client::connect(&self.path)?,
        };
        self.client.insert(client).call(method, params)
    }
}

/// Where results go.
struct Out {
    format: Format,
}

impl Out {
    /// Prints the raw result in JSON mode, or `human()` otherwise. Fails
    /// if stdout is gone (e.g. `| head` ended), which [`is_broken_pipe`]
    /// recognises so the program can end quietly.
    fn raw_or(&self, raw: &Value, human: impl FnOnce() -> String) -> anyhow::Result<()> {
        let text = match self.format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(raw).unwrap_or_else(|_| raw.to_string());
                s.push('\n');
                s
            }
            Format::Human => human(),
        };
        if !text.is_empty() {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
        }
        Ok(())
    }
}

fn decode<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| {
        format!(
            "the daemon's answer to {method} does not have the expected shape; \
             are the daemon and this client the same version? (`tarn daemon ping`)"
        )
    })
}

fn absolute(path: &Path) -> anyhow::Result<String> {
    let abs = std::path::absolute(path)
        .with_context(|| format!("cannot make {} absolute", path.display()))?;
    abs.to_str().map(str::to_string).ok_or_else(|| {
        anyhow!(
            "path {} is not valid UTF-8; rename it or use a symlink with a UTF-8 name",
            abs.display()
        )
    })
}

/// Devices named by path are made absolute; a bare word that is not a file
/// here (`sdb`, a GUID) is passed on for the daemon to match.
fn device_arg(device: &str) -> anyhow::Result<String> {
    if device.contains('/') || Path::new(device).exists() {
        absolute(Path::new(device))
    } else {
        Ok(device.to_string())
    }
}

/// Parses `zpool create`-style vdev words into top-level vdevs: `a b` is two
/// single vdevs; `mirror a b`, `raidz1 a b c` (`raidz` = `raidz1`),
/// `raidz2 ...`, `raidz3 ...` are groups; a group runs until the next group
/// word. Devices are returned as written.
pub fn parse_vdev_words(words: &[String]) -> anyhow::Result<Vec<VdevSpec>> {
    let mut vdevs = Vec::new();
    let mut group: Option<VdevSpec> = None;
    for word in words {
        match group_word(word)? {
            Some(kind) => {
                vdevs.extend(group.take());
                group = Some(VdevSpec {
                    kind,
                    devices: Vec::new(),
                });
            }
            None => match group.as_mut() {
                Some(g) => g.devices.push(word.clone()),
                None => vdevs.push(VdevSpec {
                    kind: VdevKind::Single,
                    devices: vec![word.clone()],
                }),
            },
        }
    }
    vdevs.extend(group);
    if vdevs.is_empty() {
        bail!("no devices given; e.g. `tarn pool create tank mirror /dev/sdb /dev/sdc`");
    }
    for (i, vdev) in vdevs.iter().enumerate() {
        vdev.validate(i)?;
    }
    Ok(vdevs)
}

/// Parses `log DEV` or `log mirror DEV...` (what `pool add` accepts).
pub fn parse_log_words(words: &[String]) -> anyhow::Result<VdevSpec> {
    let Some((first, rest)) = words.split_first() else {
        bail!("nothing to add; e.g. `tarn pool add tank log /dev/nvme0n1`");
    };
    if first != "log" {
        bail!(
            "tarn pool add adds log devices only: `tarn pool add POOL log DEV` or \
             `... log mirror DEV DEV`"
        );
    }
    let mut vdevs = parse_vdev_words(rest)?;
    let mut spec = match (vdevs.pop(), vdevs.is_empty()) {
        (Some(v), true) => v,
        _ => bail!("one log vdev at a time: a device, or `mirror` and its devices"),
    };
    if !matches!(spec.kind, VdevKind::Single | VdevKind::Mirror) {
        bail!("a log vdev is one device or a mirror, not raidz");
    }
    for d in &mut spec.devices {
        *d = absolute(Path::new(d.as_str()))?;
    }
    Ok(spec)
}

/// Recognises a group word; refuses words that look like vdev types tarn
/// does not have, so they are not taken for device names.
fn group_word(word: &str) -> anyhow::Result<Option<VdevKind>> {
    let kind = match word {
        "mirror" => VdevKind::Mirror,
        "raidz" | "raidz1" => VdevKind::Raidz1,
        "raidz2" => VdevKind::Raidz2,
        "raidz3" => VdevKind::Raidz3,
        w if w.starts_with("raidz") => bail!(
            "{w} is not a vdev type: tarn has raidz1, raidz2 and raidz3 (raidz means raidz1); \
             for a device with that name write ./{w}"
        ),
        w if ["log", "cache", "spare", "special", "dedup"].contains(&w)
            || w.starts_with("draid") =>
        {
            bail!("{w} vdevs are not supported by tarn; for a device with that name write ./{w}")
        }
        _ => return Ok(None),
    };
    Ok(Some(kind))
}

fn build_create(
    name: String,
    words: &[String],
    pool_props: Vec<(String, String)>,
    data_props: &[String],
    force: bool,
) -> anyhow::Result<CreateRequest> {
    let mut vdevs = parse_vdev_words(words)?;
    for vdev in &mut vdevs {
        for dev in &mut vdev.devices {
            *dev = absolute(Path::new(dev))?;
        }
    }
    let mut ashift = None;
    for (key, value) in pool_props {
        match key.as_str() {
            "ashift" => {
                ashift = Some(value.parse::<u8>().map_err(|_| {
                    anyhow!("-o ashift={value}: expected a number such as 12 (4 KiB sectors)")
                })?)
            }
            _ => bail!(
                "-o {key}={value}: unknown pool property; the pool property at creation is \
                 ashift; data properties such as compression go with -O"
            ),
        }
    }
    let mut properties = BTreeMap::new();
    for prop in data_props {
        let (key, value) = prop
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| anyhow!("-O {prop}: expected PROP=VALUE, e.g. -O compression=lz4"))?;
        if properties
            .insert(key.to_string(), value.to_string())
            .is_some()
        {
            bail!("-O {key} is given twice; keep one");
        }
    }
    let req = CreateRequest {
        name,
        vdevs,
        ashift,
        properties,
        force,
    };
    req.validate()?;
    Ok(req)
}

/// Splits `iostat` arguments into pool, interval and count: trailing numbers
/// are the interval and count, like `zpool iostat`.
fn parse_iostat_args(
    args: &[String],
) -> anyhow::Result<(Option<String>, Option<f64>, Option<u64>)> {
    let is_number = |s: &String| s.parse::<f64>().is_ok();
    let numbers = args
        .iter()
        .rev()
        .take_while(|a| is_number(a))
        .count()
        .min(2);
    let (names, numbers) = args.split_at(args.len() - numbers);
    if names.len() > 1 {
        bail!(
            "iostat takes one pool at most, got {}; usage: tarn pool iostat [POOL] [INTERVAL [COUNT]]",
            names.join(" ")
        );
    }
    let interval = match numbers.first() {
        Some(s) => {
            let secs: f64 = s.parse()?;
            if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                bail!("iostat interval {s}: give seconds between 0 and 86400");
            }
            Some(secs)
        }
        None => None,
    };
    let count = match numbers.get(1) {
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| anyhow!("iostat count {s}: give a whole number of reports"))?,
        ),
        None => None,
    };
    Ok((names.first().cloned(), interval, count))
}

fn pool_command(
    client: &mut Session,
    out: &Out,
    cmd: PoolCommand,
    pool_props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        PoolCommand::Create {
            properties,
            force,
            name,
            vdevs,
        } => {
            let req = build_create(name, &vdevs, pool_props, &properties, force)?;
            let v = client.call(method::POOL_CREATE, &req)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Import {
            dirs,
            force,
            discard_log,
            pool,
            new_name,
        } => {
            let mut req = ImportRequest {
                pool,
                new_name,
                force,
                discard_log,
                ..ImportRequest::default()
            };
            for dir in &dirs {
                let abs = absolute(dir)?;
                if dir.is_dir() {
                    req.dirs.push(abs);
                } else {
                    req.devices.push(abs);
                }
            }
            req.validate()?;
            let v = client.call(method::POOL_IMPORT, &req)?;
            let result: ImportResult = decode(method::POOL_IMPORT, v.clone())?;
            out.raw_or(&v, || match result {
                ImportResult::Candidates(c) => render::render_candidates(&c),
                ImportResult::Imported(_) => String::new(),
            })?;
        }
        PoolCommand::Export { force, pool } => {
            let v = client.call(method::POOL_EXPORT, &ForceParams { name: pool, force })?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Destroy { force, pool } => {
            let v = client.call(method::POOL_DESTROY, &ForceParams { name: pool, force })?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::List => {
            let v = client.call(method::POOL_LIST, &NoParams {})?;
            let pools: Vec<PoolListEntry> = decode(method::POOL_LIST, v.clone())?;
            out.raw_or(&v, || render::render_list(&pools))?;
        }
        PoolCommand::Status { unhealthy, pool } => {
            let v = client.call(method::POOL_STATUS, &OptionalNameParams { name: pool })?;
            let mut pools: Vec<PoolStatus> = decode(method::POOL_STATUS, v.clone())?;
            if unhealthy {
                pools.retain(render::needs_attention);
                let v = serde_json::to_value(&pools)?;
                out.raw_or(&v, || {
                    if pools.is_empty() {
                        "all pools are healthy\n".to_string()
                    } else {
                        render::render_status(&pools)
                    }
                })?;
            } else {
                out.raw_or(&v, || render::render_status(&pools))?;
            }
        }
        PoolCommand::Scrub {
            pause,
            stop,
            resume,
            wait,
            pool,
        } => {
            let action = match (pause, stop, resume) {
                (true, _, _) => ScrubAction::Pause,
                (_, true, _) => ScrubAction::Cancel,
                (_, _, true) => ScrubAction::Resume,
                _ => ScrubAction::Start,
            };
            let params = ScrubParams {
                name: pool.clone(),
                action,
            };
            let v = client.call(method::POOL_SCRUB, &params)?;
            if !wait {
                return out.raw_or(&v, String::new);
            }
            let started: Option<ScanStatus> = decode(method::POOL_SCRUB, v)?;
            let scan = wait_for_scrub(client, &pool, started.map_or(0, |s| s.started_unix))?;
            let v = serde_json::to_value(&scan)?;
            out.raw_or(&v, || format!("{}\n", render::scan_text(&scan)))?;
            match scan.state {
                ScanState::Canceled => bail!("the scrub of {pool} was canceled before it finished"),
                _ if scan.errors > 0 => bail!(
                    "the scrub of {pool} found {} error{} it could not repair\n\
                     hint: `tarn pool status {pool}` lists the damaged objects",
                    scan.errors,
                    if scan.errors == 1 { "" } else { "s" }
                ),
                _ => {}
            }
        }
        PoolCommand::Offline { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            let v = client.call(method::POOL_OFFLINE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Online { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            let v = client.call(method::POOL_ONLINE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Add { force, pool, vdev } => {
            let params = AddLogParams {
                name: pool,
                vdev: parse_log_words(&vdev)?,
                force,
            };
            let v = client.call(method::POOL_ADD_LOG, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Remove { pool, device } => {
            let params = DeviceParams {
                name: pool,
                device: device_arg(&device)?,
            };
            let v = client.call(method::POOL_REMOVE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Replace {
            force,
            pool,
            old,
            new,
        } => {
            let params = ReplaceParams {
                name: pool,
                old: device_arg(&old)?,
                new: absolute(Path::new(&new))?,
                force,
            };
            let v = client.call(method::POOL_REPLACE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Clear { pool, device } => {
            let params = ClearParams {
                name: pool,
                device: device.as_deref().map(device_arg).transpose()?,
            };
            let v = client.call(method::POOL_CLEAR, &params)?;
            out.raw_or(&v, String::new)?;
        }
        PoolCommand::Iostat { args } => {
            let (pool, interval, count) = parse_iostat_args(&args)?;
            iostat(client, out, pool, interval, count)?;
        }
        PoolCommand::Sync { pool } => {
            let v = client.call(method::POOL_SYNC, &NameParams { name: pool.clone() })?;
            let synced: SyncResult = decode(method::POOL_SYNC, v.clone())?;
            out.raw_or(&v, || format!("{pool}: committed txg {}\n", synced.txg))?;
        }
        PoolCommand::Inject {
            pool,
            device,
            kind,
            probability,
            latency_ms,
            clear,
        } => {
            let fault = match (kind, clear) {
                (None, true) => None,
                (Some(k), false) => {
                    let kind = tarn_vdev::FaultKind::parse(&k).ok_or_else(|| {
                        let names: Vec<&str> =
                            tarn_vdev::FaultKind::ALL.iter().map(|k| k.name()).collect();
                        anyhow!("unknown fault '{k}'; one of: {}", names.join(", "))
                    })?;
                    Some(tarn_vdev::Fault {
                        kind,
                        probability,
                        range: None,
                        latency_ms,
                    })
                }
                _ => bail!("give a fault kind, or --clear"),
            };
            let params = InjectParams {
                name: pool,
                device: device_arg(&device)?,
                fault,
            };
            let v = client.call(method::POOL_INJECT, &params)?;
            let now: Vec<tarn_vdev::Fault> = decode(method::POOL_INJECT, v.clone())?;
            out.raw_or(&v, || {
                if now.is_empty() {
                    format!("{device}: no faults\n")
                } else {
                    let list: Vec<String> = now
                        .iter()
                        .map(|f| format!("{} ({:.0}%)", f.kind.name(), f.probability * 100.0))
                        .collect();
                    format!("{device}: {}\n", list.join(", "))
                }
            })?;
        }
    }
    Ok(())
}

fn iostat(
    client: &mut Session,
    out: &Out,
    pool: Option<String>,
    interval: Option<f64>,
    count: Option<u64>,
) -> anyhow::Result<()> {
    let params = OptionalNameParams { name: pool };
    let reports = match (interval, count) {
        (None, _) => 1,
        (Some(_), Some(n)) => n,
        (Some(_), None) => u64::MAX,
    };
    let mut previous: Option<(Vec<IostatEntry>, Instant)> = None;
    for i in 0..reports {
        if i > 0 {
            if let Some(secs) = interval {
                thread::sleep(Duration::from_secs_f64(secs));
            }
        }
        let v = client.call(method::POOL_IOSTAT, &params)?;
        let now = Instant::now();
        let entries: Vec<IostatEntry> = decode(method::POOL_IOSTAT, v.clone())?;
        out.raw_or(&v, || {
            let prev = previous
                .as_ref()
                .map(|(p, at)| (p.as_slice(), now.duration_since(*at)));
            render::render_iostat(&entries, prev)
        })?;
        previous = Some((entries, now));
    }
    Ok(())
}

/// Polls the pool's status once a second until its scrub has ended; draws a
/// progress bar on a terminal, or a line every ten seconds otherwise.
fn wait_for_scrub(
    client: &mut Session,
    pool: &str,
    started_unix: u64,
) -> anyhow::Result<ScanStatus> {
    const LOG_EVERY: Duration = Duration::from_secs(10);
    let tty = std::io::stderr().is_terminal();
    let mut last_log: Option<Instant> = None;
    let params = OptionalNameParams {
        name: Some(pool.to_string()),
    };
    let finish_line = |drawn: bool| {
        if drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    };
    let mut drawn = false;
    loop {
        let v = client.call(method::POOL_STATUS, &params)?;
        let pools: Vec<PoolStatus> = decode(method::POOL_STATUS, v)?;
        let status = pools
            .into_iter()
            .find(|p| p.name == pool)
            .ok_or_else(|| anyhow!("pool {pool} disappeared while waiting for its scrub"))?;
        let Some(scan) = status.scan else {
            finish_line(drawn);
            bail!(
                "pool {pool} reports no scrub; it may have been canceled or the pool re-imported"
            );
        };
        let ours = scan.kind == ScanKind::Scrub && scan.started_unix >= started_unix;
        let ended = matches!(scan.state, ScanState::Finished | ScanState::Canceled);
        if ended {
            finish_line(drawn);
            if ours {
                return Ok(scan);
            }
            bail!(
                "pool {pool} no longer reports the scrub that was started; its last scan is: {}",
                render::scan_text(&scan)
            );
        }
        if tty {
            let _ = write!(
                std::io::stderr(),
                "\r{}\x1b[K",
                render::progress_line(&scan)
            );
            drawn = true;
        } else if last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            let pct = if scan.total_bytes == 0 {
                0.0
            } else {
                scan.examined_bytes as f64 * 100.0 / scan.total_bytes as f64
            };
            let eta = scan
                .eta_secs
                .map_or_else(|| "unknown".to_string(), render::format_duration);
            let _ = writeln!(
                std::io::stderr(),
                "{pool}: {}{} {pct:.1}% done, {} of {} at {}, {eta} to go",
                match scan.kind {
                    ScanKind::Scrub => "scrub",
                    ScanKind::Resilver => "resilver",
                },
                if scan.state == ScanState::Paused {
                    " (paused)"
                } else {
                    ""
                },
                render::format_size(scan.examined_bytes),
                render::format_size(scan.total_bytes),
                render::format_rate(scan.rate_bytes_per_sec),
            );
            last_log = Some(Instant::now());
        }
        let _ = std::io::stderr().flush();
        thread::sleep(Duration::from_secs(1));
    }
}

fn dataset_command(
    client: &mut Session,
    out: &Out,
    cmd: DatasetCommand,
    props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        DatasetCommand::Create { parents, name } => {
            let params = DatasetCreateParams {
                name,
                properties: props.into_iter().collect(),
                parents,
            };
            let v = client.call(method::DATASET_CREATE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        DatasetCommand::Destroy { recursive, name } => {
            let v = client.call(
                method::DATASET_DESTROY,
                &DatasetDestroyParams { name, recursive },
            )?;
            out.raw_or(&v, String::new)?;
        }
        DatasetCommand::List { kind, names } => {
            let (fs, snaps) = match kind.as_str() {
                "filesystem" => (true, false),
                "snapshot" => (false, true),
                "all" => (true, true),
                other => bail!("-t {other}: expected filesystem, snapshot or all"),
            };
            let v = client.call(
                method::DATASET_LIST,
                &DatasetListParams { snapshots: snaps },
            )?;
            let all: Vec<DatasetInfo> = decode(method::DATASET_LIST, v)?;
            let below = |n: &str| {
                names.is_empty()
                    || names.iter().any(|w| {
                        n == w
                            || n.strip_prefix(w.as_str())
                                .is_some_and(|r| r.starts_with('/') || r.starts_with('@'))
                    })
            };
            let shown: Vec<DatasetInfo> = all
                .into_iter()
                .filter(|d| below(&d.name))
                .filter(|d| match d.kind {
                    DatasetKind::Filesystem => fs,
                    DatasetKind::Snapshot => snaps,
                })
                .collect();
            let raw = serde_json::to_value(&shown)?;
            out.raw_or(&raw, || render::render_datasets(&shown))?;
        }
        DatasetCommand::Get { properties, names } => {
            let wanted: Vec<String> = if properties == "all" {
                Vec::new()
            } else {
                properties
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect()
            };
            let mut all: Vec<PropValue> = Vec::new();
            for name in names {
                let v = client.call(
                    method::DATASET_GET,
                    &DatasetGetParams {
                        name,
                        properties: wanted.clone(),
                    },
                )?;
                let mut got: Vec<PropValue> = decode(method::DATASET_GET, v)?;
                all.append(&mut got);
            }
            let raw = serde_json::to_value(&all)?;
            out.raw_or(&raw, || render::render_props(&all))?;
        }
        DatasetCommand::Set { assignment, names } => {
            let Some((property, value)) = assignment.split_once('=') else {
                bail!("expected PROP=VALUE, e.g. compression=zstd; got {assignment:?}");
            };
            for name in names {
                let params = DatasetSetParams {
                    name,
                    property: property.to_string(),
                    value: value.to_string(),
                };
                let v = client.call(method::DATASET_SET, &params)?;
                out.raw_or(&v, String::new)?;
            }
        }
        DatasetCommand::Inherit { property, names } => {
            for name in names {
                let params = DatasetInheritParams {
                    name,
                    property: property.clone(),
                };
                let v = client.call(method::DATASET_INHERIT, &params)?;
                out.raw_or(&v, String::new)?;
            }
        }
        DatasetCommand::Promote { name } => {
            let v = client.call(method::DATASET_PROMOTE, &NameParams { name })?;
            out.raw_or(&v, String::new)?;
        }
        DatasetCommand::Rename { name, new_name } => {
            let v = client.call(
                method::DATASET_RENAME,
                &DatasetRenameParams { name, new_name },
            )?;
            out.raw_or(&v, String::new)?;
        }
    }
    Ok(())
}

/// Reads a password: the first line of stdin with `from_stdin` or when
/// stdin is not a terminal, else from the terminal twice without echo.
fn read_password(from_stdin: bool) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if from_stdin || !stdin.is_terminal() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdin.lock(), &mut line)?;
        let p = line.trim_end_matches(['\n', '\r']).to_string();
        if p.is_empty() {
            bail!("no password on stdin");
        }
        return Ok(p);
    }
    let first = prompt_hidden("Password: ")?;
    let again = prompt_hidden("Again: ")?;
    if first != again {
        bail!("the passwords differ");
    }
    Ok(first)
}

/// Reads one line from the terminal with echo off.
fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    eprint!("{prompt}");
    let fd = libc::STDIN_FILENO;
    // SAFETY: termios is plain data; tcgetattr fills it for a valid fd and
    // we only proceed when it succeeds.
    let mut old: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd 0 is open (stdin is a terminal here); `old` is writable.
    let have = unsafe { libc::tcgetattr(fd, &mut old) } == 0;
    if have {
        let mut quiet = old;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: `quiet` is a valid termios derived from the current one.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
    }
    let mut line = String::new();
    let r = std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line);
    if have {
        // SAFETY: restores the settings read above.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &old) };
    }
    eprintln!();
    r?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

fn user_command(client: &mut Session, out: &Out, cmd: UserCommand) -> anyhow::Result<()> {
    match cmd {
        UserCommand::Add {
            pool,
            uid,
            gid,
            password_stdin,
            name,
        } => {
            crate::access::check_user_name(&name).map_err(anyhow::Error::msg)?;
            let password = read_password(password_stdin)?;
            let params = UserAddParams {
                pool,
                name,
                password,
                uid,
                gid,
            };
            let v = client.call(method::USER_ADD, &params)?;
            out.raw_or(&v, String::new)?;
        }
        UserCommand::Del { pool, name } => {
            let v = client.call(method::USER_DEL, &UserParams { pool, name })?;
            out.raw_or(&v, String::new)?;
        }
        UserCommand::Passwd {
            pool,
            password_stdin,
            name,
        } => {
            let password = read_password(password_stdin)?;
            let params = UserPasswdParams {
                pool,
                name,
                password,
            };
            let v = client.call(method::USER_PASSWD, &params)?;
            out.raw_or(&v, String::new)?;
        }
        UserCommand::List => {
            let v = client.call(method::USER_LIST, &NoParams {})?;
            let users: Vec<UserInfo> = decode(method::USER_LIST, v.clone())?;
            out.raw_or(&v, || render::render_users(&users))?;
        }
    }
    Ok(())
}

fn share_command(client: &mut Session, out: &Out, cmd: ShareCommand) -> anyhow::Result<()> {
    match cmd {
        ShareCommand::Add {
            name,
            dataset,
            nfs,
            nfs_ro,
            no_root_squash,
            all_squash,
            anon_uid,
            anon_gid,
            webdav,
            owner,
        } => {
            let mut users = BTreeMap::new();
            for w in &webdav {
                let (u, a) = w.split_once('=').unwrap_or((w.as_str(), "rw"));
                let access = match a {
                    "rw" => crate::access::Access::Rw,
                    "ro" => crate::access::Access::Ro,
                    other => bail!("--webdav {w}: access must be rw or ro, not {other:?}"),
                };
                users.insert(u.to_string(), access);
            }
            let share = Share {
                name,
                dataset,
                nfs: (!nfs.is_empty()).then_some(crate::access::NfsShare {
                    clients: nfs,
                    read_only: nfs_ro,
                    root_squash: !no_root_squash,
                    all_squash,
                    anon_uid,
                    anon_gid,
                }),
                webdav: (!webdav.is_empty()).then_some(crate::access::WebdavShare { users }),
            };
            let v = client.call(method::SHARE_ADD, &ShareAddParams { share, owner })?;
            out.raw_or(&v, String::new)?;
        }
        ShareCommand::Del { pool, name } => {
            let v = client.call(method::SHARE_DEL, &ShareDelParams { pool, name })?;
            out.raw_or(&v, String::new)?;
        }
        ShareCommand::List => {
            let v = client.call(method::SHARE_LIST, &NoParams {})?;
            let shares: Vec<ShareInfo> = decode(method::SHARE_LIST, v.clone())?;
            out.raw_or(&v, || render::render_shares(&shares))?;
        }
    }
    Ok(())
}

fn object_command(client: &mut Session, out: &Out, cmd: ObjectCommand) -> anyhow::Result<()> {
    match cmd {
        ObjectCommand::Put {
            pool,
            name,
            file,
            offset,
            sync,
        } => {
            let params = ObjectWriteParams {
                pool,
                object: name,
                from_path: absolute(&file)?,
                offset,
                sync,
            };
            let v = client.call(method::OBJECT_WRITE, &params)?;
            out.raw_or(&v, String::new)?;
        }
        ObjectCommand::Get { pool, name, file } => {
            let params = ObjectReadParams {
                pool,
                object: name,
                to_path: absolute(&file)?,
            };
            let v = client.call(method::OBJECT_READ, &params)?;
            out.raw_or(&v, String::new)?;
        }
        ObjectCommand::Ls { pool } => {
            let v = client.call(method::OBJECT_LIST, &PoolParams { pool: pool.clone() })?;
            let objects: Vec<ObjectInfo> = decode(method::OBJECT_LIST, v.clone())?;
            out.raw_or(&v, || render::render_objects(&pool, &objects))?;
        }
        ObjectCommand::Rm { pool, name } => {
            let v = client.call(method::OBJECT_DELETE, &ObjectParams { pool, object: name })?;
            out.raw_or(&v, String::new)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn kinds(specs: &[VdevSpec]) -> Vec<(VdevKind, usize)> {
        specs.iter().map(|s| (s.kind, s.devices.len())).collect()
    }

    #[test]
    fn vdev_words_group_like_zpool() {
        let specs = parse_vdev_words(&words("mirror a b raidz2 c d e f")).unwrap();
        assert_eq!(
            kinds(&specs),
            [(VdevKind::Mirror, 2), (VdevKind::Raidz2, 4)]
        );
        assert_eq!(specs[1].devices, ["c", "d", "e", "f"]);

        let specs = parse_vdev_words(&words("a b mirror c d mirror e f raidz g h")).unwrap();
        assert_eq!(
            kinds(&specs),
            [
                (VdevKind::Single, 1),
                (VdevKind::Single, 1),
                (VdevKind::Mirror, 2),
                (VdevKind::Mirror, 2),
                (VdevKind::Raidz1, 2),
            ]
        );
    }

    #[test]
    fn vdev_words_refuse_bad_groups() {
        let err = parse_vdev_words(&words("mirror a"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mirror-0 needs at least 2 devices"), "{err}");
        let err = parse_vdev_words(&words("mirror a b raidz3 c d e"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("raidz3-1 needs at least 4"), "{err}");
        let err = parse_vdev_words(&words("raidz4 a b c d e"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("raidz4 is not a vdev type"), "{err}");
        let err = parse_vdev_words(&words("mirror a b log c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("log vdevs are not supported"), "{err}");
        let err = parse_vdev_words(&[]).unwrap_err().to_string();
        assert!(err.contains("no devices given"), "{err}");
        let err = parse_vdev_words(&words("mirror raidz1 a b"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("got 0 (none)"), "{err}");
    }

    #[test]
    fn create_request_from_words_and_options() {
        let req = build_create(
            "tank".into(),
            &words("mirror a /b"),
            vec![("ashift".into(), "12".into())],
            &["compression=lz4".into(), "checksum=xxh3".into()],
            true,
        )
        .unwrap();
        assert_eq!(req.ashift, Some(12));
        assert!(req.force);
        assert_eq!(req.properties["compression"], "lz4");
        assert!(Path::new(&req.vdevs[0].devices[0]).is_absolute());
        assert!(req.vdevs[0].devices[0].ends_with("/a"));
        assert_eq!(req.vdevs[0].devices[1], "/b");

        let err = build_create("tank".into(), &words("a"), vec![], &["x".into()], false);
        assert!(err.unwrap_err().to_string().contains("expected PROP=VALUE"));
        let err = build_create(
            "tank".into(),
            &words("a"),
            vec![("autoexpand".into(), "on".into())],
            &[],
            false,
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("unknown pool property"));
        let err = build_create("mirror".into(), &words("a b"), vec![], &[], false);
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("forget the pool name"));
    }

    #[test]
    fn iostat_arguments() {
        assert_eq!(parse_iostat_args(&[]).unwrap(), (None, None, None));
        assert_eq!(
            parse_iostat_args(&words("tank 5")).unwrap(),
            (Some("tank".into()), Some(5.0), None)
        );
        assert_eq!(
            parse_iostat_args(&words("2 3")).unwrap(),
            (None, Some(2.0), Some(3))
        );
        assert!(parse_iostat_args(&words("tank other")).is_err());
        assert!(parse_iostat_args(&words("tank 0")).is_err());
        assert!(parse_iostat_args(&words("1 2.5")).is_err());
    }

    #[test]
    fn output_option_doubles_as_pool_property() {
        let cli = Cli::try_parse_checked([
            "tarn",
            "pool",
            "create",
            "-o",
            "json",
            "-o",
            "ashift=12",
            "tank",
            "a",
        ])
        .unwrap();
        let (format, props) = resolve_output(&cli.output, true).unwrap();
        assert_eq!(format, Format::Json);
        assert_eq!(props, [("ashift".to_string(), "12".to_string())]);
        let cli = Cli::try_parse_checked(["tarn", "-ojson", "pool", "status"]).unwrap();
        assert_eq!(resolve_output(&cli.output, false).unwrap().0, Format::Json);
        // clap would keep only the inner -o here; refuse instead of losing one.
        let err = Cli::try_parse_checked([
            "tarn",
            "-o",
            "json",
            "pool",
            "create",
            "-o",
            "ashift=12",
            "tank",
            "a",
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("both before and after"), "{err}");

        let cli = Cli::try_parse_from(["tarn", "pool", "list", "-o", "json"]).unwrap();
        assert_eq!(resolve_output(&cli.output, false).unwrap().0, Format::Json);
        let cli = Cli::try_parse_from(["tarn", "pool", "list", "-o", "ashift=9"]).unwrap();
        assert!(resolve_output(&cli.output, false).is_err());
        assert!(Cli::try_parse_from(["tarn", "pool", "list", "-o", "yaml"]).is_err());
        assert!(Cli::try_parse_from(["tarn", "pool", "scrub", "-p", "-s", "tank"]).is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

//! The command line: the top-level parser, output options, the connection
//! to the daemon, and [`run`], which hands each command to its group's
//! module (`pool`, `dataset`, `access`, `object`, `daemon`).
//!
//! Commands stay thin: everything they do is an API call, so the web page can
//! do the same. The client turns relative paths into absolute ones (the
//! daemon has its own working directory) and checks what it can before
//! sending (vdev words, property syntax). `-o json` prints each raw result.
//! `tarn daemon` and `tarn demo` are not run here: [`run`] answers them as
//! plain options ([`Run`]) for the binary to run in-process.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::access::{ShareCommand, UserCommand};
use crate::daemon::{default_socket_path, DaemonArgs, DaemonRun, DemoArgs, DemoRun};
use crate::dataset::DatasetCommand;
use crate::object::ObjectCommand;
use crate::pool::PoolCommand;
pub use crate::session::Format;
use crate::session::{Out, Session};

/// tarn: a self-healing storage pool server.
#[derive(Parser, Debug)]
#[command(name = "tarn", version, max_term_width = 100)]
pub struct Cli {
    /// Admin socket of the daemon [default: /run/tarn/tarn.sock for root,
    /// else $XDG_RUNTIME_DIR/tarn/tarn.sock, else /tmp/tarn-$UID/tarn.sock]
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
    /// with status 2, as clap does. `defaults` are the default values of
    /// `tarn daemon`'s flags, by argument id (`txg_interval`,
    /// `nfs_max_connections`, ...): the binary takes them from the code
    /// that uses them, so `--help` shows what the daemon really does.
    pub fn parse_args_with(defaults: &[(&'static str, String)]) -> Cli {
        let args: Vec<OsString> = std::env::args_os().collect();
        let cli = Cli::try_parse_with(&args, defaults).unwrap_or_else(|e| e.exit());
        match Cli::with_config_file(cli, &args, defaults) {
            Ok(cli) => cli,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(2);
            }
        }
    }

    /// For `tarn daemon --config FILE`: parses `args` again with the
    /// file's settings as the flags' defaults (over `defaults`), so a
    /// flag on the command line overrides the file. Other commands come
    /// back as they are.
    pub fn with_config_file(
        cli: Cli,
        args: &[OsString],
        defaults: &[(&'static str, String)],
    ) -> anyhow::Result<Cli> {
        let Command::Daemon(d) = &cli.command else {
            return Ok(cli);
        };
        let Some(file) = &d.config else {
            return Ok(cli);
        };
        let loaded = crate::config::load(file, &daemon_command())?;
        let mut merged: Vec<(&'static str, String)> = defaults
            .iter()
            .filter(|(id, _)| !loaded.defaults.iter().any(|(i, _)| i == id))
            .cloned()
            .collect();
        merged.extend(loaded.defaults);
        Ok(Cli::try_parse_with(args, &merged)?)
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
        Cli::try_parse_with(args, &[])
    }

    /// Like [`Cli::try_parse_checked`], with `tarn daemon`'s flag defaults
    /// (see [`Cli::parse_args_with`]); a flag without one is `None` unless
    /// given.
    pub fn try_parse_with<I, T>(
        args: I,
        defaults: &[(&'static str, String)],
    ) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut command = Cli::command_with(defaults);
        let mut matches = command.try_get_matches_from_mut(&args)?;
        let cli = Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut command))?;
        let given = args
            .iter()
            .skip(1)
            .take_while(|a| *a != "--")
            .filter(|a| is_output_flag(a))
            .count();
        if given > cli.output.len() {
            return Err(command.error(
                clap::error::ErrorKind::ArgumentConflict,
                "-o is given both before and after a subcommand; put every -o after the last \
                 subcommand, e.g. `tarn pool create -o json -o ashift=12 tank ...`",
            ));
        }
        Ok(cli)
    }

    /// The command line's definition with `tarn daemon`'s flag defaults
    /// set. Panics on an id that names no flag of `tarn daemon` (a bug of
    /// the caller, caught by its tests).
    pub fn command_with(defaults: &[(&'static str, String)]) -> clap::Command {
        let mut cmd = Cli::command();
        // The admin socket is a flag of every command; a configuration
        // file's `socket` is the default of `tarn daemon`'s.
        if let Some((_, socket)) = defaults.iter().find(|(id, _)| *id == "socket") {
            cmd = cmd.mut_arg("socket", |arg| arg.default_value(socket.clone()));
        }
        cmd.mut_subcommand("daemon", |mut daemon| {
            for (id, value) in defaults.iter().filter(|(id, _)| *id != "socket") {
                daemon = daemon.mut_arg(*id, |arg| arg.default_value(value.clone()));
            }
            daemon
        })
    }
}

/// `tarn daemon`'s definition, whose flags' parsers check the
/// configuration file's values.
pub fn daemon_command() -> clap::Command {
    let mut c = Cli::command();
    c.build();
    c.find_subcommand("daemon")
        .cloned()
        .unwrap_or_else(|| clap::Command::new("daemon"))
}

fn is_output_flag(arg: &OsString) -> bool {
    let Some(a) = arg.to_str() else {
        return false;
    };
    a == "--output" || a.starts_with("--output=") || (a.starts_with("-o") && !a.starts_with("--"))
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
// Parsed once per process: the size of `tarn daemon`'s many flags costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon in the foreground (use a service manager to keep it
    /// running), or talk to a running one
    Daemon(DaemonArgs),
    /// Create, import, inspect and repair pools
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Copy files in and out of the top of a pool's root filesystem (for drills, tests and benchmarks)
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
    /// Put a hold on snapshots, so they cannot be destroyed until released:
    /// `tarn hold offsite tank/home@monday`
    Hold {
        /// Also the snapshots of the same name on every filesystem below
        #[arg(short = 'r', long)]
        recursive: bool,
        /// The hold's tag (names who needs the snapshot)
        tag: String,
        /// Snapshots, `FILESYSTEM@NAME`
        #[arg(required = true, value_name = "FS@NAME")]
        snapshots: Vec<String>,
    },
    /// Release a hold put with `tarn hold`
    Release {
        /// Also the snapshots of the same name on every filesystem below
        #[arg(short = 'r', long)]
        recursive: bool,
        /// The hold's tag
        tag: String,
        /// Snapshots, `FILESYSTEM@NAME`
        #[arg(required = true, value_name = "FS@NAME")]
        snapshots: Vec<String>,
    },
    /// List the holds on snapshots
    Holds {
        /// Also the snapshots of the same name on every filesystem below
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Snapshots, `FILESYSTEM@NAME`
        #[arg(required = true, value_name = "FS@NAME")]
        snapshots: Vec<String>,
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
    /// Users who reach shares over WebDAV, SMB and iSCSI (stored in the pool)
    #[command(subcommand)]
    User(UserCommand),
    /// Shares: a filesystem served over NFS, WebDAV and SMB, a volume over NBD and iSCSI (stored in the pool)
    #[command(subcommand)]
    Share(ShareCommand),
    /// Share links of the web page: a folder for visitors without a
    /// login, read-only or upload-only, with a password and an expiry
    #[command(subcommand)]
    Link(crate::access::LinkCommand),
    /// Measure a pool (on a scratch dataset, one row per `--sweep`
    /// combination) or a directory: random and sequential I/O, as fio would
    Bench(crate::bench::BenchArgs),
    /// Health of the pools' disks: SMART and NVMe data, self-tests
    #[command(subcommand)]
    Disk(crate::disk::DiskCommand),
    /// What the daemon saw happen to the pools: devices, scrubs, space,
    /// schedules (`-f` follows)
    Events(crate::events::EventsArgs),
    /// Where the daemon sends events: webhooks, email, programs
    #[command(subcommand)]
    Alert(crate::events::AlertCommand),
    /// Schedules stored in the pool and run by the daemon: snapshot
    /// policies with retention, scrubs, disk self-tests, replication
    #[command(subcommand)]
    Schedule(crate::schedule::ScheduleCommand),
    /// The daemon's configuration file (`tarn daemon --config FILE`)
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Block volumes for virtual machines: create, resize, list
    #[command(subcommand)]
    Volume(crate::volume::VolumeCommand),
    /// Encryption keys: load, unload, change, list
    #[command(subcommand)]
    Key(crate::key::KeyCommand),
    /// Write a snapshot as a stream (to standard output or --to FILE):
    /// `tarn send -i @monday tank/home@tuesday | ssh backup tarn receive tank/home`
    Send(crate::send::SendArgs),
    /// Send a snapshot to another tarn (tarn://) or an object store (s3://),
    /// only what is missing there: `tarn replicate tank/home@tue --to
    /// tarn://backup/vault/home --token-file T --fingerprint FP`
    Replicate(crate::replicate::ReplicateArgs),
    /// This daemon's replication port: its certificate and the tokens of
    /// the tarns that may send here
    #[command(subcommand)]
    Replication(crate::replicate::ReplicationCommand),
    /// Make a snapshot from a stream (standard input or --from FILE)
    #[command(alias = "recv")]
    Receive(crate::send::ReceiveArgs),
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

/// `tarn config ...`.
#[derive(clap::Subcommand, Debug)]
pub enum ConfigCommand {
    /// Check a configuration file as `tarn daemon --config FILE` would
    /// read it, and show what it sets (no daemon needed)
    Check {
        /// The file, e.g. /etc/tarn/tarn.toml
        file: PathBuf,
    },
}

/// What [`run`] leaves to the binary.
#[derive(Debug)]
pub enum Run {
    /// A client command ran; exit with this status.
    Done(ExitCode),
    /// `tarn daemon`: run the daemon in the foreground with these options.
    Daemon(Box<DaemonRun>),
    /// `tarn demo`: create or reuse the demo pool and run its daemon.
    Demo(DemoRun),
}

/// Runs a parsed command line: a client command is sent to the daemon and
/// its answer printed; `tarn daemon` (without `stop` or `ping`) and `tarn
/// demo` come back as [`Run::Daemon`] and [`Run::Demo`], for the binary to
/// run, since this crate holds no server code.
pub fn run(cli: Cli) -> anyhow::Result<Run> {
    let socket = cli.socket.clone().unwrap_or_else(default_socket_path);
    let is_create = matches!(
        cli.command,
        Command::Pool(PoolCommand::Create { .. })
            | Command::Dataset(DatasetCommand::Create { .. })
            | Command::Volume(crate::volume::VolumeCommand::Create { .. })
            | Command::Key(crate::key::KeyCommand::Change { .. })
            | Command::Clone { .. }
    );
    let (format, pool_props) = resolve_output(&cli.output, is_create)?;

    let mut client = Session::new(socket);
    let out = Out::new(format);
    match cli.command {
        Command::Daemon(args) => {
            if let Some(run) = crate::daemon::daemon_command(&mut client, &out, args)? {
                return Ok(Run::Daemon(Box::new(run)));
            }
        }
        Command::Pool(cmd) => crate::pool::pool_command(&mut client, &out, cmd, pool_props)?,
        Command::Object(cmd) => crate::object::object_command(&mut client, &out, cmd)?,
        Command::Dataset(cmd) => {
            crate::dataset::dataset_command(&mut client, &out, cmd, pool_props)?
        }
        Command::User(cmd) => crate::access::user_command(&mut client, &out, cmd)?,
        Command::Share(cmd) => crate::access::share_command(&mut client, &out, cmd)?,
        Command::Link(cmd) => crate::access::link_command(&mut client, &out, cmd)?,
        Command::Bench(args) => crate::bench::bench_command(&mut client, &out, args)?,
        Command::Disk(cmd) => crate::disk::disk_command(&mut client, &out, cmd)?,
        Command::Events(args) => crate::events::events_command(&mut client, &out, args)?,
        Command::Alert(cmd) => crate::events::alert_command(&mut client, &out, cmd)?,
        Command::Schedule(cmd) => crate::schedule::schedule_command(&mut client, &out, cmd)?,
        Command::Config(ConfigCommand::Check { file }) => {
            let loaded = crate::config::load(&file, &daemon_command())?;
            let rows: Vec<Vec<String>> = loaded
                .settings
                .iter()
                .map(|(k, v)| vec![k.clone(), v.clone()])
                .collect();
            let v = serde_json::json!(loaded
                .settings
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>());
            out.raw_or(&v, || {
                format!(
                    "{} is valid: {} settings; flags given to `tarn daemon` override them\n{}",
                    file.display(),
                    rows.len(),
                    if rows.is_empty() {
                        String::new()
                    } else {
                        crate::render::table(&["KEY", "VALUE"], &rows, &[0, 1])
                    }
                )
            })?;
        }
        Command::Volume(cmd) => crate::volume::volume_command(&mut client, &out, cmd, pool_props)?,
        Command::Key(cmd) => crate::key::key_command(&mut client, &out, cmd, pool_props)?,
        Command::Send(args) => crate::send::send(&mut client, args)?,
        Command::Receive(args) => crate::send::receive(&mut client, &out, args)?,
        Command::Replicate(args) => crate::replicate::replicate(&mut client, &out, args)?,
        Command::Replication(cmd) => crate::replicate::replication_command(&mut client, &out, cmd)?,
        Command::Snapshot { recursive, names } => {
            crate::dataset::snapshot(&mut client, &out, names, recursive)?
        }
        Command::Rollback {
            recursive,
            snapshot,
        } => crate::dataset::rollback(&mut client, &out, snapshot, recursive)?,
        Command::Hold {
            recursive,
            tag,
            snapshots,
        } => crate::dataset::hold(&mut client, &out, true, tag, snapshots, recursive)?,
        Command::Release {
            recursive,
            tag,
            snapshots,
        } => crate::dataset::hold(&mut client, &out, false, tag, snapshots, recursive)?,
        Command::Holds {
            recursive,
            snapshots,
        } => crate::dataset::holds(&mut client, &out, snapshots, recursive)?,
        Command::Clone { snapshot, name } => {
            crate::dataset::clone(&mut client, &out, snapshot, name, pool_props)?
        }
        Command::Mount {
            allow_other,
            read_only,
            name,
            mountpoint,
        } => crate::dataset::mount(
            &mut client,
            &out,
            name,
            mountpoint.as_deref(),
            allow_other,
            read_only,
        )?,
        Command::Unmount { name } => crate::dataset::unmount(&mut client, &out, name)?,
        Command::Destroy { recursive, name } => {
            crate::dataset::destroy(&mut client, &out, name, recursive)?
        }
        Command::Demo(args) => return Ok(Run::Demo(DemoRun::from(args))),
    }
    Ok(Run::Done(ExitCode::SUCCESS))
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
                "-o {k}={v}: properties are set only by `tarn pool create`, `tarn dataset create`, \
                 `tarn volume create`, `tarn clone` and `tarn key change`; \
                 elsewhere -o takes `human` or `json`"
            ),
        }
    }
    Ok((format, props))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_max_mib_is_zero_or_in_its_range() {
        let parse = |v: &str| {
            Cli::try_parse_from(["tarn", "daemon", "--dirty-max-mib", v]).map(|c| match c.command {
                Command::Daemon(d) => d.dirty_max_mib,
                _ => None,
            })
        };
        assert_eq!(parse("0").unwrap(), Some(0));
        assert_eq!(parse("16").unwrap(), Some(16));
        assert_eq!(parse("65536").unwrap(), Some(65536));
        for bad in ["1", "15", "65537", "-1", "lots"] {
            assert!(parse(bad).is_err(), "{bad} was taken");
        }
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

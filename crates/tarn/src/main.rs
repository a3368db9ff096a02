//! The `tarn` binary: parses the command line with tarn-cli, then runs a
//! client command (tarn-cli) or, for `tarn daemon` and `tarn demo`, the node
//! itself (tarn-daemon), in the foreground.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tarn_cli::daemon::{DaemonRun, DemoRun};
use tarn_cli::{is_broken_pipe, Cli, Run};
use tarn_daemon::demo::DemoOptions;
use tarn_daemon::{DaemonOptions, ServerOptions};

/// The daemon's log: each line to standard error as its part wrote it
/// ("tarn: …", "tarn-webdav: …"), at or above the level asked; with the
/// syslog priority in front (`<4>…`) when standard error is the journal
/// (systemd says so in `JOURNAL_STREAM`), so `journalctl -p warning`
/// picks the warnings.
struct Logger {
    journal: bool,
}

impl Logger {
    fn install(level: log::LevelFilter) {
        use std::os::unix::fs::MetadataExt;
        let journal = std::env::var("JOURNAL_STREAM").is_ok_and(|want| {
            std::fs::metadata("/proc/self/fd/2")
                .is_ok_and(|m| format!("{}:{}", m.dev(), m.ino()) == want)
        });
        // One logger for the process's life: leaked once, on purpose.
        let logger: &'static Logger = Box::leak(Box::new(Logger { journal }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(level);
        }
    }
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) || redundant(r) {
            return;
        }
        let mut e = std::io::stderr().lock();
        let _ = if self.journal {
            let prio = match r.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            writeln!(e, "<{prio}>{}", r.args())
        } else {
            writeln!(e, "{}", r.args())
        };
    }

    fn flush(&self) {}
}

/// A record that says nothing true: the FUSE library unmounts a
/// filesystem again when its session ends, after tarn-fuse already did
/// (it unmounts by itself to tell a busy mount from a gone one, and
/// reports its own failures), so that second try fails with EINVAL and
/// the library warns "Unmount failed" at every clean stop. That warning
/// is the only one its mount module logs.
fn redundant(r: &log::Record) -> bool {
    r.level() == log::Level::Warn && r.target() == "fuser::mnt"
}

fn main() -> ExitCode {
    // SAFETY: the first statement of `main`; nothing in this program
    // starts a thread before it (see tarn_daemon::heap).
    unsafe { tarn_daemon::heap::share_one_heap() };
    let cli = Cli::parse_args_with(&daemon_flag_defaults());
    Logger::install(log::LevelFilter::Info);
    let outcome = tarn_cli::run(cli).and_then(|run| match run {
        Run::Done(code) => Ok(code),
        Run::Daemon(opts) => {
            log::set_max_level(match opts.log_level.as_str() {
                "error" => log::LevelFilter::Error,
                "warn" => log::LevelFilter::Warn,
                "debug" => log::LevelFilter::Debug,
                _ => log::LevelFilter::Info,
            });
            tarn_daemon::run(daemon_options(*opts))?;
            Ok(ExitCode::SUCCESS)
        }
        Run::Demo(opts) => {
            tarn_daemon::demo::run_demo(&demo_options(opts))?;
            Ok(ExitCode::SUCCESS)
        }
    });
    match outcome {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The daemon's own defaults, which `tarn daemon --help` shows.
fn default_daemon_options() -> DaemonOptions {
    DaemonOptions::new(PathBuf::new(), PathBuf::new())
}

/// The default of each `tarn daemon` flag, by argument id, taken from the
/// options the daemon starts from and the servers' own configurations: one
/// source for what help says and what the daemon does.
fn daemon_flag_defaults() -> Vec<(&'static str, String)> {
    let opts = default_daemon_options();
    let (t, nfs, dav) = (
        &opts.tuning,
        &opts.servers.nfs_limits,
        &opts.servers.webdav_limits,
    );
    let secs = |d: Option<Duration>| d.unwrap_or_default().as_secs().to_string();
    vec![
        ("txg_interval", t.txg_interval_secs.to_string()),
        ("dirty_max_mib", t.dirty_max_mib.to_string()),
        ("cache_mib", t.cache_mib.to_string()),
        ("fuse_threads", t.fuse_threads.to_string()),
        ("admin_max_connections", opts.max_connections.to_string()),
        ("admin_idle_timeout", secs(opts.idle_timeout)),
        ("admin_request_timeout", secs(Some(opts.request_timeout))),
        ("nfs_max_connections", nfs.max_connections.to_string()),
        (
            "nfs_max_connections_per_address",
            nfs.max_connections_per_address.to_string(),
        ),
        ("nfs_idle_timeout", secs(Some(nfs.idle_timeout))),
        (
            "nfs_max_inflight_per_connection",
            nfs.max_inflight_per_connection.to_string(),
        ),
        ("nfs_workers", nfs.workers.to_string()),
        ("webdav_max_connections", dav.max_connections.to_string()),
        (
            "webdav_max_connections_per_address",
            dav.max_connections_per_address.to_string(),
        ),
        ("webdav_header_timeout", secs(Some(dav.header_read_timeout))),
    ]
}

/// A count from the command line (clap bounds it) as a `usize`.
fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `tarn daemon`'s options as the node takes them: its defaults, with what
/// the command line gave; the binary stops on SIGINT and SIGTERM.
fn daemon_options(run: DaemonRun) -> DaemonOptions {
    let mut opts = DaemonOptions::new(run.socket, run.state_dir);
    opts.handle_signals = true;
    let t = &mut opts.tuning;
    let set = |slot: &mut u64, v: Option<u64>| *slot = v.unwrap_or(*slot);
    set(&mut t.txg_interval_secs, run.txg_interval_secs);
    set(&mut t.dirty_max_mib, run.dirty_max_mib);
    set(&mut t.cache_mib, run.cache_mib);
    let l = run.limits;
    let set_count = |slot: &mut usize, v: Option<u64>| *slot = v.map(count).unwrap_or(*slot);
    set_count(&mut t.fuse_threads, run.fuse_threads);
    let set_secs =
        |slot: &mut Duration, v: Option<u64>| *slot = v.map(Duration::from_secs).unwrap_or(*slot);
    set_count(&mut opts.max_connections, l.admin_max_connections);
    if let Some(s) = l.admin_idle_timeout {
        opts.idle_timeout = (s > 0).then(|| Duration::from_secs(s));
    }
    set_secs(&mut opts.request_timeout, l.admin_request_timeout);
    let mut servers = ServerOptions {
        nfs: run.nfs,
        webdav: run.webdav,
        nbd: run.nbd,
        nbd_tls_required: run.nbd_tls_required,
        iscsi: run.iscsi,
        replication: run.replication,
        smb: run.smb,
        smb_include: run.smb_include,
        metrics: run.metrics,
        web: run.web,
        web_origin: run.web_origin,
        metrics_token: run.metrics_token,
        tls_cert: run.tls_cert,
        webdav_plain_http: run.webdav_plain_http,
        ..ServerOptions::default()
    };
    let nfs = &mut servers.nfs_limits;
    set_count(&mut nfs.max_connections, l.nfs_max_connections);
    set_count(
        &mut nfs.max_connections_per_address,
        l.nfs_max_connections_per_address,
    );
    set_secs(&mut nfs.idle_timeout, l.nfs_idle_timeout);
    set_count(
        &mut nfs.max_inflight_per_connection,
        l.nfs_max_inflight_per_connection,
    );
    set_count(&mut nfs.workers, l.nfs_workers);
    let dav = &mut servers.webdav_limits;
    set_count(&mut dav.max_connections, l.webdav_max_connections);
    set_count(
        &mut dav.max_connections_per_address,
        l.webdav_max_connections_per_address,
    );
    set_secs(&mut dav.header_read_timeout, l.webdav_header_timeout);
    opts.servers = servers;
    opts
}

fn demo_options(run: DemoRun) -> DemoOptions {
    DemoOptions {
        dir: run.dir,
        size_mib: run.size_mib,
        nfs_port: run.nfs_port,
        webdav_port: run.webdav_port,
        nbd_port: run.nbd_port,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_cli::cli::Command;

    fn daemon_run(args: &[&str]) -> DaemonRun {
        let cli = Cli::try_parse_with(args, &daemon_flag_defaults()).unwrap();
        let Command::Daemon(_) = &cli.command else {
            panic!("not tarn daemon");
        };
        match tarn_cli::run(cli).unwrap() {
            Run::Daemon(run) => *run,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn daemon_flags_default_to_what_the_daemon_does() {
        // Every id names a flag (command_with panics otherwise), and help
        // shows each default.
        let mut command = Cli::command_with(&daemon_flag_defaults());
        command.build();
        let help = command
            .find_subcommand_mut("daemon")
            .unwrap()
            .render_long_help()
            .to_string();
        for (id, value) in daemon_flag_defaults() {
            let flag = format!("--{}", id.replace('_', "-"));
            let at = help.find(&flag).unwrap_or_else(|| panic!("{flag} in help"));
            let rest = &help[at..];
            let shown = format!("[default: {value}]");
            let next = rest[2..].find("\n      --").map_or(rest.len(), |i| i + 2);
            assert!(
                rest[..next].contains(&shown),
                "{flag} shows {shown}: {rest}"
            );
        }

        // No flag given: exactly the daemon's defaults.
        let run = daemon_run(&["tarn", "daemon", "--socket", "/s", "--state-dir", "/d"]);
        let got = daemon_options(run);
        let want = default_daemon_options();
        assert_eq!(got.tuning, want.tuning);
        assert_eq!(got.servers.nfs_limits, want.servers.nfs_limits);
        assert_eq!(got.servers.webdav_limits, want.servers.webdav_limits);
        assert_eq!(
            (got.max_connections, got.idle_timeout, got.request_timeout),
            (
                want.max_connections,
                want.idle_timeout,
                want.request_timeout
            )
        );
    }

    #[test]
    fn daemon_flags_reach_the_servers() {
        let run = daemon_run(&[
            "tarn",
            "daemon",
            "--txg-interval=7",
            "--admin-max-connections=9",
            "--admin-idle-timeout=0",
            "--admin-request-timeout=3",
            "--nfs-max-connections=11",
            "--nfs-max-connections-per-address=2",
            "--nfs-idle-timeout=30",
            "--nfs-max-inflight-per-connection=4",
            "--nfs-workers=3",
            "--fuse-threads=5",
            "--webdav-max-connections=12",
            "--webdav-max-connections-per-address=5",
            "--webdav-header-timeout=9",
        ]);
        let o = daemon_options(run);
        assert_eq!(o.tuning.txg_interval_secs, 7);
        assert_eq!(o.tuning.fuse_threads, 5);
        assert_eq!(o.max_connections, 9);
        assert_eq!(o.idle_timeout, None, "0: never");
        assert_eq!(o.request_timeout, Duration::from_secs(3));
        let n = o.servers.nfs_limits;
        assert_eq!(
            (
                n.max_connections,
                n.max_connections_per_address,
                n.idle_timeout,
                n.max_inflight_per_connection,
                n.workers
            ),
            (11, 2, Duration::from_secs(30), 4, 3)
        );
        let w = o.servers.webdav_limits;
        assert_eq!(
            (
                w.max_connections,
                w.max_connections_per_address,
                w.header_read_timeout
            ),
            (12, 5, Duration::from_secs(9))
        );
        // Out of range is a usage error.
        for bad in [
            "--nfs-max-connections=0",
            "--webdav-header-timeout=0",
            "--admin-request-timeout=0",
            "--nfs-workers=100000",
            "--fuse-threads=0",
            "--fuse-threads=65",
        ] {
            let err = Cli::try_parse_with(["tarn", "daemon", bad], &daemon_flag_defaults())
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert_eq!(err.exit_code(), 2, "{bad}");
        }
        // Defaults do not count as flags given beside a subcommand.
        assert!(Cli::try_parse_with(["tarn", "daemon", "stats"], &daemon_flag_defaults()).is_ok());
    }
}

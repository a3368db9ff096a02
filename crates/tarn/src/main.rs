//! The `tarn` binary: parses the command line with tarn-cli, then runs a
//! client command (tarn-cli) or, for `tarn daemon` and `tarn demo`, the node
//! itself (tarn-daemon), in the foreground.

use std::io::Write;
use std::process::ExitCode;

use tarn_cli::daemon::{DaemonRun, DemoRun};
use tarn_cli::{is_broken_pipe, Cli, Run};
use tarn_daemon::demo::DemoOptions;
use tarn_daemon::{DaemonOptions, ServerOptions, Tuning};

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let outcome = tarn_cli::run(cli).and_then(|run| match run {
        Run::Done(code) => Ok(code),
        Run::Daemon(opts) => {
            tarn_daemon::run(daemon_options(opts))?;
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

/// `tarn daemon`'s options as the node takes them; the binary stops on
/// SIGINT and SIGTERM.
fn daemon_options(run: DaemonRun) -> DaemonOptions {
    let mut opts = DaemonOptions::new(run.socket, run.state_dir);
    opts.handle_signals = true;
    opts.tuning = Tuning {
        txg_interval_secs: run.txg_interval_secs,
        dirty_max_mib: run.dirty_max_mib,
        cache_mib: run.cache_mib,
    };
    opts.servers = ServerOptions {
        nfs: run.nfs,
        webdav: run.webdav,
        tls_cert: run.tls_cert,
        webdav_plain_http: run.webdav_plain_http,
    };
    opts
}

fn demo_options(run: DemoRun) -> DemoOptions {
    DemoOptions {
        dir: run.dir,
        size_mib: run.size_mib,
        nfs_port: run.nfs_port,
        webdav_port: run.webdav_port,
    }
}

//! The `tarn` binary: parses the command line and runs it. The daemon's
//! backend is chosen here.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use tarn_cli::backend::Backend;
use tarn_cli::cli::{is_broken_pipe, run, Cli};
use tarn_cli::pools::Pools;

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let make_backend = Box::new(|opts: &tarn_cli::daemon::DaemonOptions| {
        let pools = Arc::new(Pools::open(&opts.state_dir, &opts.tuning)?);
        pools.start_servers(&opts.servers)?;
        Ok(pools as Arc<dyn Backend>)
    });
    match run(cli, make_backend) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

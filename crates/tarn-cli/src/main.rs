//! The `tarn` binary: parses the command line and runs it. The daemon's
//! backend is chosen here.

use std::process::ExitCode;
use std::sync::Arc;

use tarn_cli::backend::Backend;
use tarn_cli::cli::{run, Cli};
use tarn_cli::unwired::Unwired;

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let make_backend = Box::new(|_opts: &tarn_cli::daemon::DaemonOptions| {
        Ok(Arc::new(Unwired) as Arc<dyn Backend>)
    });
    match run(cli, make_backend) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

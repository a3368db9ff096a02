//! Client commands run in-process against a daemon with a fake backend:
//! the parts of the CLI that loop (scrub --wait, iostat) and their exit
//! status.

mod common;

use std::process::ExitCode;

use common::TestDaemon;
use tarn_cli::{run, Cli, Run};

fn run_args(daemon: &TestDaemon, args: &[&str]) -> anyhow::Result<ExitCode> {
    let socket = daemon.socket.to_str().unwrap();
    let mut argv = vec!["tarn", "--socket", socket];
    argv.extend_from_slice(args);
    match run(Cli::try_parse_checked(argv).unwrap())? {
        Run::Done(code) => Ok(code),
        other => panic!("client commands never run a daemon: {other:?}"),
    }
}

fn stop(daemon: TestDaemon) {
    daemon.stop();
}

#[test]
fn scrub_wait_polls_until_done_and_fails_on_unrepaired_errors() {
    let daemon = TestDaemon::start(|_| {});
    let err = run_args(&daemon, &["pool", "scrub", "--wait", "tank"]).unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("the scrub of tank found 2 errors it could not repair"),
        "{message}"
    );
    // Started, then polled until it reported finished.
    assert!(
        daemon
            .backend
            .scrub_polls
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 4
    );
    stop(daemon);
}

#[test]
fn iostat_samples_count_times_and_commands_report_api_errors() {
    let daemon = TestDaemon::start(|_| {});
    run_args(
        &daemon,
        &["-o", "json", "pool", "iostat", "tank", "0.05", "3"],
    )
    .unwrap();
    assert_eq!(
        daemon
            .backend
            .iostat_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
    let err = run_args(&daemon, &["pool", "export", "nope"]).unwrap_err();
    let api = err.downcast::<tarn_api::ApiError>().unwrap();
    assert_eq!(api.code, tarn_api::ErrorCode::NotFound);
    assert_eq!(
        run_args(&daemon, &["pool", "list"]).unwrap(),
        ExitCode::SUCCESS
    );
    stop(daemon);
}

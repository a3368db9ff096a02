//! The client refuses a daemon of another admin API major version before
//! sending the command, with a sentence that says what to do.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread;

use tarn_cli::{run, Cli};

/// Answers one connection's first request (the client's ping) with `ping`.
fn fake_daemon(socket: &Path, ping: &'static str) -> thread::JoinHandle<String> {
    let listener = UnixListener::bind(socket).unwrap();
    thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        let mut writer = stream;
        writer
            .write_all(format!("{{\"id\":1,\"result\":{ping}}}\n").as_bytes())
            .unwrap();
        request
    })
}

fn pool_list(socket: &Path) -> String {
    let cli =
        Cli::try_parse_checked(["tarn", "--socket", socket.to_str().unwrap(), "pool", "list"])
            .unwrap();
    format!("{:#}", run(cli).unwrap_err())
}

#[test]
fn a_daemon_of_another_major_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("newer.sock");
    let daemon = fake_daemon(
        &socket,
        r#"{"version":"9.0.0","pid":42,"api_version":"99.1"}"#,
    );
    let err = pool_list(&socket);
    assert!(err.contains("speaks admin API 99.1"), "{err}");
    assert!(err.contains(tarn_api::API_VERSION), "{err}");
    let request = daemon.join().unwrap();
    assert!(request.contains("\"daemon.ping\""), "{request}");

    let socket = dir.path().join("older.sock");
    let daemon = fake_daemon(&socket, r#"{"version":"0.0.1","pid":42}"#);
    let err = pool_list(&socket);
    assert!(err.contains("older, unversioned admin API"), "{err}");
    daemon.join().unwrap();
}

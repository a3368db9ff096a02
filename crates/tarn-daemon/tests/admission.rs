//! The admin socket against clients that hold connections without using
//! them: idle connections are closed after the idle timeout, a request
//! line that trickles in is cut at the request timeout, and both are
//! counted in `daemon.stats`.

mod common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use common::{Raw, TestDaemon};
use serde_json::json;
use tarn_api::method;
use tarn_api::params::DaemonStats;
use tarn_cli::client::Client;

fn stats(daemon: &TestDaemon) -> DaemonStats {
    Client::connect(&daemon.socket)
        .unwrap()
        .call_as(method::DAEMON_STATS, &json!({}))
        .unwrap()
}

fn stop(daemon: TestDaemon) {
    daemon.stop();
}

#[test]
fn idle_connections_are_closed_and_told_why() {
    let daemon = TestDaemon::start(|o| o.idle_timeout = Some(Duration::from_millis(300)));
    let mut raw = Raw::connect(&daemon.socket);
    assert!(raw.call(r#"{"id":1,"method":"daemon.ping"}"#)["result"].is_object());
    let t0 = Instant::now();
    let farewell = raw.recv().expect("a reason before the close");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(10),
        "closed after {waited:?}"
    );
    assert_eq!(farewell["error"]["code"], "busy");
    assert!(
        farewell["error"]["message"]
            .as_str()
            .unwrap()
            .contains("without a request"),
        "{farewell}"
    );
    assert!(raw.recv().is_none(), "closed");

    // The client notices a connection closed while it waited, and the
    // command layer then connects again (see the session).
    let mut client = Client::connect(&daemon.socket).unwrap();
    client.call(method::DAEMON_PING, &json!({})).unwrap();
    assert!(!client.closed_by_daemon(), "open right after a request");
    thread::sleep(Duration::from_millis(800));
    assert!(client.closed_by_daemon(), "closed by the idle timeout");

    // A connection that keeps sending requests is never idle for long.
    let mut busy = Raw::connect(&daemon.socket);
    for i in 0..8 {
        thread::sleep(Duration::from_millis(100));
        let pong = busy.call(&format!(r#"{{"id":{i},"method":"daemon.ping"}}"#));
        assert!(pong["result"].is_object(), "{pong}");
    }

    let s = stats(&daemon);
    assert!(s.admin.idle_closed >= 2, "{s:?}");
    assert_eq!(s.admin.request_timeouts, 0, "{s:?}");
    assert_eq!((s.nfs, s.webdav), (None, None), "the fake runs no servers");
    stop(daemon);
}

#[test]
fn a_trickling_request_is_cut_at_the_request_timeout() {
    let daemon = TestDaemon::start(|o| o.request_timeout = Duration::from_millis(500));
    let mut slow = Raw::connect(&daemon.socket);
    let request = br#"{"id":1,"method":"daemon.ping"}"#;
    let t0 = Instant::now();
    let mut sent = 0;
    // One byte every 50 ms: the line would take 1.6 s; the limit is 0.5 s.
    while sent < request.len() {
        if slow.writer.write_all(&request[sent..sent + 1]).is_err() {
            break;
        }
        sent += 1;
        thread::sleep(Duration::from_millis(50));
    }
    let answer = slow.recv();
    let waited = t0.elapsed();
    let answer = answer.expect("told why");
    assert_eq!(answer["error"]["code"], "busy", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must arrive within"),
        "{answer}"
    );
    assert!(
        sent < request.len(),
        "cut before the line was complete ({sent} bytes after {waited:?})"
    );

    // A prompt request on another connection is answered meanwhile.
    let mut quick = Raw::connect(&daemon.socket);
    assert!(quick.call(r#"{"id":2,"method":"daemon.ping"}"#)["result"].is_object());
    let s = stats(&daemon);
    assert_eq!(s.admin.request_timeouts, 1, "{s:?}");
    stop(daemon);
}

#[test]
fn a_command_waiting_longer_than_the_idle_timeout_connects_again() {
    let daemon = TestDaemon::start(|o| o.idle_timeout = Some(Duration::from_millis(200)));
    let socket = daemon.socket.to_str().unwrap();
    // Two samples 0.6 s apart: the daemon closes the connection between them.
    let argv = [
        "tarn", "--socket", socket, "-o", "json", "pool", "iostat", "tank", "0.6", "2",
    ];
    let cli = tarn_cli::Cli::try_parse_checked(argv).unwrap();
    assert!(matches!(
        tarn_cli::run(cli).unwrap(),
        tarn_cli::Run::Done(_)
    ));
    let calls = &daemon.backend.iostat_calls;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert!(stats(&daemon).admin.idle_closed >= 1);
    stop(daemon);
}

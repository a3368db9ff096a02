//! The admin transport against a fake backend: framing, limits, errors,
//! dispatch, and the stop sequence.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use common::{FakeBackend, Raw, TestDaemon};
use serde_json::{json, Value};
use tarn_api::params::PingResult;
use tarn_api::{call, method, ApiError, ErrorCode, API_VERSION};
use tarn_cli::client::Client;
use tarn_daemon::transport::MAX_REQUEST_BYTES;
use tarn_daemon::{run_daemon, DaemonOptions};

fn code(response: &Value) -> &str {
    response["error"]["code"].as_str().unwrap_or("<none>")
}

fn api_error(e: anyhow::Error) -> ApiError {
    e.downcast::<ApiError>().expect("an API error")
}

#[test]
fn ping_then_stop_exports_and_removes_the_socket() {
    let mut daemon = TestDaemon::start(|_| {});
    let mode = std::fs::metadata(&daemon.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let dir_mode = std::fs::metadata(daemon.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "socket dir mode {dir_mode:o}");

    let mut client = Client::connect(&daemon.socket).unwrap();
    let ping: PingResult = client.call_as(method::DAEMON_PING, &json!({})).unwrap();
    assert_eq!(ping.pid, std::process::id());
    assert_eq!(ping.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(ping.api_version, API_VERSION);

    let stopped = client.call(method::DAEMON_STOP, &Value::Null).unwrap();
    assert_eq!(stopped, Value::Null);
    // The answer comes after the backend was shut down.
    assert_eq!(daemon.backend.shutdowns.load(Ordering::SeqCst), 1);
    daemon.join().unwrap();
    assert!(!daemon.socket.exists(), "socket left behind");
    assert_eq!(daemon.backend.shutdowns.load(Ordering::SeqCst), 1);
}

#[test]
fn oversized_garbage_and_unknown_requests_get_errors_and_service_goes_on() {
    let mut daemon = TestDaemon::start(|_| {});
    let mut raw = Raw::connect(&daemon.socket);

    let mut huge = vec![b'x'; MAX_REQUEST_BYTES + 4096];
    huge.push(b'\n');
    raw.send(&huge);
    let refused = raw.recv().unwrap();
    assert_eq!(code(&refused), "invalid");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("longer than"),
        "{refused}"
    );
    assert_eq!(refused["id"], Value::Null);

    // The same connection keeps working after the oversized line.
    let pong = raw.call(r#"{"id":2,"method":"daemon.ping"}"#);
    assert_eq!(pong["id"], 2);
    assert_eq!(pong["result"]["pid"], std::process::id());

    let garbage = raw.call("{this is not json");
    assert_eq!(code(&garbage), "invalid");
    assert!(garbage["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not valid JSON"));

    let unknown = raw.call(r#"{"id":4,"method":"pool.teleport","params":{}}"#);
    assert_eq!(unknown["id"], 4);
    assert_eq!(code(&unknown), "invalid");
    assert!(unknown["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown method"));

    let not_object = raw.call("[1,2,3]");
    assert_eq!(code(&not_object), "invalid");

    let missing = raw.call(r#"{"id":5,"method":"pool.status","params":{"name":"nope"}}"#);
    assert_eq!(missing["id"], 5);
    assert_eq!(code(&missing), "not_found");

    // Blank lines are skipped, CRLF is tolerated.
    raw.send(b"\n\r\n");
    let status = raw.call("{\"id\":6,\"method\":\"pool.status\"}\r");
    assert_eq!(status["id"], 6);
    assert_eq!(status["result"][0]["name"], "tank");

    // A fresh connection is served too.
    let mut other = Raw::connect(&daemon.socket);
    assert_eq!(
        other.call(r#"{"id":1,"method":"pool.list"}"#)["result"][0]["name"],
        "tank"
    );

    other.call(r#"{"id":9,"method":"daemon.stop"}"#);
    daemon.join().unwrap();
}

#[test]
fn a_panicking_backend_call_is_an_internal_error() {
    let mut daemon = TestDaemon::start(|_| {});
    let mut client = Client::connect(&daemon.socket).unwrap();
    let err = client
        .call(
            method::OBJECT_DELETE,
            &json!({"pool": "tank", "object": "boom"}),
        )
        .unwrap_err();
    let err = api_error(err);
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(err.message.contains("object.delete"), "{}", err.message);
    // Still serving, on the same connection.
    let list = client.call(method::POOL_LIST, &json!({})).unwrap();
    assert_eq!(list[0]["name"], "tank");
    client.call(method::DAEMON_STOP, &json!({})).unwrap();
    daemon.join().unwrap();
}

#[test]
fn at_the_limit_an_idle_connection_makes_room_and_busy_ones_refuse() {
    let mut daemon = TestDaemon::start(|o| o.max_connections = 2);
    let admitted = || {
        let mut raw = Raw::connect(&daemon.socket);
        let pong = raw.call(r#"{"id":1,"method":"daemon.ping"}"#);
        assert!(pong["result"].is_object(), "{pong}");
        raw
    };
    let mut oldest = admitted();
    thread::sleep(Duration::from_millis(30));
    let mut b = admitted();
    thread::sleep(Duration::from_millis(30));

    // Full: the newcomer is served, the connection idle the longest closed.
    let mut c = admitted();
    assert!(
        oldest.recv().is_none(),
        "the longest-idle connection is closed"
    );

    // Every connection running a request: the newcomer is told busy.
    let socket = daemon.socket.clone();
    let sync = br#"{"id":2,"method":"pool.sync","params":{"name":"tank"}}
"#;
    b.send(sync);
    c.send(sync);
    while daemon
        .backend
        .events()
        .iter()
        .filter(|e| **e == "sync started")
        .count()
        < 2
    {
        thread::sleep(Duration::from_millis(5));
    }
    let mut d = Raw::connect(&socket);
    let busy = d.recv().expect("an answer before closing");
    assert_eq!(code(&busy), "busy");
    assert!(busy["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit of 2"));
    assert!(d.recv().is_none(), "the refused connection is closed");
    assert_eq!(b.recv().unwrap()["result"]["txg"], 8);
    assert_eq!(c.recv().unwrap()["result"]["txg"], 8);

    // The client reads a refusal as an API error; once the requests are
    // done, newcomers are served again (evicting an idle one).
    let mut client = Client::connect(&daemon.socket).unwrap();
    let stats: tarn_api::params::DaemonStats =
        client.call_as(method::DAEMON_STATS, &json!({})).unwrap();
    // (At least: the probe that waited for the socket may have counted.)
    assert!(stats.admin.evicted >= 2, "{stats:?}");
    assert_eq!(stats.admin.refused_full, 1, "{stats:?}");
    assert_eq!(stats.admin.open, 2, "{stats:?}");
    client.call(method::DAEMON_STOP, &json!({})).unwrap();
    daemon.join().unwrap();
}

/// A command that has connected and sent (part of) its request is not
/// pushed out by newcomers while silent connections, even younger ones,
/// can make room: a burst of reconnecting idle clients must not close a
/// `tarn` command's connection between its connect and its answer.
#[test]
fn a_request_arriving_is_not_evicted_before_silent_connections() {
    let daemon = TestDaemon::start(|o| o.max_connections = 3);
    let mut talking = Raw::connect(&daemon.socket);
    talking.send(br#"{"id":1,"method":"daemon.ping""#);
    thread::sleep(Duration::from_millis(30));
    let mut silent = Raw::connect(&daemon.socket);
    thread::sleep(Duration::from_millis(30));
    let _younger = Raw::connect(&daemon.socket);
    thread::sleep(Duration::from_millis(30));

    // Two newcomers, each served: two evictions. The talking connection
    // is the oldest that never got an answer, so idle-longest alone
    // would close it first.
    let mut first = Raw::connect(&daemon.socket);
    assert!(first.call(r#"{"id":2,"method":"daemon.ping"}"#)["result"].is_object());
    let mut second = Raw::connect(&daemon.socket);
    assert!(second.call(r#"{"id":3,"method":"daemon.ping"}"#)["result"].is_object());

    talking.send(b"}\n");
    let pong = talking.recv().expect("the arriving request is answered");
    assert!(pong["result"].is_object(), "{pong}");
    assert!(silent.recv().is_none(), "the silent connection made room");
    daemon.stop();
}

/// A connection whose request has run is not evicted while its answer is
/// being written (here: a client slow to read a long answer), even when it
/// is the oldest connection that was never answered before: its client
/// would be told nothing of a request that ran.
#[test]
fn an_answer_being_written_is_not_cut_by_an_eviction() {
    let daemon = TestDaemon::start(|o| o.max_connections = 2);
    // An answer far larger than a socket's buffer: the error repeats the
    // unknown pool's name.
    let name = "n".repeat(600 << 10);
    let mut reading_late = Raw::connect(&daemon.socket);
    reading_late.send(
        format!(r#"{{"id":1,"method":"pool.export","params":{{"name":"{name}"}}}}"#).as_bytes(),
    );
    reading_late.send(b"\n");
    // The request is read and answered; its answer fills the socket
    // (waits for its first bytes, which stay buffered for `recv`).
    std::io::BufRead::fill_buf(&mut reading_late.reader).unwrap();
    thread::sleep(Duration::from_millis(50));
    let mut talking = Raw::connect(&daemon.socket);
    talking.send(b"{");
    thread::sleep(Duration::from_millis(50));

    // The newcomer needs room: the connection whose request is arriving
    // makes it, not the one whose answer is half written.
    let mut newcomer = Raw::connect(&daemon.socket);
    assert!(newcomer.call(r#"{"id":2,"method":"daemon.ping"}"#)["result"].is_object());
    let answer = reading_late.recv().expect("the whole answer");
    assert_eq!(code(&answer), "not_found", "{}", &answer.to_string()[..200]);
    assert!(talking.recv().is_none(), "the arriving request made room");
    daemon.stop();
}

#[test]
fn stop_lets_running_requests_finish_before_shutdown() {
    let mut daemon = TestDaemon::start(|_| {});
    let socket = daemon.socket.clone();
    let syncing = thread::spawn(move || {
        let mut client = Client::connect(&socket).unwrap();
        client.call(method::POOL_SYNC, &json!({"name": "tank"}))
    });
    // Wait until the sync is inside the backend, then ask to stop.
    while !daemon.backend.events().contains(&"sync started") {
        thread::sleep(Duration::from_millis(5));
    }
    let mut client = Client::connect(&daemon.socket).unwrap();
    client.call(method::DAEMON_STOP, &json!({})).unwrap();
    let synced = syncing.join().unwrap().unwrap();
    assert_eq!(synced, json!({"txg": 8}));
    assert_eq!(
        daemon.backend.events(),
        ["sync started", "sync finished", "shutdown"]
    );
    daemon.join().unwrap();
}

#[test]
fn a_live_daemon_is_not_replaced_but_a_stale_socket_is() {
    let mut daemon = TestDaemon::start(|_| {});
    let second = run_daemon(
        DaemonOptions::new(daemon.socket.clone(), daemon.dir.path().join("state2")),
        std::sync::Arc::new(FakeBackend::default()),
    );
    let err = format!("{:#}", second.unwrap_err());
    assert!(
        err.contains("a tarn daemon is already listening on"),
        "{err}"
    );
    assert!(
        daemon.socket.exists(),
        "the live daemon's socket was removed"
    );
    Client::connect(&daemon.socket)
        .unwrap()
        .call(method::DAEMON_STOP, &json!({}))
        .unwrap();
    daemon.join().unwrap();

    // A socket file nobody listens on (a crashed daemon) is replaced.
    let stale = daemon.dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut daemon2 = TestDaemon::start_at(stale.clone());
    Client::connect(&stale)
        .unwrap()
        .call(method::DAEMON_STOP, &json!({}))
        .unwrap();
    daemon2.join().unwrap();
    assert!(!stale.exists());

    // A regular file in the way is not touched.
    let file = daemon.dir.path().join("file.sock");
    std::fs::write(&file, b"keep me").unwrap();
    let err = run_daemon(
        DaemonOptions::new(file.clone(), daemon.dir.path().join("state3")),
        std::sync::Arc::new(FakeBackend::default()),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("is not a socket"), "{err:#}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    // A directory others can write (and not sticky) is refused.
    let open_dir = daemon.dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = run_daemon(
        DaemonOptions::new(open_dir.join("tarn.sock"), daemon.dir.path().join("state4")),
        std::sync::Arc::new(FakeBackend::default()),
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("writable by other users"),
        "{err:#}"
    );

    // A directory another user owns is refused, sticky or not: its owner
    // could swap the socket for theirs (checkable only as root).
    if tarn_api::peer::own_uid() == 0 {
        let theirs = daemon.dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = run_daemon(
            DaemonOptions::new(theirs.join("tarn.sock"), daemon.dir.path().join("state5")),
            std::sync::Arc::new(FakeBackend::default()),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("belongs to uid 65534"),
            "{err:#}"
        );
    }
}

#[test]
fn dispatch_refuses_bad_params_before_the_backend() {
    let backend = FakeBackend::default();
    let err = call(&backend, "pool.frobnicate", Value::Null).unwrap_err();
    assert_eq!(err.code, ErrorCode::Invalid);
    assert!(err.message.contains("pool.status"), "{}", err.message);

    let err = call(
        &backend,
        method::POOL_EXPORT,
        json!({"name": "tank", "forse": true}),
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::Invalid);
    assert!(err.message.contains("forse"), "{}", err.message);

    let err = call(&backend, method::POOL_STATUS, json!([1, 2])).unwrap_err();
    assert_eq!(err.code, ErrorCode::Invalid);

    // Validation runs before the backend (whose create would say `exists`).
    let err = call(
        &backend,
        method::POOL_CREATE,
        json!({"name": "tank", "vdevs": [{"kind": "mirror", "devices": ["/a"]}]}),
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::Invalid);
    assert!(err.message.contains("mirror-0"), "{}", err.message);

    let err = call(&backend, method::DAEMON_STOP, Value::Null).unwrap_err();
    assert_eq!(err.code, ErrorCode::Invalid);

    assert_eq!(
        call(&backend, method::POOL_SYNC, json!({"name": "tank"})).unwrap(),
        json!({"txg": 8})
    );
    assert_eq!(
        call(&backend, method::POOL_IMPORT, Value::Null).unwrap(),
        json!({"candidates": []})
    );
}

/// A stop that could not export a pool says so to whoever asked for it,
/// instead of reporting success (a script's `tarn daemon stop && poweroff`
/// must not take it for a clean stop).
#[test]
fn a_stop_that_failed_to_export_a_pool_is_reported() {
    let mut daemon = TestDaemon::start(|_| {});
    daemon
        .backend
        .shutdown_failures
        .lock()
        .unwrap()
        .push("pool 'tank' was not exported: a device failed".into());
    let mut client = Client::connect(&daemon.socket).unwrap();
    let err = client.call(method::DAEMON_STOP, &Value::Null).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("not cleanly"), "{msg}");
    assert!(msg.contains("a device failed"), "{msg}");
    daemon.join().unwrap();
    assert_eq!(daemon.backend.shutdowns.load(Ordering::SeqCst), 1);
}

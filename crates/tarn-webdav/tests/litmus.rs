//! The litmus WebDAV compliance suite (basic, copymove, props, locks,
//! http) against the server, over a MemBackend and over a real pool.

mod common;

use std::net::SocketAddr;

use common::*;
use tarn_testkit::clients::litmus;
use tarn_testkit::require;
use tarn_webdav::Share;

/// Runs litmus against share `share` of the server as alice.
fn run_litmus(addr: SocketAddr, share: &str) {
    litmus(&url(addr, &format!("/{share}/")), "alice", "secret");
}

#[test]
fn litmus_mem_backend() {
    if !require::programs(&["litmus"]) {
        return;
    }
    let fs = mem_fs();
    let server = start(vec![Share::new("share", fs)]);
    run_litmus(server.local_addr(), "share");
    server.stop();
}

#[test]
fn litmus_real_dataset() {
    if !require::programs(&["litmus"]) {
        return;
    }
    let real = real_fs(512 << 20, pool_opts());
    let server = start(vec![Share::new("tank", real.fs.clone())]);
    run_litmus(server.local_addr(), "tank");
    server.stop();
    real.pool.sync().unwrap();
}

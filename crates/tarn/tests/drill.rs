//! `tarn pool inject`: a drill on a live pool through the CLI. A member
//! that returns flipped bits does not change what is read, and shows in
//! the checksum error counters; faults clear on request.

mod common;

use common::process::{files, Daemon};
use tarn_testkit::data::pattern;

#[test]
fn inject_drill_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 4, 64 << 20);
    d.ok(&[
        "pool",
        "create",
        "-O",
        "compression=off",
        "tank",
        "raidz1",
        &f[0],
        &f[1],
        &f[2],
        &f[3],
    ]);
    let payload = dir.path().join("payload");
    let bytes = pattern(11, 2 << 20);
    std::fs::write(&payload, &bytes).unwrap();
    d.ok(&[
        "object",
        "put",
        "tank",
        "x",
        payload.to_str().unwrap(),
        "--sync",
    ]);

    // Durable is not the same as in its place yet: commit a txg, so the
    // read below comes from the devices, not from the open txg's memory.
    d.ok(&["pool", "sync", "tank"]);
    let out = d.ok(&["pool", "inject", "tank", &f[1], "bitflip"]);
    assert!(out.contains("bitflip (100%)"), "{out}");
    let back = dir.path().join("back");
    d.ok(&["object", "get", "tank", "x", back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == bytes,
        "no wrong bytes are returned"
    );
    let json = d.ok(&["-o", "json", "pool", "status", "tank"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let cksum: u64 = v[0]["vdevs"][0]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["counters"]["cksum_errors"].as_u64().unwrap_or(0))
        .sum();
    assert!(cksum > 0, "the flipped bits were counted: {json}");

    let out = d.ok(&["pool", "inject", "tank", &f[1], "--clear"]);
    assert!(out.contains("no faults"), "{out}");
    let err = d.fails(&["pool", "inject", "tank", &f[1], "gremlins"]);
    assert!(err.contains("bitflip") && err.contains("vanish"), "{err}");
    let err = d.fails(&["pool", "inject", "tank", "/no/such/device", "vanish"]);
    assert!(err.contains("/no/such/device"), "{err}");
    d.stop();
}

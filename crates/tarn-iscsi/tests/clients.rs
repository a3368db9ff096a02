//! libiscsi's command line tools against the server over `MemDevice`:
//! discovery (`iscsi-ls`), INQUIRY (`iscsi-inq`), READ CAPACITY 16
//! (`iscsi-readcapacity16`) and CHAP. Each test skips when its program
//! is missing, and fails instead under `TARN_REQUIRE_ALL`.

mod common;

use common::*;
use tarn_iscsi::{Chap, IscsiTarget};
use tarn_testkit::require;

#[test]
fn iscsi_ls_discovers_the_targets_a_client_may_see() {
    if require::program("iscsi-ls").is_none() {
        return;
    }
    let mut hidden = IscsiTarget::new("iqn.2024-01.org.tarn:hidden", mem(MIB, 512));
    hidden.clients = vec!["10.9.9.0/24".parse().unwrap()];
    let r = start(vec![
        IscsiTarget::new(IQN, mem(64 * MIB, 4096)),
        IscsiTarget::new("iqn.2024-01.org.tarn:second", mem(8 * MIB, 512)),
        hidden,
    ]);
    let port = r.local_addr().port();
    let out = ok(&["iscsi-ls", "-s", &format!("iscsi://127.0.0.1:{port}")]);
    assert!(out.contains(IQN), "{out}");
    assert!(out.contains("iqn.2024-01.org.tarn:second"), "{out}");
    assert!(!out.contains("hidden"), "{out}");
    assert!(out.contains(&format!("127.0.0.1:{port}")), "{out}");
    // -s shows each LUN's size, as the offset of its last block in whole
    // MiB (libiscsi's arithmetic): 63M for 64 MiB.
    assert!(out.contains("Size:63M"), "{out}");
    assert!(out.contains("Size:7M"), "{out}");
}

#[test]
fn iscsi_inq_and_readcapacity16_see_the_device() {
    if !require::programs(&["iscsi-inq", "iscsi-readcapacity16"]) {
        return;
    }
    let r = start(vec![IscsiTarget::new(IQN, mem(64 * MIB, 4096))]);
    let out = ok(&["iscsi-inq", &url(&r, IQN)]);
    assert!(out.contains("TARN"), "{out}");
    let out = ok(&["iscsi-inq", "-e", "1", "-c", "0x80", &url(&r, IQN)]);
    assert!(!out.is_empty());
    let out = ok(&["iscsi-readcapacity16", &url(&r, IQN)]);
    assert!(out.contains("131071") || out.contains("131072"), "{out}");
    assert!(out.to_lowercase().contains("lbpme:1"), "{out}");
}

#[test]
fn chap_logins_need_the_right_secret() {
    if require::program("iscsi-inq").is_none() {
        return;
    }
    let mut t = IscsiTarget::new(IQN, mem(8 * MIB, 512));
    t.chap = Some(Chap::new("alice", "alice-secret-123"));
    let r = start(vec![t]);
    let port = r.local_addr().port();
    let good = format!("iscsi://alice%alice-secret-123@127.0.0.1:{port}/{IQN}/0");
    let bad = format!("iscsi://alice%wrong-secret-99@127.0.0.1:{port}/{IQN}/0");
    ok(&["iscsi-inq", &good]);
    let (worked, out, err) = run(&["iscsi-inq", &bad]);
    assert!(!worked, "a wrong secret logged in:\n{out}\n{err}");
    let (worked, _, _) = run(&["iscsi-inq", &url(&r, IQN)]);
    assert!(!worked, "no CHAP logged in");
    // The server still serves good logins afterwards.
    ok(&["iscsi-inq", &good]);
}

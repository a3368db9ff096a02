//! Encrypted datasets through the real daemon and CLI: a passphrase piped
//! to `dataset create`, files through a FUSE mount that never reach the
//! member files in the clear, `key unload` locking the dataset (unmounted,
//! refused, listed as locked by `pool status`), a wrong passphrase refused,
//! `key change`, a restart that leaves prompt keys locked and loads file
//! keys itself.

mod common;

use common::process::{files, Daemon};
use tarn_testkit::require::{self, is_mounted};

const PASS: &[u8] = b"a long passphrase for tests\n";

fn json(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["-o", "json"];
    a.extend_from_slice(args);
    serde_json::from_str(&d.ok(&a)).expect("json output")
}

/// The `dataset list` row of `name`.
fn row(d: &Daemon, name: &str) -> serde_json::Value {
    json(d, &["dataset", "list"])
        .as_array()
        .expect("a list")
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no dataset {name}"))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypted_datasets_through_the_daemon() {
    if !require::fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let f = files(dir.path(), "m", 3, 64 << 20);
    d.ok(&["pool", "create", "tank", "raidz1", &f[0], &f[1], &f[2]]);
    let mnt = dir.path().join("secret");
    d.create_encrypted("tank/secret", &mnt, PASS);
    assert!(is_mounted(&mnt));
    let canary = b"CANARY-daemon-4f1e9b2c77a0";
    let name = "CANARY-name-0b2d9e61f3";
    std::fs::write(mnt.join(name), canary.repeat(1000)).unwrap();
    // The same in an unencrypted dataset: the search must find those.
    let open_mnt = dir.path().join("open");
    let omp = format!("mountpoint={}", open_mnt.display());
    d.ok(&["dataset", "create", "-o", &omp, "tank/open"]);
    let open_canary = b"CANARY-open-8d2c11e05b";
    let open_name = "CANARY-open-name-77aa31";
    std::fs::write(open_mnt.join(open_name), open_canary.repeat(1000)).unwrap();
    d.ok(&["pool", "sync", "tank"]);
    let (mut open_data, mut open_names) = (false, false);
    for m in &f {
        let bytes = std::fs::read(m).unwrap();
        assert!(!contains(&bytes, canary), "file data in the clear in {m}");
        assert!(
            !contains(&bytes, name.as_bytes()),
            "a file name in the clear in {m}"
        );
        open_data |= contains(&bytes, open_canary);
        open_names |= contains(&bytes, open_name.as_bytes());
    }
    assert!(
        open_data && open_names,
        "the unencrypted dataset's canaries were not found"
    );
    let r = row(&d, "tank/secret");
    assert_eq!(r["encryption"], "aes-256-gcm");
    assert_eq!(r["keystatus"], "available");
    assert_eq!(r["encryptionroot"], "tank/secret");
    let human = d.ok(&["dataset", "list"]);
    assert!(
        human.contains("KEYSTATUS") && human.contains("available"),
        "{human}"
    );
    let get = d.ok(&["dataset", "get", "keyformat,keylocation", "tank/secret"]);
    assert!(
        get.contains("passphrase") && get.contains("prompt"),
        "{get}"
    );
    // Children inherit the key; an unencrypted one is refused inside.
    d.ok(&["dataset", "create", "tank/secret/child"]);
    assert_eq!(
        row(&d, "tank/secret/child")["encryptionroot"],
        "tank/secret"
    );
    let err = d.fails(&["dataset", "create", "-o", "encryption=off", "tank/secret/x"]);
    assert!(err.contains("unencrypted"), "{err}");

    // Unload: unmounted, locked, refused.
    d.ok(&["key", "unload", "tank/secret"]);
    assert!(!is_mounted(&mnt));
    assert_eq!(row(&d, "tank/secret")["keystatus"], "unavailable");
    let status = d.ok(&["pool", "status", "tank"]);
    assert!(
        status.contains("locked") && status.contains("tank/secret/child"),
        "{status}"
    );
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let err = d.fails(&["mount", "tank/secret", other.to_str().unwrap()]);
    assert!(err.contains("key is not loaded"), "{err}");
    let keys = d.ok(&["key", "list"]);
    assert!(
        keys.contains("tank/secret") && keys.contains("unavailable"),
        "{keys}"
    );
    // A wrong passphrase changes nothing.
    let o = d.tarn_input(&["key", "load", "tank/secret"], b"not the passphrase\n");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("wrong"), "{err}");
    assert_eq!(row(&d, "tank/secret")["keystatus"], "unavailable");
    let o = d.tarn_input(&["key", "load", "tank/secret"], PASS);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(is_mounted(&mnt), "mounted again once its key is loaded");
    assert_eq!(std::fs::read(mnt.join(name)).unwrap(), canary.repeat(1000));

    // A new passphrase, then a restart: prompt keys stay locked, file keys
    // are loaded by the daemon.
    let o = d.tarn_input(
        &["key", "change", "tank/secret"],
        b"the second passphrase\n",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let keyfile = dir.path().join("auto.key");
    std::fs::write(&keyfile, format!("{}\n", "5a".repeat(32))).unwrap();
    let loc = format!("keylocation=file://{}", keyfile.display());
    d.ok(&[
        "volume",
        "create",
        "-V",
        "4M",
        "-s",
        "-o",
        "encryption=on",
        "-o",
        "keyformat=hex",
        "-o",
        &loc,
        "tank/auto",
    ]);
    assert_eq!(row(&d, "tank/auto")["keystatus"], "available");
    d.stop();
    let d = Daemon::start(dir.path());
    assert_eq!(row(&d, "tank/secret")["keystatus"], "unavailable");
    assert_eq!(row(&d, "tank/auto")["keystatus"], "available");
    assert!(!is_mounted(&mnt));
    let o = d.tarn_input(&["key", "load", "tank/secret"], PASS);
    assert_eq!(o.status.code(), Some(1), "the old passphrase is refused");
    let o = d.tarn_input(&["key", "load", "-r", "tank"], b"the second passphrase\n");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(is_mounted(&mnt));
    assert_eq!(std::fs::read(mnt.join(name)).unwrap(), canary.repeat(1000));
    d.ok(&["key", "unload", "-a"]);
    assert!(!is_mounted(&mnt));
    assert_eq!(row(&d, "tank/auto")["keystatus"], "unavailable");
    d.ok(&["key", "load", "tank/auto"]);
    assert_eq!(row(&d, "tank/auto")["keystatus"], "available");
}

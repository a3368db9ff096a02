//! Share records in a real pool: one that cannot be read (damaged, or
//! written by a newer tarn with a field this one does not know) is left
//! out and reported by name, and the pool's other shares are still listed
//! and served.

use std::sync::Arc;

use tarn_api::access::{NfsShare, Share};
use tarn_api::pool::{CreateRequest, VdevKind, VdevSpec};
use tarn_api::Backend;
use tarn_daemon::{Node, Pools, Tuning};

fn nfs_share(name: &str, dataset: &str) -> Share {
    Share {
        name: name.into(),
        dataset: dataset.into(),
        nfs: Some(NfsShare {
            clients: vec!["127.0.0.1/32".into()],
            read_only: false,
            root_squash: true,
            all_squash: false,
            anon_uid: 65534,
            anon_gid: 65534,
        }),
        webdav: None,
        nbd: None,
        iscsi: None,
        smb: None,
    }
}

#[test]
fn one_unreadable_share_record_affects_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let member = tarn_testkit::files::make(dir.path(), "m", 1, 256 << 20).remove(0);
    let pools = Arc::new(Pools::open(&dir.path().join("state"), &Tuning::default()).unwrap());
    pools
        .pool_create(&CreateRequest {
            name: "tank".into(),
            vdevs: vec![VdevSpec {
                kind: VdevKind::Single,
                devices: vec![member.to_string_lossy().into_owned()],
            }],
            ashift: None,
            properties: Default::default(),
            force: false,
        })
        .unwrap();
    for ds in ["tank/a", "tank/b", "tank/c"] {
        pools
            .dataset_create(&tarn_api::params::DatasetCreateParams {
                name: ds.to_string(),
                properties: Default::default(),
                parents: false,
                key: None,
            })
            .unwrap();
    }
    for (name, ds) in [("a", "tank/a"), ("b", "tank/b"), ("c", "tank/c")] {
        pools.share_add(&nfs_share(name, ds), None).unwrap();
    }
    let pool = pools.all_pools().pop().unwrap();
    // `b` damaged, `c` from a newer tarn with a field this one does not know.
    tarn_dataset::config_put(&pool, "share", "b", b"{\"name\":\"b\",\"datas").unwrap();
    tarn_dataset::config_put(
        &pool,
        "share",
        "c",
        br#"{"name":"c","dataset":"tank/c","nfs":{"clients":["127.0.0.1/32"]},"expires":1}"#,
    )
    .unwrap();

    let listed = pools.share_list().unwrap();
    let state = |n: &str| {
        let i = listed.iter().find(|i| i.share.name == n).unwrap();
        i.damaged.clone()
    };
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(state("a"), None);
    assert!(
        state("b").is_some_and(|why| why.contains("EOF")),
        "{listed:?}"
    );
    assert!(
        state("c").is_some_and(|why| why.contains("expires")),
        "{listed:?}"
    );
    let good = listed.iter().find(|i| i.share.name == "a").unwrap();
    assert_eq!(good.share, nfs_share("a", "tank/a"));

    // Served: the readable share only.
    let exports = pools.share_lists().nfs;
    let paths: Vec<&str> = exports.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/a"]);

    // A damaged record is removed by name, or replaced by adding it again.
    pools.share_del(None, "b").unwrap();
    pools.share_add(&nfs_share("c", "tank/c"), None).unwrap();
    let listed = pools.share_list().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|i| i.damaged.is_none()), "{listed:?}");
    pools.shutdown();
}

//! Datasets, properties, mounts, users, shares and objects, as tables
//! in the style of `zfs list` and `zfs get`.

use std::fmt::Write as _;

use tarn_api::access::{Access, ShareInfo, UserInfo};
use tarn_api::dataset::{DatasetInfo, DatasetKind, KeyRootInfo, MountInfo, PropValue, Source};
use tarn_api::params::ObjectInfo;

use super::{format_date, format_size, table};

/// `object ls`: NAME SIZE TXG.
pub fn render_objects(pool: &str, objects: &[ObjectInfo]) -> String {
    if objects.is_empty() {
        return format!("no objects in pool {pool}\n");
    }
    let rows: Vec<Vec<String>> = objects
        .iter()
        .map(|o| vec![o.name.clone(), format_size(o.size), o.txg.to_string()])
        .collect();
    table(&["NAME", "SIZE", "TXG"], &rows, &[0])
}

/// `dataset list`: NAME USED AVAIL REFER MOUNTPOINT, like `zfs list`;
/// with ENCRYPTION KEYSTATUS ENCROOT when any dataset listed is encrypted.
pub fn render_datasets(list: &[DatasetInfo]) -> String {
    if list.is_empty() {
        return "no datasets\n".into();
    }
    let crypt = list.iter().any(|d| d.encryption.is_some());
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            let mut row = vec![
                d.name.clone(),
                format_size(d.used),
                d.available.map_or("-".into(), format_size),
                format_size(d.referenced),
                match d.kind {
                    DatasetKind::Snapshot | DatasetKind::Volume => "-".into(),
                    DatasetKind::Filesystem => d.mountpoint.clone().unwrap_or_else(|| "-".into()),
                },
            ];
            if crypt {
                let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
                row.push(d.encryption.clone().unwrap_or_else(|| "off".into()));
                row.push(or_dash(&d.keystatus));
                row.push(or_dash(&d.encryptionroot));
            }
            row
        })
        .collect();
    let mut headers = vec!["NAME", "USED", "AVAIL", "REFER", "MOUNTPOINT"];
    if crypt {
        headers.extend(["ENCRYPTION", "KEYSTATUS", "ENCROOT"]);
    }
    table(&headers, &rows, &[0, 4])
}

/// `key list`: NAME KEYSTATUS KEYFORMAT KEYLOCATION.
pub fn render_keys(list: &[KeyRootInfo]) -> String {
    if list.is_empty() {
        return "no encrypted datasets\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|k| {
            vec![
                k.name.clone(),
                k.keystatus.clone(),
                k.keyformat.clone(),
                k.keylocation.clone(),
            ]
        })
        .collect();
    table(
        &["NAME", "KEYSTATUS", "KEYFORMAT", "KEYLOCATION"],
        &rows,
        &[0, 3],
    )
}

/// `volume list`: NAME VOLSIZE BLOCK USED REFER.
pub fn render_volumes(list: &[DatasetInfo]) -> String {
    if list.is_empty() {
        return "no volumes\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            vec![
                d.name.clone(),
                d.volsize.map_or("-".into(), format_size),
                d.volblocksize.map_or("-".into(), |b| format_size(b as u64)),
                format_size(d.used),
                format_size(d.referenced),
            ]
        })
        .collect();
    table(&["NAME", "VOLSIZE", "BLOCK", "USED", "REFER"], &rows, &[0])
}

/// `tarn mount` without arguments: what the daemon has mounted.
pub fn render_mounts(mounts: &[MountInfo]) -> String {
    if mounts.is_empty() {
        return "nothing is mounted\n".into();
    }
    let rows: Vec<Vec<String>> = mounts
        .iter()
        .map(|m| {
            let mut how = vec![if m.manual { "manual" } else { "property" }];
            if m.read_only {
                how.push("ro");
            }
            if m.allow_other {
                how.push("allow_other");
            }
            vec![m.dataset.clone(), m.mountpoint.clone(), how.join(",")]
        })
        .collect();
    table(&["DATASET", "MOUNTPOINT", "HOW"], &rows, &[0, 1, 2])
}

/// `tarn user list`.
pub fn render_users(users: &[UserInfo]) -> String {
    if users.is_empty() {
        return "no users; add one with `tarn user add NAME`\n".into();
    }
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|u| {
            vec![
                u.name.clone(),
                u.uid.to_string(),
                u.gid.to_string(),
                u.pool.clone(),
                if u.chap { "yes" } else { "-" }.to_string(),
                if u.smb { "yes" } else { "-" }.to_string(),
                if u.admin { "yes" } else { "-" }.to_string(),
            ]
        })
        .collect();
    table(
        &["NAME", "UID", "GID", "POOL", "CHAP", "SMB", "ADMIN"],
        &rows,
        &[0, 3, 4, 5, 6],
    )
}

/// `USER=rw|ro` for each user of a share's access map.
fn access_list(users: &std::collections::BTreeMap<String, Access>) -> Vec<String> {
    users
        .iter()
        .map(|(u, a)| {
            format!(
                "{u}={}",
                match a {
                    Access::Ro => "ro",
                    Access::Rw => "rw",
                }
            )
        })
        .collect()
}

/// `tarn share list`.
pub fn render_shares(shares: &[ShareInfo]) -> String {
    if shares.is_empty() {
        return "no shares; add one with `tarn share add NAME DATASET --nfs CIDR --webdav USER` \
                (a volume: `--nbd CIDR`, `--iscsi auto,client=CIDR`)\n"
            .into();
    }
    let (damaged, shares): (Vec<&ShareInfo>, Vec<&ShareInfo>) =
        shares.iter().partition(|i| i.damaged.is_some());
    let rows: Vec<Vec<String>> = shares
        .iter()
        .map(|i| {
            let s = &i.share;
            let nfs = match &s.nfs {
                None => "-".to_string(),
                Some(n) => {
                    let mut opts = vec![if n.read_only { "ro" } else { "rw" }.to_string()];
                    if n.all_squash {
                        opts.push("all_squash".into());
                    } else if !n.root_squash {
                        opts.push("no_root_squash".into());
                    }
                    format!("{} ({})", n.clients.join(","), opts.join(","))
                }
            };
            let dav = match &s.webdav {
                None => "-".to_string(),
                Some(w) => access_list(&w.users).join(","),
            };
            let nbd = match &s.nbd {
                None => "-".to_string(),
                Some(n) => format!(
                    "{} ({})",
                    n.clients.join(","),
                    if n.read_only { "ro" } else { "rw" }
                ),
            };
            let iscsi = match &s.iscsi {
                None => "-".to_string(),
                Some(i) => {
                    let mut opts = vec![if i.read_only { "ro" } else { "rw" }.to_string()];
                    opts.extend(i.chap.iter().map(|u| format!("chap={u}")));
                    opts.extend(i.mutual_chap.iter().map(|u| format!("mutual={u}")));
                    opts.extend(i.initiators.iter().map(|n| format!("initiator={n}")));
                    let clients = if i.clients.is_empty() {
                        "any".to_string()
                    } else {
                        i.clients.join(",")
                    };
                    format!("{} {clients} ({})", i.iqn, opts.join(","))
                }
            };
            let smb = match &s.smb {
                None => "-".to_string(),
                Some(m) => {
                    let mut opts = access_list(&m.users);
                    if m.guest {
                        opts.push("guest".into());
                    }
                    if m.timemachine {
                        opts.push(if m.tm_quota > 0 {
                            format!("timemachine<={}", crate::render::format_size(m.tm_quota))
                        } else {
                            "timemachine".into()
                        });
                    }
                    match m.encrypt {
                        tarn_api::access::SmbEncrypt::Off => {}
                        tarn_api::access::SmbEncrypt::Desired => opts.push("encrypt".into()),
                        tarn_api::access::SmbEncrypt::Required => {
                            opts.push("encrypt=required".into())
                        }
                    }
                    if m.signing_required {
                        opts.push("signing=required".into());
                    }
                    opts.join(",")
                }
            };
            vec![s.name.clone(), s.dataset.clone(), nfs, dav, smb, nbd, iscsi]
        })
        .collect();
    let mut out = if rows.is_empty() {
        String::new()
    } else {
        table(
            &["NAME", "DATASET", "NFS", "WEBDAV", "SMB", "NBD", "ISCSI"],
            &rows,
            &[0, 1, 2, 3, 4, 5, 6],
        )
    };
    for i in damaged {
        let why = i.damaged.as_deref().unwrap_or_default();
        let name = &i.share.name;
        let _ = writeln!(
            out,
            "share '{name}' in pool '{}' is DAMAGED and not served: its record cannot be read \
             ({why}); `tarn share add {name} ...` replaces it, `tarn share del {name}` removes it",
            i.pool
        );
    }
    out
}

/// Properties whose values are byte counts, shown with units.
const SIZE_PROPS: &[&str] = &[
    "used",
    "available",
    "referenced",
    "logicalused",
    "logicalreferenced",
    "usedbydataset",
    "usedbysnapshots",
    "usedbychildren",
    "written",
    "quota",
    "reservation",
    "recordsize",
];

/// `dataset get`: NAME PROPERTY VALUE SOURCE, like `zfs get`.
pub fn render_props(props: &[PropValue]) -> String {
    let rows: Vec<Vec<String>> = props
        .iter()
        .map(|p| {
            let value = match p.value.parse::<u64>() {
                Ok(n) if SIZE_PROPS.contains(&p.property.as_str()) => format_size(n),
                _ if p.property == "creation" => p
                    .value
                    .parse::<u64>()
                    .map(format_date)
                    .unwrap_or_else(|_| p.value.clone()),
                _ => p.value.clone(),
            };
            let source = match &p.source {
                Source::None => "-".to_string(),
                other => other.to_string(),
            };
            vec![p.dataset.clone(), p.property.clone(), value, source]
        })
        .collect();
    table(
        &["NAME", "PROPERTY", "VALUE", "SOURCE"],
        &rows,
        &[0, 1, 2, 3],
    )
}

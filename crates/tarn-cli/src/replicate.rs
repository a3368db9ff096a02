//! `tarn replicate SNAP --to s3://bucket/prefix` and `tarn receive --from
//! s3://...`: snapshots kept as raw streams in an S3-compatible object
//! store (docs/replication.md). This process moves the bytes between the
//! daemon's admin socket and the store, so the store's credentials stay
//! in the user's environment and never reach the daemon.
//!
//! Replicating finds the newest snapshot of the dataset that the store
//! already has and sends each later one up to SNAP as its own incremental
//! stream (or SNAP whole, the first time). Streams are always raw: an
//! encrypted dataset stays sealed, and the store never needs a key.

use std::collections::HashSet;

use anyhow::{bail, Context};
use tarn_api::dataset::DatasetInfo;
use tarn_api::method;
use tarn_api::params::{DatasetListParams, ReceiveParams, ReceiveResult, SendParams};
use tarn_s3::{Config, Manifest, Store, StreamInfo};

use crate::render::format_size;
use crate::session::{decode, Out, Session};

/// `tarn replicate`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ReplicateArgs {
    /// Where: `s3://BUCKET/PREFIX` (credentials and endpoint from the
    /// environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// TARN_S3_ENDPOINT)
    #[arg(long = "to", value_name = "URL")]
    to: String,
    /// The snapshot, POOL/DATASET@NAME
    snapshot: String,
}

/// A snapshot of one dataset, as the daemon lists it.
struct Snap {
    short: String,
    guid: u64,
    created: u64,
}

/// The snapshots of `fs`, oldest first (by the txg that took them: the
/// list comes in name order, and times tie).
fn snapshots_of(client: &mut Session, fs: &str) -> anyhow::Result<Vec<Snap>> {
    let v = client.call(method::DATASET_LIST, &DatasetListParams { snapshots: true })?;
    let all: Vec<DatasetInfo> = decode(method::DATASET_LIST, v)?;
    let mut snaps: Vec<(u64, Snap)> = all
        .into_iter()
        .filter_map(|i| {
            let (f, s) = i.name.split_once('@')?;
            (f == fs).then(|| {
                let snap = Snap {
                    short: s.to_string(),
                    guid: i.guid,
                    created: i.creation_unix,
                };
                (i.createtxg, snap)
            })
        })
        .collect();
    if snaps.iter().any(|(txg, _)| *txg == 0) {
        bail!("the daemon does not say when its snapshots were taken (createtxg): update it");
    }
    snaps.sort_by_key(|(txg, _)| *txg);
    Ok(snaps.into_iter().map(|(_, s)| s).collect())
}

fn open_store(url: &str) -> anyhow::Result<Store> {
    let cfg = Config::from_env()?;
    Ok(Store::open(cfg, url)?)
}

/// `tarn replicate SNAP --to URL`.
pub(crate) fn replicate(client: &mut Session, out: &Out, a: ReplicateArgs) -> anyhow::Result<()> {
    let Some((fs, short)) = a.snapshot.split_once('@') else {
        bail!("'{}' is not a snapshot (POOL/DATASET@NAME)", a.snapshot);
    };
    let mut store = open_store(&a.to)?;
    let stored: HashSet<u64> = store
        .manifests()
        .with_context(|| format!("reading what {} holds", a.to))?
        .iter()
        .map(|m| m.info.guid)
        .collect();
    let snaps = snapshots_of(client, fs)?;
    let Some(end) = snaps.iter().position(|s| s.short == short) else {
        bail!("'{}' does not exist", a.snapshot);
    };
    let mut lines = Vec::new();
    if stored.contains(&snaps[end].guid) {
        lines.push(format!("{} is already stored at {}", a.snapshot, a.to));
    }
    // Each stream: (base, snapshot).
    let steps: Vec<(Option<&Snap>, &Snap)> = if stored.contains(&snaps[end].guid) {
        Vec::new()
    } else {
        match snaps[..end].iter().rposition(|s| stored.contains(&s.guid)) {
            None => vec![(None, &snaps[end])],
            Some(b) => snaps[b..=end]
                .windows(2)
                .map(|w| (Some(&w[0]), &w[1]))
                .collect(),
        }
    };
    let mut results = Vec::new();
    for (from, to) in steps {
        let info = StreamInfo {
            dataset: fs.to_string(),
            snapshot: to.short.clone(),
            guid: to.guid,
            from_guid: from.map(|f| f.guid),
            from_snapshot: from.map(|f| f.short.clone()),
            created_unix: to.created,
        };
        let mut up = store.upload(info)?;
        let params = SendParams {
            snapshot: Some(format!("{fs}@{}", to.short)),
            from: from.map(|f| format!("@{}", f.short)),
            raw: true,
            ..Default::default()
        };
        client
            .call_body_out(method::DATASET_SEND, &params, &mut up)
            .with_context(|| format!("sending {fs}@{} to {}", to.short, a.to))?;
        let r = up.finish()?;
        lines.push(format!(
            "stored {fs}@{}{} ({}, {} of {} parts sent, {} already there)",
            to.short,
            from.map_or(String::new(), |f| format!(" since @{}", f.short)),
            format_size(r.bytes),
            r.uploaded,
            r.parts,
            r.reused
        ));
        results.push(serde_json::json!({
            "snapshot": format!("{fs}@{}", to.short),
            "from": from.map(|f| f.short.clone()),
            "bytes": r.bytes,
            "parts": r.parts,
            "uploaded": r.uploaded,
            "reused": r.reused,
        }));
    }
    if store.bucket().retries > 0 {
        lines.push(format!(
            "({} requests were retried)",
            store.bucket().retries
        ));
    }
    out.raw_or(&serde_json::Value::Array(results), || {
        lines.iter().map(|l| format!("{l}\n")).collect()
    })
}

/// `tarn receive --from s3://... [--snapshot NAME] NAME`: the chain of
/// stored streams that leads to the snapshot, after what NAME already has.
pub(crate) fn receive_from_store(
    client: &mut Session,
    out: &Out,
    url: &str,
    snapshot: Option<&str>,
    params: ReceiveParams,
) -> anyhow::Result<()> {
    let mut store = open_store(url)?;
    let all = store
        .manifests()
        .with_context(|| format!("reading what {url} holds"))?;
    let target: &Manifest = match snapshot {
        Some(s) => all
            .iter()
            .filter(|m| m.info.snapshot == s)
            .max_by_key(|m| m.info.created_unix)
            .with_context(|| format!("{url} holds no snapshot named '{s}'"))?,
        None => tarn_s3::newest(&all).with_context(|| format!("{url} holds no streams"))?,
    };
    let have: HashSet<u64> = snapshots_of(client, &params.name)?
        .iter()
        .map(|s| s.guid)
        .collect();
    let chain = tarn_s3::chain(&all, target.info.guid, &have)?;
    if chain.is_empty() {
        let msg = format!(
            "{} already has @{} (guid {})",
            params.name, target.info.snapshot, target.info.guid
        );
        return out.raw_or(&serde_json::json!({"snapshots": []}), || format!("{msg}\n"));
    }
    let streams: Vec<Manifest> = chain.iter().map(|m| (*m).clone()).collect();
    let want: Vec<String> = streams
        .iter()
        .map(|m| format!("{}@{}", params.name, m.info.snapshot))
        .collect();
    let mut reader = store.into_reader(streams);
    let v = client.call_body_in(method::DATASET_RECEIVE, &params, &mut reader)?;
    let r: ReceiveResult = decode(method::DATASET_RECEIVE, v.clone())?;
    // Each stream must have made its snapshot: a store that dropped one
    // (or the bytes of one) must not pass for a complete restore.
    if r.snapshots != want {
        bail!(
            "the store's streams made {:?}, not {:?}: the stored chain is incomplete or \
             not what its manifests say",
            r.snapshots,
            want
        );
    }
    out.raw_or(&v, || {
        r.snapshots
            .iter()
            .map(|s| format!("received {s}\n"))
            .collect()
    })
}

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
//!
//! After a replication, the newest snapshot the target has carries a hold
//! tagged `replicate URL` (moved from the one before): it is the base of
//! the next incremental, so a snapshot policy's pruning, or a destroy by
//! hand, cannot take it (see [`hold_base`]).

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
    /// Where: another tarn, `tarn://HOST[:PORT]/POOL/DATASET` (its
    /// replication port, 7450 by default), or an object store,
    /// `s3://BUCKET/PREFIX` (credentials and endpoint from the
    /// environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// TARN_S3_ENDPOINT)
    #[arg(long = "to", value_name = "URL")]
    to: String,
    /// tarn://: a file holding the token the receiver made for this
    /// sender (`tarn replication token add` there)
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// tarn://: the SHA-256 of the receiver's certificate (`tarn
    /// replication info` there); nothing else is trusted
    #[arg(long, value_name = "SHA256")]
    fingerprint: Option<String>,
    /// The snapshot, POOL/DATASET@NAME
    snapshot: String,
}

/// `tarn replication ...`: this daemon's replication port and tokens.
#[derive(clap::Subcommand, Debug)]
pub enum ReplicationCommand {
    /// Where the replication port listens and its certificate's
    /// fingerprint (what senders pin)
    Info,
    /// Tokens that let other tarns send snapshots here
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `tarn replication token ...`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Make a token for a sender, good for receiving into DATASET and
    /// below; it is printed once, only its hash is kept
    Add {
        /// A name for the sender, e.g. office-nas
        label: String,
        /// The dataset it may receive into, e.g. vault/backups
        dataset: String,
    },
    /// List the tokens (labels and datasets, never the tokens)
    List,
    /// Remove a token: its sender can no longer connect
    #[command(alias = "rm")]
    Del {
        /// The token's label
        label: String,
    },
}

/// `tarn replication ...`.
pub(crate) fn replication_command(
    client: &mut Session,
    out: &Out,
    cmd: ReplicationCommand,
) -> anyhow::Result<()> {
    use tarn_api::params::{
        NameParams, NoParams, ReplicationInfo, TokenAddParams, TokenAdded, TokenInfo,
    };
    match cmd {
        ReplicationCommand::Info => {
            let v = client.call(method::REPLICATION_INFO, &NoParams {})?;
            let i: ReplicationInfo = decode(method::REPLICATION_INFO, v.clone())?;
            out.raw_or(&v, || match (&i.listen, &i.fingerprint) {
                (Some(l), Some(f)) => format!(
                    "replication listens on {l} (TLS)\ncertificate SHA-256 {f}\n\nsenders: \
                     tarn replicate SNAP --to tarn://THIS-HOST:{port}/DATASET --token-file F \
                     --fingerprint {f}\n",
                    port = l.rsplit(':').next().unwrap_or("7450")
                ),
                _ => "replication is not started (tarn daemon --replication ADDR:PORT)\n".into(),
            })
        }
        ReplicationCommand::Token(TokenCommand::Add { label, dataset }) => {
            let v = client.call(
                method::REPLICATION_TOKEN_ADD,
                &TokenAddParams { label, dataset },
            )?;
            let t: TokenAdded = decode(method::REPLICATION_TOKEN_ADD, v.clone())?;
            out.raw_or(&v, || format!("{}\n", t.token))
        }
        ReplicationCommand::Token(TokenCommand::List) => {
            let v = client.call(method::REPLICATION_TOKEN_LIST, &NoParams {})?;
            let list: Vec<TokenInfo> = decode(method::REPLICATION_TOKEN_LIST, v.clone())?;
            out.raw_or(&v, || {
                let rows = list
                    .iter()
                    .map(|t| (t.label.as_str(), t.dataset.as_str(), t.created_unix));
                crate::render::token_table("DATASET", rows)
            })
        }
        ReplicationCommand::Token(TokenCommand::Del { label }) => client.call_quietly(
            out,
            method::REPLICATION_TOKEN_DEL,
            &NameParams { name: label },
        ),
    }
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
    if a.to.starts_with("tarn://") {
        return replicate_to_tarn(client, out, &a, fs, short);
    }
    if a.token_file.is_some() || a.fingerprint.is_some() {
        bail!("--token-file and --fingerprint go with --to tarn://...");
    }
    let _run = RunLock::take(client, fs, &a.to)?;
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
    // What the steps send is held while they upload, so pruning cannot
    // destroy it, nor a snapshot of the same name take its place between
    // the listing above (whose guids the manifests record) and its send.
    let mut inflight = InFlight::new(client, fs, &snaps, &a.to)?;
    let mut sending: Vec<&Snap> = Vec::new();
    for (from, to) in &steps {
        sending.extend(from.iter().copied().chain([*to]));
    }
    sending.dedup_by(|x, y| x.short == y.short);
    if !sending.is_empty() {
        let shorts: Vec<&str> = sending.iter().map(|s| s.short.as_str()).collect();
        inflight.hold(client, &shorts)?;
        let now = snapshots_of(client, fs)?;
        if let Some(changed) = sending
            .iter()
            .find(|s| !now.iter().any(|n| n.short == s.short && n.guid == s.guid))
        {
            let _ = inflight.release(client);
            bail!(
                "{fs}@{} changed while the replication was planned (destroyed, or taken \
                 again); run it again",
                changed.short
            );
        }
    }
    let mut results = Vec::new();
    let uploaded = upload_steps(
        client,
        &mut store,
        &steps,
        fs,
        &a.to,
        &mut lines,
        &mut results,
    );
    let released = inflight.release(client);
    if let Err(e) = uploaded {
        // The streams stored before the break are a base for the next
        // run: the hold moves to the newest of them, or pruning could
        // destroy them and the next run would have to start from the
        // older base (a second branch in the store).
        if let Some(&(_, last)) = results.len().checked_sub(1).and_then(|i| steps.get(i)) {
            if let Err(h) = hold_base(client, fs, &last.short, &a.to) {
                return Err(e.context(format!(
                    "and the hold could not move to @{}: {h}",
                    last.short
                )));
            }
        }
        released?;
        return Err(e);
    }
    released?;
    if store.bucket().retries > 0 {
        lines.push(format!(
            "({} requests were retried)",
            store.bucket().retries
        ));
    }
    hold_base(client, fs, short, &a.to)?;
    out.raw_or(&serde_json::Value::Array(results), || {
        lines.iter().map(|l| format!("{l}\n")).collect()
    })
}

/// Uploads each step's stream with its manifest, adding the lines to say
/// and the results to print: one result per step stored, so on an error
/// `results` tells how many were.
fn upload_steps(
    client: &mut Session,
    store: &mut Store,
    steps: &[(Option<&Snap>, &Snap)],
    fs: &str,
    to_url: &str,
    lines: &mut Vec<String>,
    results: &mut Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    for &(from, to) in steps {
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
            .with_context(|| format!("sending {fs}@{} to {to_url}", to.short))?;
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
    Ok(())
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
    // Oldest first (by when they were taken): the chain prefers the newest.
    let have: Vec<u64> = snapshots_of(client, &params.name)?
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

/// `tarn replicate SNAP --to tarn://HOST:PORT/DATASET`: a partial receive
/// there is finished first (with its resume token), then every snapshot
/// after the newest one the receiver has goes as one `-I` series of raw
/// streams with properties, received without mounting.
fn replicate_to_tarn(
    client: &mut Session,
    out: &Out,
    a: &ReplicateArgs,
    fs: &str,
    short: &str,
) -> anyhow::Result<()> {
    use crate::remote::{parse_fingerprint, Remote, Target};
    let target = Target::parse(&a.to)?;
    let fp =
        parse_fingerprint(a.fingerprint.as_deref().context(
            "--fingerprint: the receiver's certificate (`tarn replication info` there)",
        )?)?;
    let token_file = a.token_file.as_deref().context(
        "--token-file: the token the receiver made (`tarn replication token add` there)",
    )?;
    let token = std::fs::read_to_string(token_file)
        .with_context(|| format!("cannot read {}", token_file.display()))?;
    let _run = RunLock::take(client, fs, &a.to)?;
    let name = target.dataset.clone();
    // The sender's mountpoint names a folder on the sender: the copy
    // takes the receiver's own (inherited) instead.
    let receive = |resumable: bool| ReceiveParams {
        name: name.clone(),
        force: false,
        resumable,
        no_mount: true,
        exclude: vec!["mountpoint".into()],
        props_allowed: None,
        keep_wrapping: false,
    };
    // One stream (or series) from the local daemon into the receiver.
    let transfer = |client: &mut Session, send: SendParams| -> anyhow::Result<ReceiveResult> {
        let remote = Remote::connect(&target, &fp, &token)?;
        let v = remote.call_with_body(method::DATASET_RECEIVE, &receive(true), |w| {
            client
                .call_body_out(method::DATASET_SEND, &send, w)
                .map(|_| ())
        })?;
        decode(method::DATASET_RECEIVE, v)
    };
    let mut lines = Vec::new();
    let mut results = Vec::new();

    let mut remote = Remote::connect(&target, &fp, &token)?;
    let listed = remote.call(method::DATASET_LIST, &DatasetListParams { snapshots: true })?;
    let theirs: Vec<DatasetInfo> = decode(method::DATASET_LIST, listed)?;
    let exists = theirs.iter().any(|d| d.name == name);
    let resume_token = if exists {
        let v = remote.call(
            method::DATASET_GET,
            &tarn_api::params::DatasetGetParams {
                name: name.clone(),
                properties: vec!["receive_resume_token".into()],
            },
        )?;
        v[0]["value"]
            .as_str()
            .filter(|t| *t != "-" && !t.is_empty())
            .map(str::to_string)
    } else {
        None
    };
    let ours: HashSet<u64> = snapshots_of(client, fs)?.iter().map(|s| s.guid).collect();
    // The token comes from the receiver: it is followed only when it asks
    // for a raw stream of one of this dataset's snapshots. Anything else
    // (a snapshot destroyed here since, another sender's stream, a token
    // that would make this daemon send plaintext) is abandoned there.
    let resume_token = match resume_token {
        Some(t) if resume_token_is_ours(&t, &ours) => Some(t),
        Some(_) => {
            remote.call(
                method::DATASET_RECEIVE_ABORT,
                &tarn_api::params::NameParams { name: name.clone() },
            )?;
            lines.push(format!(
                "abandoned a partial receive into {name} that is not of {fs}'s snapshots"
            ));
            None
        }
        None => None,
    };
    drop(remote);
    // What the receiver has, by guid.
    let theirs_now = || -> anyhow::Result<HashSet<u64>> {
        let mut remote = Remote::connect(&target, &fp, &token)?;
        let listed = remote.call(method::DATASET_LIST, &DatasetListParams { snapshots: true })?;
        let theirs: Vec<DatasetInfo> = decode(method::DATASET_LIST, listed)?;
        Ok(theirs
            .iter()
            .filter(|d| d.name.split_once('@').is_some_and(|(f, _)| f == name))
            .map(|d| d.guid)
            .collect())
    };
    // A transfer that broke part way may have left the receiver with
    // newer snapshots than the held base: the hold moves to the newest of
    // them, so pruning here never takes what the next incremental needs.
    let broke = |client: &mut Session, e: anyhow::Error| -> anyhow::Error {
        let moved = theirs_now().and_then(|have| {
            let snaps = snapshots_of(client, fs)?;
            match snaps.iter().rposition(|s| have.contains(&s.guid)) {
                Some(b) => hold_base(client, fs, &snaps[b].short, &a.to),
                None => Ok(()),
            }
        });
        match moved {
            Ok(()) => e,
            Err(h) => e.context(format!(
                "and the hold on the base could not be moved: {h:#}"
            )),
        }
    };
    if let Some(t) = resume_token {
        let r = transfer(
            client,
            SendParams {
                token: Some(t),
                raw: true,
                ..Default::default()
            },
        )
        .context("finishing the partial receive")
        .map_err(|e| broke(client, e))?;
        lines.extend(
            r.snapshots
                .iter()
                .map(|s| format!("resumed and received {s}")),
        );
        results.extend(r.snapshots.clone());
    }
    let have = theirs_now()?;
    let snaps = snapshots_of(client, fs)?;
    let mut inflight = InFlight::new(client, fs, &snaps, &a.to)?;
    let Some(end) = snaps.iter().position(|s| s.short == short) else {
        bail!("'{fs}@{short}' does not exist");
    };
    if have.contains(&snaps[end].guid) {
        lines.push(format!("{} already has {fs}@{short}", a.to));
    } else {
        let base = snaps[..end].iter().rposition(|s| have.contains(&s.guid));
        if base.is_none() && !have.is_empty() {
            bail!(
                "{} has snapshots, but none of {fs}'s: replicate into a new dataset, or \
                 destroy it there",
                a.to
            );
        }
        let send = SendParams {
            snapshot: Some(format!("{fs}@{short}")),
            from: base.map(|b| format!("@{}", snaps[b].short)),
            intermediates: base.is_some(),
            raw: true,
            props: true,
            ..Default::default()
        };
        // The base (held already) and every snapshot the series sends.
        let sending: Vec<&str> = snaps[base.unwrap_or(end)..=end]
            .iter()
            .map(|s| s.short.as_str())
            .collect();
        inflight.hold(client, &sending)?;
        let r = transfer(client, send).map_err(|e| {
            let e = broke(client, e);
            match inflight.release(client) {
                Ok(()) => e,
                Err(h) => e.context(format!("and the snapshots sent stay held: {h:#}")),
            }
        })?;
        lines.extend(r.snapshots.iter().map(|s| format!("received {s}")));
        results.extend(r.snapshots);
    }
    hold_base(client, fs, short, &a.to)?;
    inflight.release(client)?;
    out.raw_or(&serde_json::json!({ "received": results }), || {
        lines.iter().map(|l| format!("{l}\n")).collect()
    })
}

/// The tag of the hold on the base of the next incremental to `to`:
/// `replicate URL`, or a digest of a URL too long for a tag.
pub(crate) fn hold_tag(to: &str) -> String {
    tag_for("replicate", to)
}

/// `WHAT URL`, or `WHAT sha256:…` for a URL too long for a tag.
fn tag_for(what: &str, to: &str) -> String {
    let tag = format!("{what} {to}");
    if tag.len() <= 128 {
        return tag;
    }
    format!("{what} sha256:{}", sha256_hex(to, 16))
}

/// The first `n` bytes of the SHA-256 of `s`, in hex.
fn sha256_hex(s: &str, n: usize) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref()[..n].iter().map(|b| format!("{b:02x}")).collect()
}

/// One run at a time of a dataset to one target. A run releases the
/// `sending` holds it finds for its target as left by a run that died
/// ([`InFlight::new`]), and at its end its own: two runs at once would
/// release each other's, and pruning could then destroy a snapshot
/// while it travels. So a run first takes an exclusive lock on a file
/// beside the daemon's admin socket (its directory is the daemon user's,
/// and only that user and root may talk to the daemon, so every run
/// against this daemon, by hand or by a schedule, finds the same file).
/// The kernel drops the lock when the process ends, however it ends, so
/// a run that died leaves nothing behind that would block the next. It
/// is taken before the run plans (lists what the target has), not only
/// around the holds: a plan made while another run uploads is stale.
pub(crate) struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    /// Takes the lock of `fs` to `to`, or says that another run has it.
    pub(crate) fn take(client: &Session, fs: &str, to: &str) -> anyhow::Result<RunLock> {
        let dir = client
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let hex = sha256_hex(&format!("{fs}\0{to}"), 12);
        Self::take_at(&dir.join(format!("replicate-{hex}.lock")), fs, to)
    }

    fn take_at(path: &std::path::Path, fs: &str, to: &str) -> anyhow::Result<RunLock> {
        use std::os::unix::fs::OpenOptionsExt;
        // Readable by all: a lock file root made must still open for the
        // daemon's user (a shared lock needs no write access).
        let file = match std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
        {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => std::fs::File::open(path),
            r => r,
        }
        .with_context(|| format!("cannot open the replication lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(RunLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "another replication of {fs} to {to} is running; run this again when it has \
                 ended"
            ),
            Err(std::fs::TryLockError::Error(e)) => Err(e)
                .with_context(|| format!("cannot lock the replication lock {}", path.display())),
        }
    }
}

/// The holds on the snapshots a transfer to `to` is sending, so that a
/// snapshot policy's pruning cannot destroy one while it travels (the
/// send itself would finish, but the hold on the new base, and the next
/// part of a series, would find it gone, and every later run would find
/// no common snapshot). Tag `sending URL`; a run that died with them in
/// place leaves them to the next run to the same target, which releases
/// them first.
struct InFlight {
    tag: String,
    fs: String,
    held: Vec<String>,
}

impl InFlight {
    /// Releases what an earlier run to `to` left held on `snaps`, the
    /// dataset's snapshots as just listed.
    fn new(client: &mut Session, fs: &str, snaps: &[Snap], to: &str) -> anyhow::Result<InFlight> {
        use tarn_api::dataset::HoldInfo;
        use tarn_api::params::{HoldParams, HoldsParams};
        let tag = tag_for("sending", to);
        let names: Vec<String> = snaps.iter().map(|s| format!("{fs}@{}", s.short)).collect();
        let v = client.call(
            method::DATASET_HOLDS,
            &HoldsParams {
                snapshots: names,
                recursive: false,
            },
        )?;
        let holds: Vec<HoldInfo> = decode(method::DATASET_HOLDS, v)?;
        let stale: Vec<String> = holds
            .into_iter()
            .filter(|h| h.tag == tag)
            .map(|h| h.snapshot)
            .collect();
        if !stale.is_empty() {
            client.call(
                method::DATASET_RELEASE,
                &HoldParams {
                    tag: tag.clone(),
                    snapshots: stale,
                    recursive: false,
                },
            )?;
        }
        Ok(InFlight {
            tag,
            fs: fs.to_string(),
            held: Vec::new(),
        })
    }

    /// Holds `shorts` of the dataset for the transfer; refused (nothing
    /// held) if one was destroyed since it was listed.
    fn hold(&mut self, client: &mut Session, shorts: &[&str]) -> anyhow::Result<()> {
        let names: Vec<String> = shorts.iter().map(|s| format!("{}@{s}", self.fs)).collect();
        client
            .call(
                method::DATASET_HOLD,
                &tarn_api::params::HoldParams {
                    tag: self.tag.clone(),
                    snapshots: names.clone(),
                    recursive: false,
                },
            )
            .with_context(|| format!("holding {} while it is sent", names.join(", ")))?;
        self.held = names;
        Ok(())
    }

    /// The transfer is over: its snapshots may be pruned again.
    fn release(&mut self, client: &mut Session) -> anyhow::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        client.call(
            method::DATASET_RELEASE,
            &tarn_api::params::HoldParams {
                tag: self.tag.clone(),
                snapshots: std::mem::take(&mut self.held),
                recursive: false,
            },
        )?;
        Ok(())
    }
}

/// Moves the hold of target `to` onto its new base: `fs@short` (which the
/// target now has), unless a newer snapshot holds it already (a replication
/// of an older snapshot by hand); the tag's holds on other snapshots of
/// `fs` are released.
fn hold_base(client: &mut Session, fs: &str, short: &str, to: &str) -> anyhow::Result<()> {
    use tarn_api::dataset::HoldInfo;
    use tarn_api::params::{HoldParams, HoldsParams};
    let tag = hold_tag(to);
    let snaps = snapshots_of(client, fs)?;
    let names: Vec<String> = snaps.iter().map(|s| format!("{fs}@{}", s.short)).collect();
    let v = client.call(
        method::DATASET_HOLDS,
        &HoldsParams {
            snapshots: names.clone(),
            recursive: false,
        },
    )?;
    let holds: Vec<HoldInfo> = decode(method::DATASET_HOLDS, v)?;
    let ours: Vec<&str> = holds
        .iter()
        .filter(|h| h.tag == tag)
        .map(|h| h.snapshot.as_str())
        .collect();
    let sent = format!("{fs}@{short}");
    // Oldest first: the base is the newest of what was sent and held.
    let base = names
        .iter()
        .rev()
        .find(|n| **n == sent || ours.contains(&n.as_str()))
        .cloned()
        .unwrap_or(sent);
    if !ours.contains(&base.as_str()) {
        client
            .call(
                method::DATASET_HOLD,
                &HoldParams {
                    tag: tag.clone(),
                    snapshots: vec![base.clone()],
                    recursive: false,
                },
            )
            .with_context(|| format!("holding {base}, the base of the next incremental"))?;
    }
    let old: Vec<String> = ours
        .iter()
        .filter(|n| **n != base)
        .map(|n| n.to_string())
        .collect();
    if !old.is_empty() {
        client.call(
            method::DATASET_RELEASE,
            &HoldParams {
                tag,
                snapshots: old,
                recursive: false,
            },
        )?;
    }
    Ok(())
}

/// Whether a receiver's resume token asks for a raw stream of one of
/// `ours` (from one of `ours`, if incremental). The token is lowercase hex
/// of JSON (docs/format.md, "Send streams").
fn resume_token_is_ours(token: &str, ours: &HashSet<u64>) -> bool {
    let bytes: Option<Vec<u8>> = (0..token.len() / 2)
        .map(|i| u8::from_str_radix(token.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let Some(v) = bytes.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()) else {
        return false;
    };
    let raw = v["raw"].as_bool() == Some(true);
    let to = v["guid"].as_u64().is_some_and(|g| ours.contains(&g));
    let from = match &v["from_guid"] {
        serde_json::Value::Null => true,
        f => f.as_u64().is_some_and(|g| ours.contains(&g)),
    };
    raw && to && from && token.len().is_multiple_of(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(v: serde_json::Value) -> String {
        serde_json::to_vec(&v)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn one_run_per_dataset_and_target_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let s = Session::new(dir.path().join("tarn.sock"));
        let first = RunLock::take(&s, "tank/a", "s3://b/p").unwrap();
        let err = RunLock::take(&s, "tank/a", "s3://b/p")
            .err()
            .expect("a second run");
        assert!(err.to_string().contains("is running"), "{err}");
        // Another target, or another dataset, is another lock.
        let _other = RunLock::take(&s, "tank/a", "s3://b/q").unwrap();
        let _other = RunLock::take(&s, "tank/b", "s3://b/p").unwrap();
        drop(first);
        RunLock::take(&s, "tank/a", "s3://b/p").expect("free again");
    }

    #[test]
    fn hold_tags_fit() {
        assert_eq!(hold_tag("s3://b/p"), "replicate s3://b/p");
        let long = format!("s3://b/{}", "x".repeat(200));
        let t = hold_tag(&long);
        assert!(t.len() <= 128 && t.starts_with("replicate sha256:"), "{t}");
        assert_ne!(t, hold_tag(&format!("{long}y")));
    }

    /// A receiver's resume token is followed only for a raw stream of
    /// one of our snapshots (from one of ours).
    #[test]
    fn resume_tokens_from_a_receiver_are_checked() {
        let ours = HashSet::from([1u64, 2]);
        let t = |raw: bool, guid: u64, from: Option<u64>| {
            token(serde_json::json!({
                "version": 1, "guid": guid, "from_guid": from, "raw": raw,
                "after": null, "name": "s", "source": "tank/a"
            }))
        };
        assert!(resume_token_is_ours(&t(true, 2, Some(1)), &ours));
        assert!(resume_token_is_ours(&t(true, 1, None), &ours));
        assert!(
            !resume_token_is_ours(&t(false, 2, Some(1)), &ours),
            "not raw"
        );
        assert!(
            !resume_token_is_ours(&t(true, 3, Some(1)), &ours),
            "not ours"
        );
        assert!(
            !resume_token_is_ours(&t(true, 2, Some(9)), &ours),
            "base not ours"
        );
        assert!(!resume_token_is_ours("zz", &ours));
        assert!(!resume_token_is_ours("7b7", &ours));
        assert!(!resume_token_is_ours("", &ours));
    }
}

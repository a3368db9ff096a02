//! `tarn send` and `tarn receive` (ZFS's `zfs send` / `zfs receive`): a
//! snapshot as a stream on standard output or in a file, and a stream
//! from standard input or a file made a snapshot again. The stream passes
//! through this process on its way to or from the daemon (a framed body
//! on the admin socket), so `tarn send ... | ssh host tarn receive ...`
//! works as it does with ZFS.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use tarn_api::method;
use tarn_api::params::{NameParams, ReceiveParams, ReceiveResult, SendParams, SendResult};

use crate::session::{decode, Out, Session};

/// `tarn send`'s arguments.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// Send only what changed since this earlier snapshot (`@name` or
    /// its full name)
    #[arg(short = 'i', value_name = "SNAPSHOT", conflicts_with = "all_from")]
    from: Option<String>,
    /// Like -i, with every snapshot in between (one stream each)
    #[arg(short = 'I', value_name = "SNAPSHOT")]
    all_from: Option<String>,
    /// Raw: blocks and values as stored (an encrypted dataset stays
    /// sealed; the receiver never needs its key)
    #[arg(short = 'w', long)]
    raw: bool,
    /// Send the dataset's local properties too
    #[arg(short = 'p', long)]
    props: bool,
    /// Replicate: the dataset and every one below it that has this
    /// snapshot, each with its snapshots up to it (since -i/-I where it
    /// has that one) and its properties; received below the target
    #[arg(short = 'R', long = "replicate")]
    replicate: bool,
    /// Continue the receive this token (the target's
    /// receive_resume_token) stands for
    #[arg(short = 't', value_name = "TOKEN", conflicts_with_all = ["from", "all_from", "replicate"])]
    token: Option<String>,
    /// Write the stream to this file instead of standard output
    #[arg(long = "to", value_name = "FILE")]
    to: Option<PathBuf>,
    /// Say on standard error what was sent
    #[arg(short = 'v', long)]
    verbose: bool,
    /// The snapshot, POOL/DATASET@NAME
    #[arg(required_unless_present = "token")]
    snapshot: Option<String>,
}

/// `tarn receive`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ReceiveArgs {
    /// Roll the target back to the stream's base first (destroying newer
    /// snapshots and changes)
    #[arg(short = 'F')]
    force: bool,
    /// Keep what arrived if the stream breaks off: `tarn send -t` with
    /// the target's receive_resume_token continues it
    #[arg(short = 's')]
    resumable: bool,
    /// Do not mount the received filesystem
    #[arg(short = 'u')]
    no_mount: bool,
    /// Do not set this property the stream carries (`-p`/`-R`) on a
    /// dataset it creates, e.g. -x mountpoint; may be repeated
    #[arg(short = 'x', value_name = "PROP")]
    exclude: Vec<String>,
    /// Abandon a partial resumable receive into the dataset instead
    #[arg(short = 'A', conflicts_with_all = ["force", "resumable", "from"])]
    abort: bool,
    /// Read the stream from this file instead of standard input, or
    /// from an object store (`s3://BUCKET/PREFIX`, as `tarn replicate`
    /// left it: every stream the target lacks, up to the newest)
    #[arg(long = "from", value_name = "FILE|URL")]
    from: Option<PathBuf>,
    /// With --from s3://...: up to this snapshot (its short name) instead
    /// of the newest
    #[arg(long = "snapshot", value_name = "NAME", requires = "from")]
    snapshot: Option<String>,
    /// The dataset the stream becomes (or, incremental, updates)
    name: String,
}

pub(crate) fn send(client: &mut Session, a: SendArgs) -> anyhow::Result<()> {
    let params = SendParams {
        snapshot: a.snapshot,
        from: a.from.clone().or(a.all_from.clone()),
        intermediates: a.all_from.is_some(),
        raw: a.raw,
        props: a.props,
        token: a.token,
        replicate: a.replicate,
    };
    let v = match &a.to {
        Some(path) => {
            let mut f = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let v = client.call_body_out(method::DATASET_SEND, &params, &mut f)?;
            f.sync_all()
                .with_context(|| format!("cannot write {}", path.display()))?;
            v
        }
        None => {
            let stdout = std::io::stdout();
            if stdout.is_terminal() {
                bail!(
                    "a send stream is binary: redirect it (`> FILE`, `| tarn receive ...`) or \
                     give --to FILE"
                );
            }
            let mut out = stdout.lock();
            let v = client.call_body_out(method::DATASET_SEND, &params, &mut out)?;
            out.flush().context("writing the stream")?;
            v
        }
    };
    let r: SendResult = decode(method::DATASET_SEND, v)?;
    if a.verbose {
        eprintln!(
            "sent {} bytes in {} stream(s): {} entries, {} blocks read",
            r.bytes, r.streams, r.items, r.blocks_read
        );
    }
    Ok(())
}

pub(crate) fn receive(client: &mut Session, out: &Out, a: ReceiveArgs) -> anyhow::Result<()> {
    if a.abort {
        return client.call_quietly(
            out,
            method::DATASET_RECEIVE_ABORT,
            &NameParams { name: a.name },
        );
    }
    let params = ReceiveParams {
        name: a.name,
        force: a.force,
        resumable: a.resumable,
        no_mount: a.no_mount,
        exclude: a.exclude,
        props_allowed: None,
        keep_wrapping: false,
    };
    if let Some(url) = a
        .from
        .as_ref()
        .and_then(|p| p.to_str())
        .filter(|p| p.starts_with("s3://"))
    {
        return crate::replicate::receive_from_store(
            client,
            out,
            url,
            a.snapshot.as_deref(),
            params,
        );
    }
    if a.snapshot.is_some() {
        bail!("--snapshot goes with --from s3://...");
    }
    let v = match &a.from {
        Some(path) => {
            let mut f = std::fs::File::open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            client.call_body_in(method::DATASET_RECEIVE, &params, &mut f)?
        }
        None => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!("pipe a send stream in (`tarn send ... | tarn receive ...`), or give --from FILE");
            }
            client.call_body_in(method::DATASET_RECEIVE, &params, &mut stdin.lock())?
        }
    };
    let r: ReceiveResult = decode(method::DATASET_RECEIVE, v.clone())?;
    out.raw_or(&v, || {
        let skipped = r
            .skipped
            .iter()
            .map(|s| format!("skipped {s} (already here)\n"));
        r.snapshots
            .iter()
            .map(|s| format!("received {s}\n"))
            .chain(skipped)
            .collect()
    })
}

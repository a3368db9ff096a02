//! tarn-send: send and receive streams of datasets. A snapshot leaves as
//! a stream (whole, or what changed since an older snapshot; plain or
//! raw), and a stream becomes a snapshot of a dataset on this or another
//! pool: backups, moves, and offsite copies that never see a key.
//!
//! The layers: `tarn_dataset::send` and `tarn_dataset::recv` read and
//! write the trees; [`stream`] is the byte format, documented in
//! docs/format.md ("Send streams"); this crate joins them: [`send`] walks
//! a snapshot into a writer, [`receive`] applies what a reader holds.
//! Several streams may follow each other in one input (`send -I`, and
//! `send -R`, whose streams each name their dataset's place below the
//! package's top): they are received in order, and those whose snapshot
//! the target already has are skipped, so a series sent again after a
//! break finishes it.

#![warn(missing_docs)]

pub mod stream;

use std::io::{Read, Write};
use std::sync::Arc;

use tarn_dataset::recv::{Receiver, RecvOptions, Token};
use tarn_dataset::send::{SendItem, SendSource, SendStats};
use tarn_dataset::DsError;
use tarn_pool::Pool;

use stream::{Header, Record, StreamReader, StreamWriter, MAGIC, VERSION};

/// Errors of send and receive.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// A stream that is malformed, damaged, cut short or of another
    /// version: what is wrong with it.
    #[error("bad stream: {0}")]
    Stream(String),
    /// The dataset layer refused (no such snapshot, locked, exists, ...).
    #[error("{0}")]
    Dataset(#[from] DsError),
    /// Reading or writing the stream failed.
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// What to send.
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// Send only what changed since this snapshot (`@name` or a full
    /// name): `-i`.
    pub from: Option<String>,
    /// With `from`: one stream for every snapshot in between (`-I`).
    pub intermediates: bool,
    /// Values and blocks as stored (`-w`): an encrypted dataset leaves
    /// sealed, and needs no key.
    pub raw: bool,
    /// The dataset's local properties travel with it (`-p`).
    pub props: bool,
    /// Continue the stream a resumable receive broke off (`-t`).
    pub token: Option<String>,
    /// A replication package (`-R`): the dataset and every one below it
    /// that has a snapshot of that name, each with its snapshots up to it
    /// (since `from`, for those that have it) and its properties.
    pub replicate: bool,
}

/// What a send did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Streams written (more than one with `-I`).
    pub streams: u64,
    /// Bytes written.
    pub bytes: u64,
    /// What was read.
    pub stats: SendStats,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One stream to send: the snapshot, its base, and (in a package) where
/// it goes below the package's top.
struct Part {
    snap: String,
    from: Option<String>,
    rel: Option<String>,
    /// `[i, n]` when one send writes several streams.
    part: Option<[u32; 2]>,
}

/// Writes one stream of `part` to `out`.
fn send_one<W: Write>(
    pool: &Arc<Pool>,
    part: &Part,
    opts: &SendOptions,
    after: Option<Vec<u8>>,
    out: W,
) -> Result<(W, u64, SendStats), SendError> {
    let props = opts.props || part.rel.is_some();
    let src = SendSource::open(pool, &part.snap, part.from.as_deref(), opts.raw, props)?;
    let header = Header {
        magic: MAGIC.into(),
        version: VERSION,
        info: src.info().clone(),
        resume_after: after.as_deref().map(hex),
        rel: part.rel.clone(),
        part: part.part,
    };
    let mut w = StreamWriter::begin(out, &header)?;
    let mut failed: Option<SendError> = None;
    let stats = src.run(after.as_deref(), &mut |item| match w.item(&item) {
        Ok(()) => Ok(true),
        Err(e) => {
            failed = Some(e);
            Ok(false)
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let (out, bytes) = w.end()?;
    Ok((out, bytes, stats))
}

/// The snapshots of `snap`'s dataset from `from` (excluded) to `snap`, in
/// order: what `-I` sends one after the other.
fn series(pool: &Arc<Pool>, snap: &str, from: &str) -> Result<Vec<String>, SendError> {
    let (fs, _) = snap
        .split_once('@')
        .ok_or_else(|| DsError::Invalid(format!("'{snap}' is not a snapshot")))?;
    let h = tarn_dataset::open(pool, fs)?;
    let all: Vec<String> = h.snapshots()?.into_iter().map(|(n, _)| n).collect();
    let short = |s: &str| s.rsplit_once('@').map_or(s, |(_, n)| n).to_string();
    let (f, t) = (short(from), short(snap));
    let start = all.iter().position(|n| *n == f);
    let end = all.iter().position(|n| *n == t);
    match (start, end) {
        (Some(a), Some(b)) if a < b => Ok(all[a..=b].iter().map(|n| format!("{fs}@{n}")).collect()),
        _ => Err(DsError::Invalid(format!(
            "-I needs '{from}' to be an older snapshot of '{fs}' than '{snap}'"
        ))
        .into()),
    }
}

/// The short name of a snapshot given as `@name`, `name` or `fs@name`.
fn short_name(s: &str) -> &str {
    s.rsplit_once('@').map_or(s, |(_, n)| n)
}

/// The streams of a replication package of `snap` (see
/// [`SendOptions::replicate`]): for each dataset at or below the top (a
/// parent before its children) that has the snapshot, an incremental
/// series from `from` when it has that snapshot, else a full stream of
/// its oldest snapshot and the series from there. A dataset without the
/// snapshot is left out with everything below it; below a dataset sent
/// whole, everything is sent whole. A clone is sent whole.
fn package(pool: &Arc<Pool>, snap: &str, opts: &SendOptions) -> Result<Vec<Part>, SendError> {
    let (top, want) = snap
        .split_once('@')
        .ok_or_else(|| DsError::Invalid(format!("'{snap}' is not a snapshot")))?;
    let from = opts.from.as_deref().map(|f| match f.split_once('@') {
        Some((fs, _)) if !fs.is_empty() && fs != top => Err(DsError::Invalid(format!(
            "with -R, -i and -I name a snapshot of '{top}' ('@name'), not of '{fs}'"
        ))),
        _ => Ok(short_name(f)),
    });
    let from = from.transpose()?;
    let mut names: Vec<String> = tarn_dataset::list(pool, false)?
        .into_iter()
        .map(|i| i.name)
        .filter(|n| n == top || n.starts_with(&format!("{top}/")))
        .collect();
    names.sort();
    if names.first().map(String::as_str) != Some(top) {
        return Err(DsError::NotFound(format!("'{top}' does not exist")).into());
    }
    let mut parts = Vec::new();
    // Datasets left out (their children go with them: the receiver would
    // have no parent for them), and those sent whole (their children are
    // new on the receiver too, so they go whole as well).
    let mut left_out: Vec<String> = Vec::new();
    let mut whole: Vec<String> = Vec::new();
    let below = |fs: &str, list: &[String]| {
        list.iter().any(|p| {
            fs.strip_prefix(p.as_str())
                .is_some_and(|r| r.starts_with('/'))
        })
    };
    for fs in names {
        if below(&fs, &left_out) {
            continue;
        }
        let all: Vec<String> = tarn_dataset::open(pool, &fs)?
            .snapshots()?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let Some(end) = all.iter().position(|n| n == want) else {
            if fs == top {
                return Err(DsError::NotFound(format!("'{snap}' does not exist")).into());
            }
            left_out.push(fs);
            continue;
        };
        let rel = fs[top.len()..].trim_start_matches('/').to_string();
        let start = from
            .and_then(|f| all.iter().position(|n| n == f))
            .filter(|_| !below(&fs, &whole));
        if start.is_none() {
            whole.push(fs.clone());
        }
        if fs == top {
            if let (Some(f), None) = (from, start) {
                return Err(DsError::NotFound(format!("'{top}@{f}' does not exist")).into());
            }
            if start.is_some_and(|s| s >= end) {
                return Err(DsError::Invalid(format!(
                    "'@{}' is not older than '{snap}'",
                    from.unwrap_or_default()
                ))
                .into());
            }
        }
        let full = |n: &String| format!("{fs}@{n}");
        let mut add = |from: Option<&String>, to: &String| {
            parts.push(Part {
                snap: full(to),
                from: from.map(full),
                rel: Some(rel.clone()),
                part: None,
            })
        };
        match start {
            // A dataset below whose `@from` was taken after its `@want`
            // (destroyed and taken again): its stream cannot be made, and
            // leaving it out would let the receiver end without it.
            Some(s) if s >= end => {
                return Err(DsError::Invalid(format!(
                    "'{fs}@{}' is not older than '{fs}@{want}': send {fs} on its own",
                    from.unwrap_or_default()
                ))
                .into());
            }
            Some(s) if !opts.intermediates => add(Some(&all[s]), &all[end]),
            Some(s) => {
                for w in all[s..=end].windows(2) {
                    add(Some(&w[0]), &w[1]);
                }
            }
            None => {
                add(None, &all[0]);
                for w in all[..=end].windows(2) {
                    add(Some(&w[0]), &w[1]);
                }
            }
        }
    }
    Ok(parts)
}

/// Sends snapshot `snap` (`pool/fs@name`) to `out` as `opts` say.
pub fn send<W: Write>(
    pool: &Arc<Pool>,
    snap: &str,
    opts: &SendOptions,
    out: W,
) -> Result<SendReport, SendError> {
    let mut report = SendReport::default();
    let mut add = |bytes: u64, s: SendStats| {
        report.streams += 1;
        report.bytes += bytes;
        report.stats.nodes_read += s.nodes_read;
        report.stats.blocks_read += s.blocks_read;
        report.stats.items += s.items;
    };
    if let Some(t) = &opts.token {
        let token = Token::parse(t)?;
        let name = tarn_dataset::recv::snapshot_by_guid(pool, token.guid, &token.source)?
            .ok_or_else(|| {
                DsError::NotFound(format!(
                    "the token's snapshot {}@{} (guid {}) is not in pool '{}'",
                    token.source,
                    token.name,
                    token.guid,
                    pool.name()
                ))
            })?;
        let from = match token.from_guid {
            None => None,
            Some(g) => Some(
                tarn_dataset::recv::snapshot_by_guid(
                    pool,
                    g,
                    tarn_dataset::recv::dataset_of(&name),
                )?
                .ok_or_else(|| {
                    DsError::NotFound(format!("the token's base snapshot (guid {g}) is gone"))
                })?,
            ),
        };
        // A token comes from the receiver: it may not turn a raw send
        // (what an encrypted dataset's backups are) into a plaintext one.
        if opts.raw && !token.raw {
            return Err(DsError::Invalid(
                "the resume token is for a stream that is not raw, and a raw one was asked for"
                    .into(),
            )
            .into());
        }
        let o = SendOptions {
            raw: token.raw,
            ..opts.clone()
        };
        let part = Part {
            snap: name,
            from,
            rel: None,
            part: None,
        };
        let (_, bytes, s) = send_one(pool, &part, &o, token.after_key()?, out)?;
        add(bytes, s);
        return Ok(report);
    }
    let parts = if opts.replicate {
        package(pool, snap, opts)?
    } else {
        match (&opts.from, opts.intermediates) {
            (Some(from), true) => series(pool, snap, from)?
                .windows(2)
                .map(|w| Part {
                    snap: w[1].clone(),
                    from: Some(w[0].clone()),
                    rel: None,
                    part: None,
                })
                .collect(),
            (from, _) => vec![Part {
                snap: snap.to_string(),
                from: from.clone(),
                rel: None,
                part: None,
            }],
        }
    };
    let mut parts = parts;
    let n = parts.len() as u32;
    if n > 1 {
        for (i, p) in parts.iter_mut().enumerate() {
            p.part = Some([i as u32 + 1, n]);
        }
    }
    let mut out = out;
    for part in &parts {
        let (o, bytes, s) = send_one(pool, part, opts, None, out)?;
        out = o;
        add(bytes, s);
    }
    Ok(report)
}

/// What a receive did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvReport {
    /// The snapshots received, by full name.
    pub snapshots: Vec<String>,
    /// Streams of a series or package whose snapshot the target already
    /// had (sent again after a break): read, checked, skipped.
    pub skipped: Vec<String>,
    /// Entries applied.
    pub items: u64,
}

/// Entries applied per transaction, and the bytes that end one early:
/// also how finely a resumable receive can resume.
const BATCH_ITEMS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;

fn item_bytes(i: &SendItem) -> usize {
    use tarn_dataset::send::BlockPayload;
    match i {
        SendItem::Put(k, v) => k.len() + v.len(),
        SendItem::Delete(k) => k.len(),
        SendItem::Block(k, BlockPayload::Logical(d)) => k.len() + d.len(),
        SendItem::Block(k, BlockPayload::Raw(b)) => k.len() + b.stored.len(),
    }
}

/// Receives one stream whose `BEGIN` was read into `name`.
fn receive_one<R: Read>(
    pool: &Arc<Pool>,
    name: &str,
    header: &Header,
    opts: RecvOptions<'_>,
    reader: &mut StreamReader<R>,
    report: &mut RecvReport,
) -> Result<(), SendError> {
    // A stream that resumes a receive needs that receive: refused before
    // `begin` would create the dataset or roll it back for nothing.
    if header.resume_after.is_some() && !Receiver::can_resume(pool, name, &header.info)? {
        return Err(SendError::Stream(format!(
            "the stream resumes a receive that '{name}' does not hold (finished, aborted, \
             or another dataset); send the snapshot again without -t"
        )));
    }
    let mut rx = Receiver::begin(pool, name, &header.info, opts)?;
    let want = rx.resume_after().map(hex);
    // The same stream sent again from its start continues a partial
    // receive too: what it already applied is read, checked and skipped.
    let skip: Option<Vec<u8>> = match (&want, &header.resume_after) {
        (w, h) if w == h => None,
        (Some(_), None) => rx.resume_after().map(<[u8]>::to_vec),
        _ => {
            // The partial state is left as it was.
            return Err(SendError::Stream(
                "the stream resumes at another place than this receive broke off".into(),
            ));
        }
    };
    let mut batch: Vec<SendItem> = Vec::new();
    let mut bytes = 0;
    let mut last: Option<Vec<u8>> = match skip {
        Some(_) => None,
        None => rx.resume_after().map(<[u8]>::to_vec),
    };
    let r = (|| -> Result<(), SendError> {
        loop {
            match reader.next_record()? {
                Some(Record::Item(item)) => {
                    // Keys arrive in ascending order: anything else is a
                    // stream that would apply out of order.
                    if last.as_deref().is_some_and(|l| item.key() <= l) {
                        return Err(SendError::Stream("entries out of key order".into()));
                    }
                    last = Some(item.key().to_vec());
                    if skip.as_deref().is_some_and(|s| item.key() <= s) {
                        continue;
                    }
                    bytes += item_bytes(&item);
                    batch.push(item);
                    report.items += 1;
                    if batch.len() >= BATCH_ITEMS || bytes >= BATCH_BYTES {
                        rx.apply(std::mem::take(&mut batch))?;
                        bytes = 0;
                    }
                }
                Some(Record::End(_)) => {
                    rx.apply(std::mem::take(&mut batch))?;
                    return Ok(());
                }
                Some(Record::Begin(_)) => {
                    return Err(SendError::Stream("BEGIN inside a stream".into()))
                }
                None => return Err(SendError::Stream("the stream ends before END".into())),
            }
        }
    })();
    // A stream refused at its end (a snapshot made meanwhile under its
    // name) is undone like one refused on the way.
    let r = r.and_then(|()| rx.finish().map_err(SendError::from));
    match r {
        Ok(()) => {
            report
                .snapshots
                .push(format!("{name}@{}", header.info.name));
            Ok(())
        }
        Err(e) => {
            if let Err(undo) = rx.fail() {
                return Err(SendError::Stream(format!(
                    "{e}; and undoing the partial receive failed: {undo}"
                )));
            }
            Err(e)
        }
    }
}

/// Where a stream goes: `name`, or for a stream of a replication package
/// the dataset at its place below `name`.
fn target(name: &str, header: &Header) -> Result<String, SendError> {
    match header.rel.as_deref() {
        None | Some("") => Ok(name.to_string()),
        Some(rel) => {
            if rel.contains(['@', '%']) || rel.starts_with('/') {
                return Err(SendError::Stream(format!(
                    "the package names a dataset '{rel}' that is not a path below its top"
                )));
            }
            Ok(format!("{name}/{rel}"))
        }
    }
}

/// Reads and checks the rest of a stream without applying it.
fn skip_stream<R: Read>(reader: &mut StreamReader<R>) -> Result<(), SendError> {
    loop {
        match reader.next_record()? {
            Some(Record::Item(_)) => {}
            Some(Record::End(_)) => return Ok(()),
            Some(Record::Begin(_)) => {
                return Err(SendError::Stream("BEGIN inside a stream".into()))
            }
            None => return Err(SendError::Stream("the stream ends before END".into())),
        }
    }
}

/// Receives every stream `input` holds into dataset `name` (see the
/// crate docs): each becomes a snapshot of it, or, in a replication
/// package, of the dataset at its place below `name`.
pub fn receive<R: Read>(
    pool: &Arc<Pool>,
    name: &str,
    opts: RecvOptions<'_>,
    input: R,
) -> Result<RecvReport, SendError> {
    let mut reader = StreamReader::new(input);
    let mut report = RecvReport::default();
    // The `[i, n]` of the last stream of a series (`Header::part`).
    let mut prev: Option<[u32; 2]> = None;
    let unfinished = |prev: Option<[u32; 2]>| match prev {
        Some([i, n]) if i < n => Err(SendError::Stream(format!(
            "the input ends after stream {i} of the {n} one send wrote: it was cut short \
             (what arrived is kept; send it all again to finish)"
        ))),
        _ => Ok(()),
    };
    loop {
        match reader.next_record()? {
            None if report.snapshots.is_empty() && report.skipped.is_empty() => {
                return Err(SendError::Stream("the input holds no stream".into()))
            }
            None => {
                unfinished(prev)?;
                return Ok(report);
            }
            Some(Record::Begin(h)) => {
                match (prev, h.part) {
                    (_, Some([1, n])) if n >= 1 => unfinished(prev)?,
                    (Some([i, n]), Some([j, m])) if j == i + 1 && m == n && j <= n => {}
                    (_, Some(_)) => {
                        return Err(SendError::Stream(
                            "streams of one send arrive out of order or missing".into(),
                        ))
                    }
                    (_, None) => unfinished(prev)?,
                }
                prev = h.part;
                let at = target(name, &h)?;
                // A series or package sent again after a break: what
                // arrived the first time is skipped.
                let several = h.rel.is_some() || h.part.is_some();
                if several && tarn_dataset::recv::has_snapshot(pool, &at, h.info.guid)? {
                    skip_stream(&mut reader)?;
                    report.skipped.push(format!("{at}@{}", h.info.name));
                    continue;
                }
                receive_one(pool, &at, &h, opts, &mut reader, &mut report)?
            }
            Some(_) => return Err(SendError::Stream("a record outside a stream".into())),
        }
    }
}

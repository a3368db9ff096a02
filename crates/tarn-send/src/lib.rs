//! tarn-send: send and receive streams of datasets. A snapshot leaves as
//! a stream (whole, or what changed since an older snapshot; plain or
//! raw), and a stream becomes a snapshot of a dataset on this or another
//! pool: backups, moves, and offsite copies that never see a key.
//!
//! The layers: `tarn_dataset::send` and `tarn_dataset::recv` read and
//! write the trees; [`stream`] is the byte format, documented in
//! docs/format.md ("Send streams"); this crate joins them: [`send`] walks
//! a snapshot into a writer, [`receive`] applies what a reader holds.
//! Several streams may follow each other in one input (`send -I`): they
//! are received in order.

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

/// Writes one stream of `snap` (since `from`) to `out`.
fn send_one<W: Write>(
    pool: &Arc<Pool>,
    snap: &str,
    from: Option<&str>,
    opts: &SendOptions,
    after: Option<Vec<u8>>,
    out: W,
) -> Result<(W, u64, SendStats), SendError> {
    let src = SendSource::open(pool, snap, from, opts.raw, opts.props)?;
    let header = Header {
        magic: MAGIC.into(),
        version: VERSION,
        info: src.info().clone(),
        resume_after: after.as_deref().map(hex),
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
        let name = tarn_dataset::recv::snapshot_by_guid(pool, token.guid)?.ok_or_else(|| {
            DsError::NotFound(format!(
                "the token's snapshot {}@{} (guid {}) is not in pool '{}'",
                token.source,
                token.name,
                token.guid,
                pool.name()
            ))
        })?;
        let from =
            match token.from_guid {
                None => None,
                Some(g) => Some(tarn_dataset::recv::snapshot_by_guid(pool, g)?.ok_or_else(
                    || DsError::NotFound(format!("the token's base snapshot (guid {g}) is gone")),
                )?),
            };
        let o = SendOptions {
            raw: token.raw,
            ..opts.clone()
        };
        let (_, bytes, s) = send_one(pool, &name, from.as_deref(), &o, token.after_key()?, out)?;
        add(bytes, s);
        return Ok(report);
    }
    match (&opts.from, opts.intermediates) {
        (Some(from), true) => {
            let list = series(pool, snap, from)?;
            let mut out = out;
            for pair in list.windows(2) {
                let (o, bytes, s) = send_one(pool, &pair[1], Some(&pair[0]), opts, None, out)?;
                out = o;
                add(bytes, s);
            }
        }
        (from, _) => {
            let (_, bytes, s) = send_one(pool, snap, from.as_deref(), opts, None, out)?;
            add(bytes, s);
        }
    }
    Ok(report)
}

/// What a receive did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvReport {
    /// The snapshots received, by full name.
    pub snapshots: Vec<String>,
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
    opts: RecvOptions,
    reader: &mut StreamReader<R>,
    report: &mut RecvReport,
) -> Result<(), SendError> {
    let mut rx = Receiver::begin(pool, name, &header.info, opts)?;
    let want = rx.resume_after().map(hex);
    if header.resume_after != want {
        let e = SendError::Stream(match (&want, &header.resume_after) {
            (Some(_), None) => format!(
                "'{name}' holds a partial receive of this stream: send it with -t and the \
                 dataset's receive_resume_token, or abort it with `tarn receive -A {name}`"
            ),
            _ => "the stream resumes at another place than this receive broke off".into(),
        });
        // The partial state is left as it was.
        return Err(e);
    }
    let mut batch: Vec<SendItem> = Vec::new();
    let mut bytes = 0;
    let mut last: Option<Vec<u8>> = rx.resume_after().map(<[u8]>::to_vec);
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
    match r {
        Ok(()) => {
            rx.finish()?;
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

/// Receives every stream `input` holds into dataset `name` (see the
/// crate docs): each becomes a snapshot of it.
pub fn receive<R: Read>(
    pool: &Arc<Pool>,
    name: &str,
    opts: RecvOptions,
    input: R,
) -> Result<RecvReport, SendError> {
    let mut reader = StreamReader::new(input);
    let mut report = RecvReport::default();
    loop {
        match reader.next_record()? {
            None if report.snapshots.is_empty() => {
                return Err(SendError::Stream("the input holds no stream".into()))
            }
            None => return Ok(report),
            Some(Record::Begin(h)) => receive_one(pool, name, &h, opts, &mut reader, &mut report)?,
            Some(_) => return Err(SendError::Stream("a record outside a stream".into())),
        }
    }
}

//! Send streams kept in an object store, as immutable objects.
//!
//! # Layout
//!
//! Under a prefix (`s3://bucket/prefix`), each stream has a directory
//! named by its snapshot's guid and its base's (`full` for a full
//! stream), both 16 lowercase hex digits: `PREFIX/GUID-FROM/`. In it,
//! the stream's bytes cut into parts of [`PART`] bytes (the last one
//! shorter), each named `part-NNNNNNNN-HHHHHHHHHHHHHHHH` (its index, then
//! the first 16 hex digits of its BLAKE3), and last `manifest.json`,
//! which lists the parts with their sizes and full BLAKE3 hashes and
//! says which snapshot the stream carries. docs/format.md pins it.
//!
//! # Why this order
//!
//! A stream is complete exactly when its manifest exists: the manifest
//! is written after every part it names, and objects are never changed
//! after that. An upload cut short leaves parts and no manifest; the
//! same stream sent again (a send of the same snapshot is the same bytes)
//! finds the parts already there by name, so only what is missing goes
//! up. Parts of an earlier try that the finished manifest does not name
//! are deleted after it is written.
//!
//! A download checks each part's size and BLAKE3 against the manifest
//! before handing its bytes on; the stream's own chained checksums then
//! check the whole (see tarn-send). The store needs no key and learns no
//! more than the stream's sizes: streams sent raw stay sealed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::client::{Bucket, Config};
use crate::sigv4::hex;
use crate::S3Error;

/// Bytes per part object.
pub const PART: usize = 8 << 20;
/// The manifest's `format`.
pub const FORMAT: &str = "tarn-stream-objects";
/// The manifest's `version`; a reader refuses others.
pub const VERSION: u32 = 1;
/// Largest manifest accepted (about a million parts; a tenth of a MiB in
/// tests, so a test of the bound does not hold hundreds of MiB).
#[cfg(not(test))]
const MAX_MANIFEST: usize = 128 << 20;
#[cfg(test)]
const MAX_MANIFEST: usize = 100 << 10;
/// Most bytes of manifests read from one prefix (250 KiB in tests).
#[cfg(not(test))]
const MAX_MANIFESTS_BYTES: u64 = 1 << 30;
#[cfg(test)]
const MAX_MANIFESTS_BYTES: u64 = 250 << 10;
/// Room a manifest keeps for what is not its parts (its format, version,
/// byte count and the stream's description).
const MANIFEST_HEAD: usize = 64 << 10;

/// Bytes one part takes in a manifest (compact JSON and its comma).
fn part_bytes(p: &Part) -> usize {
    serde_json::to_vec(p).map_or(usize::MAX, |v| v.len() + 1)
}

/// One part as a manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// The object's name inside the stream's directory.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Lowercase hex BLAKE3 of its bytes.
    pub blake3: String,
}

/// What a stream carries, known before it is sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// The sending dataset's name (for people).
    pub dataset: String,
    /// The snapshot's short name.
    pub snapshot: String,
    /// The snapshot's guid.
    pub guid: u64,
    /// Incremental streams: the base snapshot's guid.
    #[serde(default)]
    pub from_guid: Option<u64>,
    /// Incremental streams: the base snapshot's short name.
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// When the snapshot was taken (Unix seconds).
    pub created_unix: u64,
}

/// A complete stream in the store (`manifest.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The snapshot carried.
    #[serde(flatten)]
    pub info: StreamInfo,
    /// The stream's length in bytes.
    pub bytes: u64,
    /// The parts, in order.
    pub parts: Vec<Part>,
}

impl Manifest {
    /// The directory name of the stream this manifest describes.
    pub fn dir(&self) -> String {
        dir_name(&self.info)
    }
}

fn dir_name(i: &StreamInfo) -> String {
    match i.from_guid {
        Some(f) => format!("{:016x}-{f:016x}", i.guid),
        None => format!("{:016x}-full", i.guid),
    }
}

/// A manifest's parts are what an upload writes: at least one, named
/// `part-INDEX-HASH16` in order, each at most [`PART`] bytes and all but
/// the last exactly that, adding up to `bytes`.
fn check_parts(m: &Manifest) -> Result<(), String> {
    if m.parts.is_empty() || m.bytes == 0 {
        return Err("an empty stream".into());
    }
    let mut sum: u64 = 0;
    let last = m.parts.len() - 1;
    for (i, p) in m.parts.iter().enumerate() {
        let hash_ok = p.blake3.len() == 64
            && p.blake3
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hash_ok || p.name != format!("part-{i:08}-{}", &p.blake3[..16]) {
            return Err(format!(
                "part {i} is named '{}', not as its index and hash",
                p.name
            ));
        }
        let full = p.size == PART as u64;
        if p.size == 0 || p.size > PART as u64 || (i < last && !full) {
            return Err(format!("part {i} has {} bytes", p.size));
        }
        sum = sum.saturating_add(p.size);
    }
    if sum != m.bytes {
        return Err(format!("parts add up to {sum} bytes, not {}", m.bytes));
    }
    Ok(())
}

/// What an upload did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadReport {
    /// Parts of the stream.
    pub parts: u64,
    /// Parts sent now.
    pub uploaded: u64,
    /// Parts found in the store from an earlier try.
    pub reused: u64,
    /// Bytes of stream.
    pub bytes: u64,
}

/// A prefix of a bucket that holds streams.
pub struct Store {
    bucket: Bucket,
    prefix: String,
    url: String,
    /// Bytes of the manifests under the prefix, once a listing counted
    /// them (and with the manifests this store wrote since): a run that
    /// lists what is stored, then uploads a series of streams, lists the
    /// prefix (every part of every stream) once, not once per stream.
    manifest_total: Option<u64>,
}

/// Splits `s3://bucket/prefix` into bucket and prefix (no slashes at
/// either end).
pub fn parse_url(url: &str) -> Result<(String, String), S3Error> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| S3Error::Config(format!("'{url}' is not an s3://bucket/prefix address")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
        return Err(S3Error::Config(format!(
            "'{url}': a prefix with empty or dot parts"
        )));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

impl Store {
    /// The store at `url` (`s3://bucket/prefix`), reached as `cfg` says.
    pub fn open(cfg: Config, url: &str) -> Result<Store, S3Error> {
        let (bucket, prefix) = parse_url(url)?;
        Ok(Store {
            bucket: Bucket::new(cfg, &bucket)?,
            prefix,
            url: url.to_string(),
            manifest_total: None,
        })
    }

    /// The bucket, for operations outside the layout (tests, setup).
    pub fn bucket(&mut self) -> &mut Bucket {
        &mut self.bucket
    }

    fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// Every complete stream under the prefix.
    pub fn manifests(&mut self) -> Result<Vec<Manifest>, S3Error> {
        let base = self.key("");
        let listed = self.bucket.list(&base)?;
        let mut out = Vec::new();
        let mut read: u64 = 0;
        for o in listed {
            let Some(rel) = o.key.strip_prefix(&base) else {
                continue;
            };
            let Some((dir, "manifest.json")) = rel.split_once('/') else {
                continue;
            };
            read = read.saturating_add(o.size);
            if o.size > MAX_MANIFEST as u64 || read > MAX_MANIFESTS_BYTES {
                return Err(S3Error::Layout(format!("{}: too large a manifest", o.key)));
            }
            let bytes = self
                .bucket
                .get(&o.key)?
                .ok_or_else(|| S3Error::Layout(format!("{} vanished while listed", o.key)))?;
            // What came, not what the listing said: a store that lists
            // small sizes and sends large objects meets the same bounds.
            read = read.saturating_add((bytes.len() as u64).saturating_sub(o.size));
            if bytes.len() > MAX_MANIFEST || read > MAX_MANIFESTS_BYTES {
                return Err(S3Error::Layout(format!("{}: too large a manifest", o.key)));
            }
            let m: Manifest = serde_json::from_slice(&bytes)
                .map_err(|e| S3Error::Layout(format!("{}: {e}", o.key)))?;
            if m.format != FORMAT || m.version != VERSION {
                return Err(S3Error::Layout(format!(
                    "{}: format {} version {}, this tarn reads {FORMAT} version {VERSION}",
                    o.key, m.format, m.version
                )));
            }
            if m.dir() != dir {
                return Err(S3Error::Layout(format!(
                    "{}: describes another stream ({})",
                    o.key,
                    m.dir()
                )));
            }
            check_parts(&m).map_err(|why| S3Error::Layout(format!("{}: {why}", o.key)))?;
            out.push(m);
        }
        self.manifest_total = Some(read);
        Ok(out)
    }

    /// Starts uploading the stream `info` describes: write its bytes to
    /// the returned writer, then [`Upload::finish`]. Parts an earlier try
    /// left are found and kept.
    pub fn upload(&mut self, info: StreamInfo) -> Result<Upload<'_>, S3Error> {
        let dir = self.key(&dir_name(&info));
        let existing: HashMap<String, u64> = self
            .bucket
            .list(&format!("{dir}/"))?
            .into_iter()
            .filter_map(|o| {
                let name = o.key.strip_prefix(&format!("{dir}/"))?.to_string();
                Some((name, o.size))
            })
            .collect();
        if existing.contains_key("manifest.json") {
            return Err(S3Error::Layout(format!(
                "{}/{dir}: this stream is already stored",
                self.url
            )));
        }
        // The manifests already under the prefix: a reader takes at most
        // MAX_MANIFESTS_BYTES of them, so a stream that would pass that
        // would make every stream there unreadable.
        let others = match self.manifest_total {
            Some(t) => t,
            None => {
                let base = self.key("");
                let t = self
                    .bucket
                    .list(&base)?
                    .into_iter()
                    .filter(|o| {
                        o.key
                            .strip_prefix(&base)
                            .and_then(|r| r.split_once('/'))
                            .is_some_and(|(_, f)| f == "manifest.json")
                    })
                    .fold(0u64, |a, o| a.saturating_add(o.size));
                self.manifest_total = Some(t);
                t
            }
        };
        let up = Upload {
            store: self,
            dir,
            info,
            existing,
            buf: Vec::with_capacity(PART),
            parts: Vec::new(),
            report: UploadReport::default(),
            manifest_bytes: MANIFEST_HEAD,
            others,
        };
        up.check_total(MANIFEST_HEAD)?;
        Ok(up)
    }

    /// Reads stored streams back one after the other (a chain, for
    /// `tarn receive`), each part checked against its manifest.
    pub fn into_reader(self, streams: Vec<Manifest>) -> Streams {
        let parts = streams
            .iter()
            .flat_map(|m| {
                let dir = self.key(&m.dir());
                m.parts.iter().map(move |p| (dir.clone(), p.clone()))
            })
            .collect();
        Streams {
            store: self,
            parts,
            next: 0,
            buf: Vec::new(),
            at: 0,
        }
    }
}

/// An upload in progress (see [`Store::upload`]).
pub struct Upload<'a> {
    store: &'a mut Store,
    dir: String,
    info: StreamInfo,
    /// Objects an earlier try left in the stream's directory, with sizes.
    existing: HashMap<String, u64>,
    buf: Vec<u8>,
    parts: Vec<Part>,
    report: UploadReport,
    /// What the manifest will take, at most: a stream whose manifest the
    /// reader would refuse is refused here, before more is uploaded.
    manifest_bytes: usize,
    /// Bytes of the other streams' manifests under the prefix.
    others: u64,
}

impl Upload<'_> {
    /// Refuses a stream whose manifest of `bytes` would take the prefix's
    /// manifests past what a reader reads of them.
    fn check_total(&self, bytes: usize) -> Result<(), S3Error> {
        if self.others.saturating_add(bytes as u64) > MAX_MANIFESTS_BYTES {
            return Err(S3Error::Layout(format!(
                "{}: the streams stored there have {} bytes of manifests and this one would \
                 take them past the {} a reader reads: let retention remove old streams, or \
                 store new ones under another prefix",
                self.store.url, self.others, MAX_MANIFESTS_BYTES
            )));
        }
        Ok(())
    }

    fn flush_part(&mut self) -> Result<(), S3Error> {
        let hash = hex(blake3::hash(&self.buf).as_bytes());
        let name = format!("part-{:08}-{}", self.parts.len(), &hash[..16]);
        let part = Part {
            name: name.clone(),
            size: self.buf.len() as u64,
            blake3: hash.clone(),
        };
        self.manifest_bytes = self.manifest_bytes.saturating_add(part_bytes(&part));
        self.check_total(self.manifest_bytes)?;
        if self.manifest_bytes > MAX_MANIFEST {
            return Err(S3Error::Layout(format!(
                "the stream is larger than one stored stream may be ({} parts of {} MiB; its \
                 manifest would be too large to read back): send a dataset this large to \
                 another tarn, or in parts (child datasets)",
                self.parts.len(),
                PART >> 20
            )));
        }
        // Kept only if it is the very part (same hash, same size); the
        // download checks it again against the manifest.
        if self.existing.get(&name) == Some(&(self.buf.len() as u64)) {
            self.report.reused += 1;
        } else {
            let key = format!("{}/{name}", self.dir);
            self.store.bucket.put(&key, &self.buf)?;
            self.report.uploaded += 1;
        }
        self.report.parts += 1;
        self.report.bytes += self.buf.len() as u64;
        self.parts.push(part);
        self.buf.clear();
        Ok(())
    }

    /// Stores what is left and the manifest: the stream is then complete.
    /// Parts of earlier tries that it does not name are removed.
    pub fn finish(mut self) -> Result<UploadReport, S3Error> {
        if !self.buf.is_empty() || self.parts.is_empty() {
            self.flush_part()?;
        }
        let m = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            info: self.info.clone(),
            bytes: self.report.bytes,
            parts: std::mem::take(&mut self.parts),
        };
        let json = serde_json::to_vec(&m).map_err(|e| S3Error::Layout(format!("manifest: {e}")))?;
        // Never stored when the reader would refuse it.
        if json.len() > MAX_MANIFEST {
            return Err(S3Error::Layout(format!(
                "the stream's manifest would be {} bytes, more than a reader takes ({MAX_MANIFEST})",
                json.len()
            )));
        }
        self.check_total(json.len())?;
        let key = format!("{}/manifest.json", self.dir);
        self.store.bucket.put(&key, &json)?;
        self.store.manifest_total = Some(self.others.saturating_add(json.len() as u64));
        let named: HashSet<&str> = m.parts.iter().map(|p| p.name.as_str()).collect();
        let stale: Vec<String> = self
            .existing
            .keys()
            .filter(|n| !named.contains(n.as_str()))
            .cloned()
            .collect();
        for n in stale {
            self.store.bucket.delete(&format!("{}/{n}", self.dir))?;
        }
        Ok(self.report)
    }
}

impl Write for Upload<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(PART - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PART {
            self.flush_part().map_err(std::io::Error::other)?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stored streams being read (see [`Store::into_reader`]).
pub struct Streams {
    store: Store,
    /// Every part of every stream, in order, with its directory.
    parts: Vec<(String, Part)>,
    next: usize,
    buf: Vec<u8>,
    at: usize,
}

impl Streams {
    fn fetch(&mut self) -> Result<bool, S3Error> {
        let Some((dir, p)) = self.parts.get(self.next).cloned() else {
            return Ok(false);
        };
        let key = format!("{dir}/{}", p.name);
        let data = self
            .store
            .bucket
            .get(&key)?
            .ok_or_else(|| S3Error::Layout(format!("{key} is missing")))?;
        if data.len() as u64 != p.size || hex(blake3::hash(&data).as_bytes()) != p.blake3 {
            return Err(S3Error::Layout(format!(
                "{key} is not what the manifest says (size or BLAKE3 differs)"
            )));
        }
        self.buf = data;
        self.at = 0;
        self.next += 1;
        Ok(true)
    }
}

impl Read for Streams {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            if !self.fetch().map_err(std::io::Error::other)? {
                return Ok(0);
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The newest stream stored: the end of a chain (no other stream is
/// based on it), the latest taken if there are several.
pub fn newest(manifests: &[Manifest]) -> Option<&Manifest> {
    let bases: HashSet<u64> = manifests.iter().filter_map(|m| m.info.from_guid).collect();
    manifests
        .iter()
        .filter(|m| !bases.contains(&m.info.guid))
        .max_by_key(|m| (m.info.created_unix, m.info.guid))
}

/// The streams to apply, in order, to bring a dataset that has the
/// snapshots `have` (by guid, oldest first; empty for a dataset not made
/// yet) to snapshot `to`: the shortest run of stored
/// streams that starts from its newest snapshot, the only base a receive
/// takes without rolling back; failing that, from any snapshot it has
/// (which a receive takes only with `-F`, rolling back to it); for a new
/// dataset, from a full stream. Empty when it has `to` already.
///
/// A shorter run from an older snapshot (a series that broke off and was
/// sent again from an older base leaves one) must not win over the run
/// from the newest: it would fail without `-F`, and with it destroy the
/// newer snapshots for nothing.
pub fn chain<'a>(
    manifests: &'a [Manifest],
    to: u64,
    have: &[u64],
) -> Result<Vec<&'a Manifest>, S3Error> {
    if have.contains(&to) {
        return Ok(Vec::new());
    }
    if let Some(&newest) = have.last() {
        if let Ok(c) = chain_from(manifests, to, &HashSet::from([newest])) {
            return Ok(c);
        }
    }
    chain_from(manifests, to, &have.iter().copied().collect())
}

/// [`chain`] from any snapshot of `have`.
fn chain_from<'a>(
    manifests: &'a [Manifest],
    to: u64,
    have: &HashSet<u64>,
) -> Result<Vec<&'a Manifest>, S3Error> {
    // Backwards from `to`, breadth first: `next[g]` is the stream that
    // leads from snapshot g one step towards `to`.
    let mut next: HashMap<u64, &Manifest> = HashMap::new();
    let mut queue = VecDeque::from([to]);
    let mut start: Option<&Manifest> = None;
    'search: while let Some(g) = queue.pop_front() {
        for m in manifests.iter().filter(|m| m.info.guid == g) {
            match m.info.from_guid {
                None if have.is_empty() => {
                    start = Some(m);
                    break 'search;
                }
                None => {}
                Some(f) if have.contains(&f) => {
                    start = Some(m);
                    break 'search;
                }
                Some(f) if f != to && !next.contains_key(&f) => {
                    next.insert(f, m);
                    queue.push_back(f);
                }
                Some(_) => {}
            }
        }
    }
    let Some(first) = start else {
        return Err(S3Error::Layout(if have.is_empty() {
            format!("no full stream in the store leads to snapshot guid {to}")
        } else {
            format!("no stored stream leads to snapshot guid {to} from a snapshot the target has")
        }));
    };
    let mut out = vec![first];
    let mut at = first.info.guid;
    while at != to {
        let m = next
            .get(&at)
            .ok_or_else(|| S3Error::Layout("the stored streams do not join up".into()))?;
        out.push(m);
        at = m.info.guid;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that lists a small manifest and sends a huge one is held
    /// to the same bound as one that lists its true size.
    #[test]
    fn manifests_are_bounded_by_what_comes_not_what_is_listed() {
        let huge = "x".repeat(MAX_MANIFEST + 1);
        let (port, _) = crate::client::testing::fake_store(move |n| {
            if n == 0 {
                "<ListBucketResult><IsTruncated>false</IsTruncated><Contents>\
                 <Key>pre/s1/manifest.json</Key><Size>10</Size></Contents></ListBucketResult>"
                    .to_string()
            } else {
                huge.clone()
            }
        });
        let cfg = crate::client::testing::config_at(port);
        let mut store = Store::open(cfg, "s3://tarn-test/pre").unwrap();
        let e = store.manifests().unwrap_err();
        assert!(e.to_string().contains("too large a manifest"), "{e}");
    }

    /// A stream that would take the manifests under its prefix past what
    /// a reader reads is refused before anything is uploaded: stored, it
    /// would make every stream there unreadable.
    #[test]
    fn an_upload_never_takes_a_prefix_past_what_a_reader_reads() {
        let listing = |sizes: &[u64]| {
            let mut x = String::from("<ListBucketResult><IsTruncated>false</IsTruncated>");
            for (i, s) in sizes.iter().enumerate() {
                x.push_str(&format!(
                    "<Contents><Key>pre/s{i}/manifest.json</Key><Size>{s}</Size></Contents>"
                ));
            }
            x + "</ListBucketResult>"
        };
        for (sizes, ok) in [
            (vec![90_000u64, 90_000], true),
            (vec![100_000, 100_000, 60_000], false),
        ] {
            let prefix = listing(&sizes);
            let empty = listing(&[]);
            let (port, _) = crate::client::testing::fake_store(move |n| {
                if n == 0 {
                    empty.clone()
                } else {
                    prefix.clone()
                }
            });
            let cfg = crate::client::testing::config_at(port);
            let mut store = Store::open(cfg, "s3://tarn-test/pre").unwrap();
            let r = store.upload(m(7, None).info).map(|_| ());
            assert_eq!(r.is_ok(), ok, "{sizes:?}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("bytes of manifests"), "{e}");
            }
        }
    }

    /// A series of uploads lists the prefix once, and each counts the
    /// manifests the ones before it wrote.
    #[test]
    fn a_series_of_uploads_lists_the_prefix_once() {
        let listed = "<ListBucketResult><IsTruncated>false</IsTruncated><Contents>\
                      <Key>pre/s0/manifest.json</Key><Size>150000</Size></Contents>\
                      </ListBucketResult>";
        let empty = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
        // 0: the first stream's folder, 1: the prefix, 2 and 3: its part
        // and manifest, 4: the second stream's folder.
        let (port, count) = crate::client::testing::fake_store(move |n| {
            if n == 1 { listed } else { empty }.to_string()
        });
        let cfg = crate::client::testing::config_at(port);
        let mut store = Store::open(cfg, "s3://tarn-test/pre").unwrap();
        let mut up = store.upload(m(7, None).info).unwrap();
        up.write_all(b"a stream").unwrap();
        up.finish().unwrap();
        let first = store.manifest_total.unwrap();
        assert!(first > 150_000, "{first}");
        store.upload(m(8, Some(7)).info).unwrap();
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 5);
        assert_eq!(store.manifest_total, Some(first));
    }

    /// What an upload counts for its manifest is never less than what
    /// the manifest takes: a stream the writer lets through is one the
    /// reader takes.
    #[test]
    fn the_writers_count_bounds_the_manifest() {
        for n in [1usize, 7, 300] {
            let mut manifest = m(1, Some(2));
            manifest.info.dataset = "x".repeat(255);
            manifest.info.snapshot = "y".repeat(255);
            manifest.parts = (0..n)
                .map(|i| Part {
                    name: format!("part-{i:08}-{}", "f".repeat(16)),
                    size: PART as u64,
                    blake3: "a".repeat(64),
                })
                .collect();
            let counted = MANIFEST_HEAD + manifest.parts.iter().map(part_bytes).sum::<usize>();
            let written = serde_json::to_vec(&manifest).unwrap().len();
            assert!(written <= counted, "{n} parts: {written} > {counted}");
        }
    }

    fn m(guid: u64, from: Option<u64>) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            info: StreamInfo {
                dataset: "tank/a".into(),
                snapshot: format!("s{guid}"),
                guid,
                from_guid: from,
                from_snapshot: from.map(|f| format!("s{f}")),
                created_unix: guid,
            },
            bytes: 0,
            parts: Vec::new(),
        }
    }

    fn guids(c: Vec<&Manifest>) -> Vec<(u64, Option<u64>)> {
        c.iter().map(|m| (m.info.guid, m.info.from_guid)).collect()
    }

    #[test]
    fn chains_walk_back_to_what_the_target_has() {
        let none: [u64; 0] = [];
        let all = vec![m(3, Some(2)), m(1, None), m(2, Some(1)), m(4, Some(9))];
        assert_eq!(
            guids(chain(&all, 3, &none).unwrap()),
            [(1, None), (2, Some(1)), (3, Some(2))]
        );
        assert!(chain(&all, 4, &none).is_err(), "a missing base");
        assert!(chain(&all, 7, &none).is_err(), "no such snapshot");
        let looped = vec![m(1, Some(2)), m(2, Some(1))];
        assert!(chain(&looped, 1, &none).is_err());
        // A target that has 1 gets the incrementals only; one that has 2
        // only the last; one that has 3 nothing.
        let has = |g: u64| [g];
        assert_eq!(
            guids(chain(&all, 3, &has(1)).unwrap()),
            [(2, Some(1)), (3, Some(2))]
        );
        assert_eq!(guids(chain(&all, 3, &has(2)).unwrap()), [(3, Some(2))]);
        assert!(chain(&all, 3, &has(3)).unwrap().is_empty());
        // A full stream of 3 stored beside the incrementals: an existing
        // target still gets an incremental, a new one the shortest way.
        let mut both = all.clone();
        both.push(m(3, None));
        assert_eq!(
            guids(chain(&both, 3, &has(1)).unwrap()),
            [(2, Some(1)), (3, Some(2))]
        );
        assert_eq!(guids(chain(&both, 3, &none).unwrap()), [(3, None)]);
        // A target whose snapshots the store never saw.
        assert!(chain(&all, 3, &has(99)).is_err());
        // A series sent again from an older base (1 -> 4 beside
        // 1 -> 2 -> 3 -> 4): a target at 2 goes on from 2, its newest,
        // not the shorter way from 1, which would roll it back.
        let branched = vec![
            m(1, None),
            m(2, Some(1)),
            m(3, Some(2)),
            m(4, Some(3)),
            m(4, Some(1)),
        ];
        let at2 = [1, 2];
        assert_eq!(
            guids(chain(&branched, 4, &at2).unwrap()),
            [(3, Some(2)), (4, Some(3))]
        );
        // With no run from its newest, any snapshot it has (for -F).
        let cut = vec![m(1, None), m(2, Some(1)), m(4, Some(1))];
        assert_eq!(guids(chain(&cut, 4, &at2).unwrap()), [(4, Some(1))]);
        // Only chain ends count (1 is 2's base); among them the latest.
        let mut late = m(9, None);
        late.info.created_unix = 100;
        let all = vec![m(1, None), m(2, Some(1)), late];
        assert_eq!(newest(&all).map(|m| m.info.guid), Some(9));
        let all = vec![m(1, None), m(2, Some(1))];
        assert_eq!(newest(&all).map(|m| m.info.guid), Some(2));
    }

    #[test]
    fn manifests_must_describe_what_an_upload_writes() {
        let part = |i: usize, size: u64| {
            let h = format!("{:064x}", i + 1);
            Part {
                name: format!("part-{i:08}-{}", &h[..16]),
                size,
                blake3: h,
            }
        };
        let mut good = m(1, None);
        good.parts = vec![part(0, PART as u64), part(1, 10)];
        good.bytes = PART as u64 + 10;
        assert_eq!(check_parts(&good), Ok(()));
        let mut bad = Vec::new();
        let mut e = good.clone();
        e.parts.clear();
        e.bytes = 0;
        bad.push(e);
        let mut e = good.clone();
        e.parts[1].name = "part-00000001-../../x".into();
        bad.push(e);
        let mut e = good.clone();
        e.parts[0].size = 10;
        e.bytes = 20;
        bad.push(e);
        let mut e = good.clone();
        e.parts[1].size = u64::MAX;
        bad.push(e);
        let mut e = good.clone();
        e.bytes += 1;
        bad.push(e);
        let mut e = good.clone();
        e.parts.swap(0, 1);
        bad.push(e);
        for e in bad {
            assert!(check_parts(&e).is_err(), "{e:?}");
        }
    }

    #[test]
    fn urls_and_layout_are_pinned() {
        assert_eq!(
            parse_url("s3://bkt/a/b/").unwrap(),
            ("bkt".into(), "a/b".into())
        );
        assert_eq!(parse_url("s3://bkt").unwrap(), ("bkt".into(), "".into()));
        assert!(parse_url("http://bkt/a").is_err());
        assert!(parse_url("s3://bkt/a/../b").is_err());
        assert_eq!(m(0xab, None).dir(), "00000000000000ab-full");
        assert_eq!(m(0xab, Some(1)).dir(), "00000000000000ab-0000000000000001");
        let json = serde_json::to_value(m(2, Some(1))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "format": "tarn-stream-objects", "version": 1,
                "dataset": "tank/a", "snapshot": "s2", "guid": 2,
                "from_guid": 1, "from_snapshot": "s1", "created_unix": 2,
                "bytes": 0, "parts": []
            })
        );
    }
}

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

use std::collections::HashSet;
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
/// Largest manifest accepted (about a million parts).
const MAX_MANIFEST: usize = 128 << 20;

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
        for o in listed {
            let Some(rel) = o.key.strip_prefix(&base) else {
                continue;
            };
            let Some((dir, "manifest.json")) = rel.split_once('/') else {
                continue;
            };
            if o.size as usize > MAX_MANIFEST {
                return Err(S3Error::Layout(format!("{}: too large a manifest", o.key)));
            }
            let bytes = self
                .bucket
                .get(&o.key)?
                .ok_or_else(|| S3Error::Layout(format!("{} vanished while listed", o.key)))?;
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
            let sum: u64 = m.parts.iter().map(|p| p.size).sum();
            if sum != m.bytes {
                return Err(S3Error::Layout(format!(
                    "{}: parts add up to {sum} bytes, not {}",
                    o.key, m.bytes
                )));
            }
            out.push(m);
        }
        Ok(out)
    }

    /// Starts uploading the stream `info` describes: write its bytes to
    /// the returned writer, then [`Upload::finish`]. Parts an earlier try
    /// left are found and kept.
    pub fn upload(&mut self, info: StreamInfo) -> Result<Upload<'_>, S3Error> {
        let dir = self.key(&dir_name(&info));
        let existing: HashSet<String> = self
            .bucket
            .list(&format!("{dir}/"))?
            .into_iter()
            .filter_map(|o| o.key.strip_prefix(&format!("{dir}/")).map(str::to_string))
            .collect();
        if existing.contains("manifest.json") {
            return Err(S3Error::Layout(format!(
                "{}/{dir}: this stream is already stored",
                self.url
            )));
        }
        Ok(Upload {
            store: self,
            dir,
            info,
            existing,
            buf: Vec::with_capacity(PART),
            parts: Vec::new(),
            report: UploadReport::default(),
        })
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
    existing: HashSet<String>,
    buf: Vec<u8>,
    parts: Vec<Part>,
    report: UploadReport,
}

impl Upload<'_> {
    fn flush_part(&mut self) -> Result<(), S3Error> {
        let hash = hex(blake3::hash(&self.buf).as_bytes());
        let name = format!("part-{:08}-{}", self.parts.len(), &hash[..16]);
        if self.existing.contains(&name) {
            self.report.reused += 1;
        } else {
            let key = format!("{}/{name}", self.dir);
            self.store.bucket.put(&key, &self.buf)?;
            self.report.uploaded += 1;
        }
        self.report.parts += 1;
        self.report.bytes += self.buf.len() as u64;
        self.parts.push(Part {
            name,
            size: self.buf.len() as u64,
            blake3: hash,
        });
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
        let json =
            serde_json::to_vec_pretty(&m).map_err(|e| S3Error::Layout(format!("manifest: {e}")))?;
        let key = format!("{}/manifest.json", self.dir);
        self.store.bucket.put(&key, &json)?;
        let named: HashSet<&str> = m.parts.iter().map(|p| p.name.as_str()).collect();
        let stale: Vec<String> = self
            .existing
            .iter()
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

/// The streams that lead to snapshot `to`: a full stream, then each
/// incremental one whose base the previous carried, ending with `to`.
pub fn chain(manifests: &[Manifest], to: u64) -> Result<Vec<&Manifest>, S3Error> {
    let mut out = Vec::new();
    let mut want = Some(to);
    while let Some(g) = want {
        let m = manifests
            .iter()
            .filter(|m| m.info.guid == g)
            // A full stream ends the walk soonest.
            .min_by_key(|m| m.info.from_guid.is_some())
            .ok_or_else(|| {
                S3Error::Layout(format!(
                    "no stored stream carries snapshot guid {g}, which the chain needs"
                ))
            })?;
        if out.len() > manifests.len() {
            return Err(S3Error::Layout("the stored streams form a loop".into()));
        }
        out.push(m);
        want = m.info.from_guid;
    }
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn chains_walk_back_to_a_full_stream() {
        let all = vec![m(3, Some(2)), m(1, None), m(2, Some(1)), m(4, Some(9))];
        let c: Vec<u64> = chain(&all, 3)
            .unwrap()
            .iter()
            .map(|m| m.info.guid)
            .collect();
        assert_eq!(c, [1, 2, 3]);
        assert!(chain(&all, 4).is_err(), "a missing base");
        assert!(chain(&all, 7).is_err(), "no such snapshot");
        let looped = vec![m(1, Some(2)), m(2, Some(1))];
        assert!(chain(&looped, 1).is_err());
        // Only chain ends count (1 is 2's base); among them the latest.
        let mut late = m(9, None);
        late.info.created_unix = 100;
        let all = vec![m(1, None), m(2, Some(1)), late];
        assert_eq!(newest(&all).map(|m| m.info.guid), Some(9));
        let all = vec![m(1, None), m(2, Some(1))];
        assert_eq!(newest(&all).map(|m| m.info.guid), Some(2));
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

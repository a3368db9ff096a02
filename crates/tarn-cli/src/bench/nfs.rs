//! `tarn bench --client nfs://HOST[:PORT]/SHARE[/DIR]`: the same table,
//! measured from a client machine over NFSv3, with tarn's own small NFS
//! client (no kernel mount needed, so it runs where mounting is not
//! allowed, and measures the server and the network rather than a kernel
//! client's tuning).
//!
//! It does what a Linux client mounted with `nconnect=8,rsize=wsize=1M`
//! does: 1 MiB READs and UNSTABLE WRITEs with four in flight per stream
//! (read-ahead and write-behind), a COMMIT where a program would fsync,
//! and random 4 KiB requests spread over eight connections. Every 1 MiB
//! read back in the sequential passes is checked against what was
//! written (its first and last 64 bytes: enough to catch a misplaced,
//! stale or zeroed record at no cost to the figure), so a server or a
//! client that returns wrong bytes fails the run instead of posting one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tarn_nfs::client::{read_reply, write_reply, Client, Fh, UNSTABLE};

use super::{join_sum, next, row, BenchRow, TestFile};

/// Requests in flight per sequential stream.
const WINDOW: usize = 4;
/// Connections for the random workloads (Linux's `nconnect=8`).
const CONNECTIONS: usize = 8;
/// 1 MiB.
const MIB: usize = 1 << 20;

/// Where to measure: a share of an NFS server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host:port`.
    pub addr: String,
    /// The export MOUNT is asked for (`/SHARE`).
    pub export: String,
    /// Folders below the export's top.
    pub dirs: Vec<String>,
}

impl Target {
    /// Parses `nfs://HOST[:PORT]/SHARE[/DIR...]` (port 2049 by default;
    /// tarn answers MOUNT on its NFS port).
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let rest = url
            .strip_prefix("nfs://")
            .with_context(|| format!("'{url}': use nfs://HOST[:PORT]/SHARE"))?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            bail!("'{url}': no host");
        }
        let has_port = match host.rfind(']') {
            Some(close) => host[close..].contains(':'),
            None => host.contains(':'),
        };
        let addr = if has_port {
            host.to_string()
        } else {
            format!("{host}:2049")
        };
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let Some(share) = parts.next() else {
            bail!("'{url}': name the share, nfs://HOST/SHARE");
        };
        Ok(Target {
            addr,
            export: format!("/{share}"),
            dirs: parts.map(str::to_string).collect(),
        })
    }

    /// A new connection and the handle of the folder measured in.
    fn open(&self) -> anyhow::Result<(Client, Fh)> {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut c = Client::connect(&self.addr, uid, gid, 2 * MIB)
            .with_context(|| format!("cannot connect to {}", self.addr))?;
        let mut dir = c
            .mount(&self.export)
            .with_context(|| format!("mounting {} from {}", self.export, self.addr))?;
        for d in &self.dirs {
            dir = c
                .lookup(&dir, d)?
                .with_context(|| format!("{}: no folder '{d}'", self.export))?;
        }
        Ok((c, dir))
    }
}

/// The `i`-th MiB of the test file: incompressible, and known to the
/// readers, who check what comes back.
fn chunk(i: u64, buf: &mut [u8]) {
    let mut state = 0x1234_5678_9abc_def1u64 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for c in buf.chunks_mut(8) {
        c.copy_from_slice(&next(&mut state).to_le_bytes()[..c.len()]);
    }
}

/// Writes the file (`size` rounded down to MiB), four writes in flight,
/// then COMMIT; MB/s.
fn sequential_write(t: &Target, name: &str, size: u64) -> anyhow::Result<f64> {
    let (mut c, dir) = t.open()?;
    let fh = c.create(&dir, name, 0o644)?;
    let chunks = size / MIB as u64;
    let mut buf = vec![0u8; MIB];
    let t0 = Instant::now();
    let mut inflight = 0;
    for i in 0..chunks {
        if inflight == WINDOW {
            expect_written(&mut c, MIB)?;
            inflight -= 1;
        }
        chunk(i, &mut buf);
        c.send_write(&fh, i * MIB as u64, &buf, UNSTABLE)?;
        inflight += 1;
    }
    for _ in 0..inflight {
        expect_written(&mut c, MIB)?;
    }
    c.commit(&fh)?;
    Ok((chunks * MIB as u64) as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

fn expect_written(c: &mut Client, len: usize) -> anyhow::Result<()> {
    let n = write_reply(&c.recv()?.body)?;
    if n as usize != len {
        bail!("the server wrote {n} of {len} bytes");
    }
    Ok(())
}

/// Reads chunks `from..to` of the file in 1 MiB READs, four in flight,
/// checking each; bytes read.
fn read_range(t: &Target, name: &str, from: u64, to: u64) -> anyhow::Result<u64> {
    let (mut c, dir) = t.open()?;
    let fh = c
        .lookup(&dir, name)?
        .with_context(|| format!("the test file {name} is gone"))?;
    let mut want = vec![0u8; MIB];
    let mut pending: VecDeque<(u32, u64)> = VecDeque::new();
    let mut next = from;
    let mut total = 0;
    while next < to || !pending.is_empty() {
        while next < to && pending.len() < WINDOW {
            let xid = c.send_read(&fh, next * MIB as u64, MIB as u32)?;
            pending.push_back((xid, next));
            next += 1;
        }
        let reply = c.recv()?;
        let Some(at) = pending.iter().position(|(x, _)| *x == reply.xid) else {
            bail!("a reply to a READ that was not sent (xid {})", reply.xid);
        };
        let (_, i) = pending.remove(at).unwrap_or((0, 0));
        let (data, _) = read_reply(&reply.body)?;
        let n = data.len();
        if n != MIB {
            bail!("a short read at MiB {i}: {n} bytes");
        }
        chunk(i, &mut want);
        if data[..64] != want[..64] || data[n - 64..] != want[n - 64..] {
            bail!("the share returned wrong data at MiB {i}");
        }
        total += n as u64;
    }
    Ok(total)
}

/// Reads the file with `streams` connections, each a contiguous share;
/// MB/s.
fn sequential_read(t: &Target, name: &str, size: u64, streams: u64) -> anyhow::Result<f64> {
    let chunks = size / MIB as u64;
    let share = chunks / streams;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..streams)
        .map(|s| {
            let (t, name) = (t.clone(), name.to_string());
            let end = if s + 1 == streams {
                chunks
            } else {
                (s + 1) * share
            };
            std::thread::spawn(move || read_range(&t, &name, s * share, end))
        })
        .collect();
    let total = join_sum(handles)?;
    Ok(total as f64 / 1e6 / t0.elapsed().as_secs_f64())
}

/// 4 KiB requests at random offsets for `runtime`, `depth` in flight
/// over up to eight connections; requests per second (writes: with the
/// COMMIT at the end).
fn random_io(
    t: &Target,
    name: &str,
    size: u64,
    depth: usize,
    runtime: Duration,
    write: bool,
) -> anyhow::Result<f64> {
    let conns = depth.min(CONNECTIONS);
    // The file is `size` rounded down to whole MiB (what was written).
    let blocks = (size / MIB as u64) * (MIB as u64 / 4096);
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + runtime;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|k| {
            let (t, name, count) = (t.clone(), name.to_string(), count.clone());
            let window = depth / conns + usize::from(k < depth % conns);
            std::thread::spawn(move || -> anyhow::Result<Option<(Client, Fh)>> {
                let (mut c, dir) = t.open()?;
                let fh = c
                    .lookup(&dir, &name)?
                    .with_context(|| format!("the test file {name} is gone"))?;
                let buf = vec![0x5au8; 4096];
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ ((k as u64 + 1) << 32);
                let mut send = |c: &mut Client| -> anyhow::Result<()> {
                    let off = (next(&mut state) % blocks) * 4096;
                    if write {
                        c.send_write(&fh, off, &buf, UNSTABLE)?;
                    } else {
                        c.send_read(&fh, off, 4096)?;
                    }
                    Ok(())
                };
                for _ in 0..window {
                    send(&mut c)?;
                }
                let mut inflight = window;
                while inflight > 0 {
                    let r = c.recv()?;
                    if write {
                        if write_reply(&r.body)? != 4096 {
                            bail!("a short 4 KiB write");
                        }
                    } else if read_reply(&r.body)?.0.len() != 4096 {
                        bail!("a short 4 KiB read");
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    inflight -= 1;
                    if Instant::now() < deadline {
                        send(&mut c)?;
                        inflight += 1;
                    }
                }
                Ok(write.then_some((c, fh)))
            })
        })
        .collect();
    let mut committer = None;
    for h in handles {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))??;
        committer = committer.or(r);
    }
    if let Some((mut c, fh)) = committer {
        c.commit(&fh)?;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// A file of an NFS share: its target and name.
struct NfsFile {
    t: Target,
    name: String,
}

impl TestFile for NfsFile {
    fn write(&self, size: u64) -> anyhow::Result<f64> {
        sequential_write(&self.t, &self.name, size)
    }

    fn read(&self, size: u64, streams: u64) -> anyhow::Result<f64> {
        sequential_read(&self.t, &self.name, size, streams)
    }

    fn random(
        &self,
        size: u64,
        depth: usize,
        runtime: Duration,
        write: bool,
    ) -> anyhow::Result<f64> {
        random_io(&self.t, &self.name, size, depth, runtime, write)
    }
}

/// Every workload on a file of `size` bytes in the share `url`; the file
/// is removed afterwards (also when a workload fails).
pub fn run(
    url: &str,
    size: u64,
    runtime: Duration,
    progress: &dyn Fn(&str),
) -> anyhow::Result<BenchRow> {
    let f = NfsFile {
        t: Target::parse(url)?,
        name: format!(
            "tarn-bench-{}-{}.dat",
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            std::process::id()
        ),
    };
    let result = row(&f, size, runtime, progress);
    if let Ok((mut c, dir)) = f.t.open() {
        let _ = c.remove(&dir, &f.name);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let t = Target::parse("nfs://nas.local/photos").unwrap();
        assert_eq!(t.addr, "nas.local:2049");
        assert_eq!(t.export, "/photos");
        assert!(t.dirs.is_empty());
        let t = Target::parse("nfs://127.0.0.1:20490/photos/2026/raw/").unwrap();
        assert_eq!(t.addr, "127.0.0.1:20490");
        assert_eq!(t.dirs, ["2026", "raw"]);
        assert_eq!(Target::parse("nfs://[::1]/a").unwrap().addr, "[::1]:2049");
        assert_eq!(Target::parse("nfs://[::1]:7/a").unwrap().addr, "[::1]:7");
        for bad in ["http://h/a", "nfs://", "nfs://h", "nfs://h/", "nfs:///a"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chunks_differ_and_repeat() {
        let (mut a, mut b, mut c) = (vec![0u8; 4096], vec![0u8; 4096], vec![0u8; 4096]);
        chunk(1, &mut a);
        chunk(2, &mut b);
        chunk(1, &mut c);
        assert_ne!(a, b);
        assert_eq!(a, c);
    }
}

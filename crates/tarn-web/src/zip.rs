//! A streamed ZIP writer for folder downloads: entries are stored (not
//! compressed: photos and videos do not shrink, and the CPU is better
//! spent serving), each followed by a data descriptor, so nothing has to
//! be known before the bytes go out and nothing is buffered but the
//! central directory (one small record per entry).
//!
//! Sizes and offsets past 4 GiB, and more than 65,535 entries, use the
//! ZIP64 records (APPNOTE 4.3.9 and 4.5.3): only where needed, so small
//! archives stay readable by the oldest tools. Names are UTF-8 (flag bit
//! 11). A failed write is returned to the caller, which must then abort
//! the transfer: a cut-short archive lacks its central directory and no
//! reader takes it for whole.

use std::io::{self, Write};

const LOCAL: u32 = 0x0403_4b50;
const DESCRIPTOR: u32 = 0x0807_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const END: u32 = 0x0605_4b50;
const END64: u32 = 0x0606_4b50;
const LOCATOR64: u32 = 0x0706_4b50;
/// Bit 3 (sizes in a data descriptor) and bit 11 (UTF-8 names).
const FLAGS: u16 = 0x0808;
const MAX32: u64 = 0xFFFF_FFFF;

struct Entry {
    name: Vec<u8>,
    crc: u32,
    size: u64,
    offset: u64,
    time: u16,
    date: u16,
    dir: bool,
    /// Its local header carries ZIP64 sizes.
    zip64: bool,
}

/// Writes one archive into `W`, entry after entry.
pub struct ZipWriter<W: Write> {
    w: W,
    at: u64,
    entries: Vec<Entry>,
    /// The entry being written: its crc so far and size.
    open: Option<(crc32fast::Hasher, u64)>,
    /// Sizes and offsets from this value on use ZIP64 fields (tests
    /// lower it to exercise them without writing 4 GiB).
    pub zip64_from: u64,
}

/// MS-DOS time and date of a Unix time (UTC; 1980 is the earliest).
fn dos_time(unix: i64) -> (u16, u16) {
    if unix < 315_532_800 {
        // Before 1980-01-01, the first day MS-DOS dates can hold.
        return (0, (1 << 5) | 1);
    }
    let secs = unix % 86_400;
    let (y, m, d) = tarn_api::time::civil_from_days(unix as u64 / 86_400);
    let (y, m, d) = (y as i64, m as i64, d as i64);
    let y = y.min(2107);
    let time = ((secs / 3600) << 11) | (((secs % 3600) / 60) << 5) | ((secs % 60) / 2);
    let date = ((y - 1980) << 9) | (m << 5) | d;
    (time as u16, date as u16)
}

impl<W: Write> ZipWriter<W> {
    /// An empty archive writing into `w`.
    pub fn new(w: W) -> ZipWriter<W> {
        ZipWriter {
            w,
            at: 0,
            entries: Vec::new(),
            open: None,
            zip64_from: MAX32,
        }
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.at += b.len() as u64;
        Ok(())
    }

    fn local(&mut self, name: &str, mtime: i64, dir: bool, size: Option<u64>) -> io::Result<()> {
        self.end_file()?;
        let (time, date) = dos_time(mtime);
        // A `\` would be a folder separator to Windows' extractors.
        let mut name = name.replace('\\', "_").into_bytes();
        if dir {
            name.push(b'/');
        }
        if name.len() > usize::from(u16::MAX) {
            return Err(io::Error::other("a path too long for a ZIP"));
        }
        // A file known to be large says so here too (ZIP64 sizes), for
        // readers that stream rather than read the central directory.
        let big = size.is_some_and(|s| s >= self.zip64_from);
        let mut extra = Vec::new();
        if big {
            extra.extend(1u16.to_le_bytes());
            extra.extend(16u16.to_le_bytes());
            extra.extend([0u8; 16]); // sizes: in the descriptor
        }
        let mut h = Vec::with_capacity(30 + name.len() + extra.len());
        h.extend(LOCAL.to_le_bytes());
        h.extend(if big { 45u16 } else { 20u16 }.to_le_bytes());
        h.extend(FLAGS.to_le_bytes());
        h.extend(0u16.to_le_bytes()); // stored
        h.extend(time.to_le_bytes());
        h.extend(date.to_le_bytes());
        h.extend([0u8; 4]); // crc: in the descriptor
        let size32: u32 = if big { u32::MAX } else { 0 };
        h.extend(size32.to_le_bytes());
        h.extend(size32.to_le_bytes());
        h.extend((name.len() as u16).to_le_bytes());
        h.extend((extra.len() as u16).to_le_bytes());
        h.extend(&name);
        h.extend(&extra);
        let offset = self.at;
        self.put(&h)?;
        self.entries.push(Entry {
            name,
            crc: 0,
            size: 0,
            offset,
            time,
            date,
            dir,
            zip64: big,
        });
        Ok(())
    }

    /// Adds a folder entry (`name` without the trailing slash).
    pub fn dir(&mut self, name: &str, mtime: i64) -> io::Result<()> {
        self.local(name, mtime, true, Some(0))?;
        self.open = Some((crc32fast::Hasher::new(), 0));
        self.end_file()
    }

    /// Starts a file entry of `size` bytes if known; its bytes follow
    /// with [`ZipWriter::write`].
    pub fn start_file(&mut self, name: &str, mtime: i64, size: Option<u64>) -> io::Result<()> {
        self.local(name, mtime, false, size)?;
        self.open = Some((crc32fast::Hasher::new(), 0));
        Ok(())
    }

    /// Bytes of the file entry being written.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let Some((crc, size)) = self.open.as_mut() else {
            return Err(io::Error::other("no file entry is open"));
        };
        crc.update(data);
        *size += data.len() as u64;
        self.put(data)
    }

    /// Ends the open entry with its data descriptor.
    fn end_file(&mut self) -> io::Result<()> {
        let Some((crc, size)) = self.open.take() else {
            return Ok(());
        };
        let crc = crc.finalize();
        let big = size >= self.zip64_from || self.entries.last().is_some_and(|e| e.zip64);
        if let Some(e) = self.entries.last_mut() {
            e.crc = crc;
            e.size = size;
        }
        if self.entries.last().is_some_and(|e| e.dir) {
            return Ok(());
        }
        let mut d = Vec::with_capacity(24);
        d.extend(DESCRIPTOR.to_le_bytes());
        d.extend(crc.to_le_bytes());
        if big {
            d.extend(size.to_le_bytes());
            d.extend(size.to_le_bytes());
        } else {
            d.extend((size as u32).to_le_bytes());
            d.extend((size as u32).to_le_bytes());
        }
        self.put(&d)
    }

    /// Writes the central directory and the end records; returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.end_file()?;
        let cd_start = self.at;
        let entries = std::mem::take(&mut self.entries);
        for e in &entries {
            let big_size = e.size >= self.zip64_from || e.zip64;
            let big_off = e.offset >= self.zip64_from;
            let mut extra = Vec::new();
            if big_size || big_off {
                let mut body = Vec::new();
                if big_size {
                    body.extend(e.size.to_le_bytes());
                    body.extend(e.size.to_le_bytes());
                }
                if big_off {
                    body.extend(e.offset.to_le_bytes());
                }
                extra.extend(1u16.to_le_bytes());
                extra.extend((body.len() as u16).to_le_bytes());
                extra.extend(body);
            }
            let version: u16 = if extra.is_empty() { 20 } else { 45 };
            let size32 = if big_size { MAX32 } else { e.size } as u32;
            let off32 = if big_off { MAX32 } else { e.offset } as u32;
            let mut c = Vec::with_capacity(46 + e.name.len() + extra.len());
            c.extend(CENTRAL.to_le_bytes());
            c.extend((0x0300 | version).to_le_bytes()); // made by Unix
            c.extend(version.to_le_bytes());
            c.extend(FLAGS.to_le_bytes());
            c.extend(0u16.to_le_bytes());
            c.extend(e.time.to_le_bytes());
            c.extend(e.date.to_le_bytes());
            c.extend(e.crc.to_le_bytes());
            c.extend(size32.to_le_bytes());
            c.extend(size32.to_le_bytes());
            c.extend((e.name.len() as u16).to_le_bytes());
            c.extend((extra.len() as u16).to_le_bytes());
            c.extend(0u16.to_le_bytes()); // comment
            c.extend(0u16.to_le_bytes()); // disk
            c.extend(0u16.to_le_bytes()); // internal attributes
            let mode: u32 = if e.dir { 0o040755 } else { 0o100644 };
            c.extend(((mode << 16) | (u32::from(e.dir) * 0x10)).to_le_bytes());
            c.extend(off32.to_le_bytes());
            c.extend(&e.name);
            c.extend(extra);
            self.put(&c)?;
        }
        let cd_size = self.at - cd_start;
        let n = entries.len() as u64;
        let big = n >= 0xFFFF.min(self.zip64_from)
            || cd_size >= self.zip64_from
            || cd_start >= self.zip64_from;
        if big {
            let end64_at = self.at;
            let mut z = Vec::with_capacity(76);
            z.extend(END64.to_le_bytes());
            z.extend(44u64.to_le_bytes());
            z.extend(0x032Du16.to_le_bytes());
            z.extend(45u16.to_le_bytes());
            z.extend(0u32.to_le_bytes());
            z.extend(0u32.to_le_bytes());
            z.extend(n.to_le_bytes());
            z.extend(n.to_le_bytes());
            z.extend(cd_size.to_le_bytes());
            z.extend(cd_start.to_le_bytes());
            z.extend(LOCATOR64.to_le_bytes());
            z.extend(0u32.to_le_bytes());
            z.extend(end64_at.to_le_bytes());
            z.extend(1u32.to_le_bytes());
            self.put(&z)?;
        }
        let n16 = if big { 0xFFFF } else { n as u16 };
        let (size32, start32) = if big {
            (MAX32 as u32, MAX32 as u32)
        } else {
            (cd_size as u32, cd_start as u32)
        };
        let mut e = Vec::with_capacity(22);
        e.extend(END.to_le_bytes());
        e.extend([0u8; 4]);
        e.extend(n16.to_le_bytes());
        e.extend(n16.to_le_bytes());
        e.extend(size32.to_le_bytes());
        e.extend(start32.to_le_bytes());
        e.extend(0u16.to_le_bytes());
        self.put(&e)?;
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(zip64_from: u64) -> Vec<u8> {
        let mut z = ZipWriter::new(Vec::new());
        z.zip64_from = zip64_from;
        z.dir("photos", 1_700_000_000).unwrap();
        z.start_file("photos/a.txt", 1_700_000_000, None).unwrap();
        z.write(b"hello ").unwrap();
        z.write(b"world").unwrap();
        z.start_file("photos/é b.bin", 0, Some(100_000)).unwrap();
        z.write(&(0..=255u8).cycle().take(100_000).collect::<Vec<_>>())
            .unwrap();
        z.start_file("empty", 1_800_000_000, Some(0)).unwrap();
        z.finish().unwrap()
    }

    /// Python's zipfile reads the archive, checks every CRC and gives the
    /// bytes back: both the plain layout and the ZIP64 one (forced by a
    /// threshold of 0).
    #[test]
    fn python_reads_plain_and_zip64_archives() {
        for zip64_from in [MAX32, 0] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.zip");
            std::fs::write(&path, archive(zip64_from)).unwrap();
            let script = "import sys, zipfile, hashlib\n\
                z = zipfile.ZipFile(sys.argv[1])\n\
                assert z.testzip() is None\n\
                for i in z.infolist():\n\
                \x20   print(i.filename, i.file_size, hashlib.sha256(z.read(i)).hexdigest(), i.date_time[0])\n";
            let out = std::process::Command::new("python3")
                .arg("-c")
                .arg(script)
                .arg(&path)
                .output()
                .expect("python3 is needed by this test");
            assert!(
                out.status.success(),
                "zip64_from {zip64_from}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 4, "{text}");
            assert!(lines[0].starts_with("photos/ 0 "), "{text}");
            let hello = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";
            assert_eq!(lines[1], format!("photos/a.txt 11 {hello} 2023"));
            assert!(lines[2].starts_with("photos/é b.bin 100000 "), "{text}");
            assert!(lines[2].ends_with(" 1980"), "before 1980 is 1980: {text}");
            assert!(lines[3].starts_with("empty 0 "), "{text}");
        }
    }

    #[test]
    fn dos_dates() {
        // 2023-11-14 22:13:20 UTC
        let (t, d) = dos_time(1_700_000_000);
        assert_eq!(d >> 9, 2023 - 1980);
        assert_eq!((d >> 5) & 0xF, 11);
        assert_eq!(d & 0x1F, 14);
        assert_eq!(t >> 11, 22);
        assert_eq!((t >> 5) & 0x3F, 13);
        assert_eq!((t & 0x1F) * 2, 20);
    }
}

//! Compression of block contents.
//!
//! A block is kept compressed only when that saves at least 1/8 of its
//! logical size (rounded to the device sector by the caller's choice of
//! `min_saving`); otherwise it is stored as is, so incompressible data costs
//! one failed attempt and no read-side work.

use std::borrow::Cow;

use crate::bp::CompressAlg;
use crate::BlockError;

/// The compression property of a dataset or pool: algorithm and level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    Off,
    /// LZ4: cheap, the default for datasets.
    #[default]
    Lz4,
    /// zstd at a level from 1 to 19.
    Zstd(i32),
}

impl Compression {
    /// Parses `off`, `lz4`, `zstd` (level 3) or `zstd-N`.
    pub fn parse(s: &str) -> Result<Self, BlockError> {
        let bad = || {
            BlockError::InvalidProperty(format!(
                "compression={s}: expected off, lz4, zstd or zstd-1..zstd-19"
            ))
        };
        match s {
            "off" => Ok(Self::Off),
            "lz4" | "on" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd(3)),
            _ => {
                let level: i32 = s
                    .strip_prefix("zstd-")
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?;
                if (1..=19).contains(&level) {
                    Ok(Self::Zstd(level))
                } else {
                    Err(bad())
                }
            }
        }
    }

    /// The property value users see.
    pub fn name(&self) -> String {
        match self {
            Self::Off => "off".into(),
            Self::Lz4 => "lz4".into(),
            Self::Zstd(3) => "zstd".into(),
            Self::Zstd(l) => format!("zstd-{l}"),
        }
    }

    /// Compresses `data` if that saves at least 1/8; returns the algorithm
    /// recorded in the pointer and the bytes to store: `data` itself when
    /// it stays uncompressed (a record is not copied only to be written).
    pub fn compress<'a>(&self, data: &'a [u8]) -> (CompressAlg, Cow<'a, [u8]>) {
        self.compress_with(data, true)
    }

    /// [`Compression::compress`]; with `recycle` false, an output that is
    /// not kept is freed rather than handed to the spare buffers (a block
    /// of an encrypted dataset: its compressed plaintext is not kept in
    /// the process past its use, see `spare`).
    pub(crate) fn compress_with<'a>(
        &self,
        data: &'a [u8],
        recycle: bool,
    ) -> (CompressAlg, Cow<'a, [u8]>) {
        let give = |v: Vec<u8>| {
            if recycle {
                crate::spare::give(v);
            }
        };
        let limit = data.len() - data.len() / 8;
        let out = match self {
            Self::Off => None,
            Self::Lz4 => {
                let mut v =
                    crate::spare::take(4 + lz4_flex::block::get_maximum_output_size(data.len()));
                v.extend_from_slice(&(data.len() as u32).to_le_bytes());
                v.resize(4 + lz4_flex::block::get_maximum_output_size(data.len()), 0);
                match lz4_flex::block::compress_into(data, &mut v[4..]) {
                    Ok(n) => {
                        v.truncate(4 + n);
                        Some((CompressAlg::Lz4, v))
                    }
                    Err(_) => {
                        give(v);
                        None
                    }
                }
            }
            Self::Zstd(level) => zstd::bulk::compress(data, *level)
                .ok()
                .map(|v| (CompressAlg::Zstd, v)),
        };
        match out {
            Some((alg, v)) if !data.is_empty() && v.len() <= limit => (alg, Cow::Owned(v)),
            Some((_, v)) => {
                give(v);
                (CompressAlg::Off, Cow::Borrowed(data))
            }
            None => (CompressAlg::Off, Cow::Borrowed(data)),
        }
    }
}

/// Decompresses stored bytes to exactly `lsize` bytes. Input comes from
/// disk: every length is checked, nothing is trusted.
pub fn decompress(alg: CompressAlg, stored: &[u8], lsize: usize) -> Result<Vec<u8>, String> {
    match alg {
        CompressAlg::Off => {
            if stored.len() != lsize {
                return Err(format!("stored {} bytes, expected {lsize}", stored.len()));
            }
            Ok(stored.to_vec())
        }
        CompressAlg::Lz4 => {
            if stored.len() < 4 {
                return Err("lz4 block shorter than its header".into());
            }
            let n = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]) as usize;
            if n != lsize {
                return Err(format!("lz4 header says {n} bytes, pointer says {lsize}"));
            }
            let mut out = vec![0u8; lsize];
            let got = lz4_flex::block::decompress_into(&stored[4..], &mut out)
                .map_err(|e| e.to_string())?;
            if got != lsize {
                return Err(format!("lz4 produced {got} bytes, expected {lsize}"));
            }
            Ok(out)
        }
        CompressAlg::Zstd => {
            let out = zstd::bulk::decompress(stored, lsize).map_err(|e| e.to_string())?;
            if out.len() != lsize {
                return Err(format!(
                    "zstd produced {} bytes, expected {lsize}",
                    out.len()
                ));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn roundtrip(data in proptest::collection::vec(0u8..4, 0..70000), which in 0usize..4) {
            let c = [Compression::Off, Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)][which];
            let (alg, stored) = c.compress(&data);
            prop_assert!(stored.len() <= data.len());
            prop_assert_eq!(decompress(alg, &stored, data.len()).unwrap(), data);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000), lsize in 0usize..5000) {
            for alg in [CompressAlg::Off, CompressAlg::Lz4, CompressAlg::Zstd] {
                let _ = decompress(alg, &data, lsize);
            }
        }
    }

    #[test]
    fn keeps_only_worthwhile_compression() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert_eq!(Compression::Lz4.compress(&random).0, CompressAlg::Off);
        let zeros = vec![0u8; 65536];
        let (alg, v) = Compression::Zstd(3).compress(&zeros);
        assert_eq!(alg, CompressAlg::Zstd);
        assert!(v.len() < 1000);
    }

    #[test]
    fn parse_names() {
        assert_eq!(Compression::parse("zstd-7").unwrap(), Compression::Zstd(7));
        assert_eq!(Compression::parse("zstd").unwrap().name(), "zstd");
        assert!(Compression::parse("zstd-20").is_err());
        assert!(Compression::parse("gzip").is_err());
    }
}

//! Deterministic test data: a seeded SplitMix64 generator, patterns and
//! mixed workloads derived from a seed, so a failing case replays byte for
//! byte; seeds from the environment or the clock; proptest's case count.

/// SplitMix64: small, fast, the same on every platform, and good from any
/// seed (0 included).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo))
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An independent generator seeded from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }

    /// Fills `buf` with random bytes (eight a step, little-endian).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes()[..chunk.len()]);
        }
    }

    /// `len` random (incompressible) bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }

    /// `len` bytes of one of several kinds, and the kind's name: random
    /// (incompressible, half the time), runs of one byte, a repeated phrase
    /// (compressible), or all zeros (which the engine stores as holes).
    pub fn mixed(&mut self, len: usize) -> (Vec<u8>, &'static str) {
        match self.below(10) {
            0..=4 => (self.bytes(len), "random"),
            5 | 6 => {
                let mut v = Vec::with_capacity(len);
                while v.len() < len {
                    let b = self.next_u64() as u8;
                    let run = self.range(1, 3000) as usize;
                    v.extend(std::iter::repeat_n(b, run.min(len - v.len())));
                }
                (v, "runs")
            }
            7 => (vec![0; len], "zeros"),
            _ => {
                let phrase: Vec<u8> = (0..self.range(3, 40))
                    .map(|_| b'a' + self.below(26) as u8)
                    .collect();
                (phrase.iter().copied().cycle().take(len).collect(), "phrase")
            }
        }
    }
}

/// `len` random bytes determined by `seed`: what a test writes and later
/// expects.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// A seed written in decimal or in hex with `0x`, `_` allowed anywhere.
pub fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

/// The seed in the environment variable `var`, if set (a value that is not
/// a number fails the test).
pub fn env_seed(var: &str) -> Option<u64> {
    let s = std::env::var(var).ok()?;
    Some(parse_seed(&s).unwrap_or_else(|| panic!("{var}={s}: not a number")))
}

/// A seed that differs from run to run (the clock, hashed).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Proptest's configuration with `ci` cases, or `PROPTEST_CASES` cases
/// when that is set (for longer runs).
pub fn cases(ci: u32) -> proptest::test_runner::Config {
    if std::env::var_os("PROPTEST_CASES").is_some() {
        proptest::test_runner::Config::default()
    } else {
        proptest::test_runner::Config::with_cases(ci)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_replay_and_differ() {
        assert_eq!(pattern(7, 100), pattern(7, 100));
        assert_ne!(pattern(7, 100), pattern(8, 100));
        assert_eq!(pattern(7, 10), pattern(7, 100)[..10]);
        let mut r = Rng::new(0);
        assert!((0..100).all(|_| r.below(10) < 10));
        assert!((0..100).all(|_| (5..9).contains(&r.range(5, 9))));
        assert_eq!(r.below(0), 0);
        let (a, b) = (r.fork().next_u64(), r.fork().next_u64());
        assert_ne!(a, b);
        for len in [0, 1, 5000] {
            assert_eq!(Rng::new(3).mixed(len).0.len(), len);
        }
    }

    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seed("0x7a51_d000"), Some(0x7a51_d000));
        assert_eq!(parse_seed(" 1_000 "), Some(1000));
        assert_eq!(parse_seed("nope"), None);
    }
}

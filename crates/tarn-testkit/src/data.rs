//! Deterministic test data: a seeded xorshift64* generator and patterns
//! derived from a seed, so a failing case replays byte for byte.

/// xorshift64*: deterministic, seedable, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }

    /// One element of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// `len` bytes determined by `seed`: what a test writes and later expects.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
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
    }
}

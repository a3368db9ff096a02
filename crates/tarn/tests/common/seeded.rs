//! Seeded randomness for the crash loops: one generator, and the rounds and
//! seed a run uses (`TARN_CRASH_ROUNDS`, `TARN_CRASH_SEED` to replay).

/// xorshift64: small, fast, and the same sequence for the same seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Rounds (`TARN_CRASH_ROUNDS`, else `default_rounds`) and seed
/// (`TARN_CRASH_SEED`, else the clock), never zero.
pub fn crash_settings(default_rounds: u64) -> (u64, u64) {
    let env = |name| std::env::var(name).ok().and_then(|v| v.parse().ok());
    let rounds = env("TARN_CRASH_ROUNDS").unwrap_or(default_rounds);
    let seed = env("TARN_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    (rounds, seed | 1)
}

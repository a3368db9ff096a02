//! The rounds and seed a crash loop uses (`TARN_CRASH_ROUNDS`,
//! `TARN_CRASH_SEED` to replay); the generator is `tarn_testkit::data::Rng`.

use tarn_testkit::data::{env_seed, random_seed};

/// Rounds (`TARN_CRASH_ROUNDS`, else `default_rounds`) and seed
/// (`TARN_CRASH_SEED`, decimal or `0x` hex, else a new one).
pub fn crash_settings(default_rounds: u64) -> (u64, u64) {
    let rounds = std::env::var("TARN_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_rounds);
    let seed = env_seed("TARN_CRASH_SEED").unwrap_or_else(random_seed);
    (rounds, seed)
}

//! One malloc arena for the whole process.
//!
//! glibc's malloc gives threads arenas of their own (up to eight per core)
//! so they seldom wait for one another's lock. tarn's large allocations
//! are made on one thread and freed on another: a request's thread stages
//! a block and the txg sync frees it once written; the block cache grows
//! on whichever thread reads and shrinks on whichever evicts. Memory freed
//! into one arena cannot serve the next allocation of a thread attached
//! to another, and the arenas other than the main one hand the free top
//! of their heaps back to the kernel. So the next txg's blocks, or the
//! cache refilling after an import, were faulted in and cleared by the
//! kernel page by page again: a quarter of the daemon's CPU in a 1 GiB
//! sequential write or cold read, on the runs where the new connection's
//! thread landed in an arena without free memory (docs/performance.md,
//! "One malloc arena").
//!
//! With one arena, memory any thread frees is what the next allocation of
//! any thread reuses. The cost is one lock for every allocation that
//! glibc's per-thread cache does not serve (those of more than about a
//! kilobyte). On the two-core machine measured, random 4k volume reads
//! and writes with 32 requests in flight were as fast or faster, and
//! small-file creates and stats through FUSE's 16 threads 5-8% slower.
//! `MALLOC_ARENA_MAX` in the environment wins over this, for hosts where
//! more arenas measure better.
//!
//! Only glibc has arenas; elsewhere this does nothing.

/// Environment variable with which glibc users choose their arena count;
/// when it is set, the process keeps what it says.
pub const ARENA_ENV: &str = "MALLOC_ARENA_MAX";

/// Limits malloc to one arena, unless [`ARENA_ENV`] is set. Call it first
/// thing in `main`, before any thread starts: a thread keeps the arena it
/// has, and arenas already made are shared out again. Returns whether the
/// limit is now in force.
pub fn share_one_heap() -> bool {
    if std::env::var_os(ARENA_ENV).is_some() {
        return false;
    }
    set_one_arena()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_one_arena() -> bool {
    // SAFETY: mallopt only sets one of malloc's tunables under malloc's own
    // lock; it takes no pointers and is safe to call at any time.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_one_arena() -> bool {
    false
}

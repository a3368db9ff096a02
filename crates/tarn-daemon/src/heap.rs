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
//! small-file creates and stats through FUSE's 16 threads about 5% and
//! 10% slower. An arena count chosen in the environment (`MALLOC_ARENA_MAX`
//! or `GLIBC_TUNABLES=glibc.malloc.arena_max=N`) wins over this, for hosts
//! where more arenas measure better.
//!
//! Only glibc has arenas; elsewhere this does nothing.

/// Environment variable with which glibc users choose their arena count;
/// when it holds a count, the process keeps what it says.
pub const ARENA_ENV: &str = "MALLOC_ARENA_MAX";

/// glibc's tunables variable, which can choose the arena count too
/// (`glibc.malloc.arena_max`).
pub const TUNABLES_ENV: &str = "GLIBC_TUNABLES";

/// Whether the environment already chose an arena count: a positive
/// number in [`ARENA_ENV`] (glibc ignores anything else there), or
/// `glibc.malloc.arena_max` among the [`TUNABLES_ENV`] settings.
pub fn arena_count_chosen(arena_max: Option<&str>, tunables: Option<&str>) -> bool {
    let counted = arena_max.is_some_and(|v| v.trim().parse::<u64>().is_ok_and(|n| n > 0));
    let tuned = tunables.is_some_and(|t| {
        t.split(':')
            .any(|kv| kv.trim_start().starts_with("glibc.malloc.arena_max="))
    });
    counted || tuned
}

/// Limits malloc to one arena, unless the environment chose a count (see
/// [`arena_count_chosen`]). Returns whether the limit is now in force.
///
/// # Safety
///
/// No other thread may exist yet: glibc's `mallopt` writes malloc's
/// settings without synchronising with other threads' allocations, and a
/// thread that already has an arena keeps it. Call it first in `main`.
pub unsafe fn share_one_heap() -> bool {
    let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    if arena_count_chosen(var(ARENA_ENV).as_deref(), var(TUNABLES_ENV).as_deref()) {
        return false;
    }
    // SAFETY: the caller promises no other thread exists (see above), so
    // nothing allocates while mallopt writes; it takes no pointers.
    unsafe { set_one_arena() }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn set_one_arena() -> bool {
    // SAFETY: single-threaded per the caller's contract; mallopt sets one
    // of malloc's tunables and returns 1 when it took it.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
unsafe fn set_one_arena() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::arena_count_chosen;

    #[test]
    fn the_environment_chooses_only_with_a_count() {
        assert!(!arena_count_chosen(None, None));
        assert!(arena_count_chosen(Some("4"), None));
        assert!(arena_count_chosen(Some(" 16 "), None));
        // glibc ignores these, and so does tarn: one arena applies.
        assert!(!arena_count_chosen(Some(""), None));
        assert!(!arena_count_chosen(Some("0"), None));
        assert!(!arena_count_chosen(Some("many"), None));
        assert!(arena_count_chosen(None, Some("glibc.malloc.arena_max=2")));
        assert!(arena_count_chosen(
            None,
            Some("glibc.malloc.tcache_count=0:glibc.malloc.arena_max=8")
        ));
        assert!(!arena_count_chosen(
            None,
            Some("glibc.malloc.tcache_count=0")
        ));
        assert!(!arena_count_chosen(None, Some("glibc.malloc.arena_test=2")));
    }
}

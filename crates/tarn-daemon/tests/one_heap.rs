//! `heap::share_one_heap`: threads started after it allocate from the
//! main arena, which lives in the process's `[heap]` mapping (the one the
//! program break extends), where without it each new thread gets an arena
//! of its own in mappings elsewhere. No test harness (see Cargo.toml): the
//! harness's own threads would have made arenas before the call.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use tarn_daemon::heap;
    let var = |name: &str| std::env::var(name).ok();
    // SAFETY: the first statement of this harness-less test's `main`: no
    // other thread exists yet.
    let limited = unsafe { heap::share_one_heap() };
    if heap::arena_count_chosen(
        var(heap::ARENA_ENV).as_deref(),
        var(heap::TUNABLES_ENV).as_deref(),
    ) {
        // The environment chose; the function rightly left it alone.
        assert!(!limited, "the environment chose an arena count");
        println!("one_heap: the environment's arena count kept");
        return;
    }
    assert!(limited, "mallopt refused M_ARENA_MAX");
    // Four threads at once, each holding its block while the others
    // allocate (so none can hand its memory to the next): 16 KiB is far
    // below the size malloc maps on its own.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let block = vec![7u8; 16 << 10];
                barrier.wait();
                let heap = heap_mapping();
                let at = block.as_ptr() as usize;
                barrier.wait();
                (at, heap, block.iter().map(|&b| b as usize).sum::<usize>())
            })
        })
        .collect();
    for t in threads {
        let (at, heap, sum) = t.join().expect("an allocating thread panicked");
        assert_eq!(sum, 7 << 14);
        let (start, end) = heap.expect("the process has a [heap] mapping");
        assert!(
            (start..end).contains(&at),
            "a new thread's block at {at:#x} lies outside the main arena's \
             [heap] {start:#x}-{end:#x}: it came from an arena of its own"
        );
    }
    println!("one_heap: ok");
}

/// The `[heap]` mapping's range, from /proc/self/maps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap_mapping() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.trim_end().ends_with("[heap]"))?;
    let range = line.split_whitespace().next()?;
    let (a, b) = range.split_once('-')?;
    Some((
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    ))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    // SAFETY: no other thread exists yet.
    assert!(!unsafe { tarn_daemon::heap::share_one_heap() });
}

//! Concurrency stress through a FUSE mount of a real pool: several
//! threads write, read, rename, truncate and delete files in their own and
//! in a shared directory at once, while txgs are synced, scrubs run and
//! snapshots are taken and destroyed. Then everything is verified against
//! each thread's model, through the mount, in the snapshots (readable) and
//! after a crash-style re-import of the pool. Needs root and /dev/fuse
//! (skips otherwise). `TARN_SEED` replays a run.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tarn_fuse::MountOptions;
use tarn_testkit::data::{env_seed, random_seed, Rng};
use tarn_testkit::datasets::{self, FsPool};
use tarn_testkit::{pools, require};

const WORKERS: u64 = 4;
const OPS: usize = 600;

/// One worker's files: path relative to the mount → contents.
type Model = BTreeMap<String, Vec<u8>>;

fn size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => rng.range(1 << 20, 5 << 19) as usize,
        1 => 0,
        _ => rng.below(96 << 10) as usize,
    }
}

/// Runs one worker's random operations on its own names (`w{t}/…` and
/// `shared/t{t}-…`), keeping `model` in step.
fn worker(root: &Path, t: u64, mut rng: Rng, fsync: bool) -> Model {
    let mut model = Model::new();
    let dirs = [format!("w{t}"), "shared".to_string()];
    let p = |rel: &str| root.join(rel);
    for i in 0..OPS {
        let names: Vec<String> = model.keys().cloned().collect();
        let pick_new = |rng: &mut Rng| {
            let d = rng.pick(&dirs).clone();
            let prefix = if d == "shared" {
                format!("t{t}-")
            } else {
                String::new()
            };
            format!("{d}/{prefix}f{}", rng.below(24))
        };
        match rng.below(10) {
            // Write a whole file (new or replaced).
            0..=2 => {
                let name = pick_new(&mut rng);
                let len = size(&mut rng);
                let data = rng.bytes(len);
                fs::write(p(&name), &data).unwrap_or_else(|e| panic!("write {name}: {e}"));
                model.insert(name, data);
            }
            // Overwrite or extend a range of an existing file.
            3 if !names.is_empty() => {
                let name = rng.pick(&names).clone();
                let cur = model.get_mut(&name).expect("in the model");
                let off = rng.below(cur.len() as u64 + 4096) as usize;
                let len = rng.range(1, 200_000) as usize;
                let data = rng.bytes(len);
                let f = OpenOptions::new().write(true).open(p(&name)).unwrap();
                f.write_all_at(&data, off as u64).unwrap();
                if rng.chance(0.3) && fsync {
                    f.sync_data().unwrap();
                }
                if cur.len() < off + data.len() {
                    cur.resize(off + data.len(), 0);
                }
                cur[off..off + data.len()].copy_from_slice(&data);
            }
            // Append.
            4 if !names.is_empty() => {
                let name = rng.pick(&names).clone();
                let len = rng.range(1, 50_000) as usize;
                let data = rng.bytes(len);
                let mut f = OpenOptions::new().append(true).open(p(&name)).unwrap();
                f.write_all(&data).unwrap();
                model.get_mut(&name).expect("in the model").extend(&data);
            }
            // Read back and compare.
            5 | 6 if !names.is_empty() => {
                let name = rng.pick(&names);
                let got = fs::read(p(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
                assert!(got == model[name], "worker {t} op {i}: {name} differs");
            }
            // Rename, possibly over one of its own files, possibly into
            // the other directory.
            7 if !names.is_empty() => {
                let from = rng.pick(&names).clone();
                let to = pick_new(&mut rng);
                fs::rename(p(&from), p(&to)).unwrap_or_else(|e| panic!("rename {from}: {e}"));
                if from != to {
                    let data = model.remove(&from).expect("in the model");
                    model.insert(to, data);
                }
            }
            // Truncate.
            8 if !names.is_empty() => {
                let name = rng.pick(&names).clone();
                let len = rng.below(200_000);
                let f = OpenOptions::new().write(true).open(p(&name)).unwrap();
                f.set_len(len).unwrap();
                model
                    .get_mut(&name)
                    .expect("in the model")
                    .resize(len as usize, 0);
            }
            // Delete.
            _ if !names.is_empty() => {
                let name = rng.pick(&names).clone();
                fs::remove_file(p(&name)).unwrap_or_else(|e| panic!("unlink {name}: {e}"));
                model.remove(&name);
            }
            _ => {}
        }
    }
    model
}

/// Every regular file under `dir`, relative to it, with its contents.
fn tree(dir: &Path, rel: &str, out: &mut Model) {
    for e in fs::read_dir(dir.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = format!(
            "{rel}{}{}",
            if rel.is_empty() { "" } else { "/" },
            e.file_name().to_string_lossy()
        );
        if e.file_type().unwrap().is_dir() {
            tree(dir, &name, out);
        } else {
            out.insert(name.clone(), fs::read(dir.join(&name)).unwrap());
        }
    }
}

fn verify(root: &Path, expected: &Model, when: &str) {
    let mut got = Model::new();
    tree(root, "", &mut got);
    let names = |m: &Model| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&got), names(expected), "{when}: names differ");
    for (name, data) in expected {
        assert!(got[name] == *data, "{when}: {name} differs");
    }
}

fn mount(fs: Arc<datasets::DsFs>, at: &Path) -> tarn_fuse::Mount {
    tarn_fuse::mount(fs, at, &MountOptions::default()).expect("mount")
}

#[test]
fn parallel_clients_with_syncs_scrubs_and_snapshots() {
    stress(false);
}

/// The same with `fdatasync` after some of the writes, so intent log
/// commits run beside the other writers (this once faulted the pool with a
/// double free of space).
#[test]
fn parallel_clients_with_fsyncs() {
    stress(true);
}

fn stress(fsync: bool) {
    if !require::fuse() {
        return;
    }
    let seed = env_seed("TARN_SEED").unwrap_or_else(random_seed);
    eprintln!("stress seed {seed:#x} (TARN_SEED replays it)");
    let FsPool { fs, pool, dir } = FsPool::new(1 << 30, pools::opts());
    let mp = tempfile::tempdir().unwrap();
    let mut m = mount(fs.clone(), mp.path());
    let root: PathBuf = m.mountpoint().to_path_buf();
    for d in (0..WORKERS)
        .map(|t| format!("w{t}"))
        .chain(["shared".into()])
    {
        fs::create_dir(root.join(d)).unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut background = Vec::new();
    {
        let (pool, stop, counts) = (pool.clone(), stop.clone(), counts.clone());
        background.push(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                pool.sync().expect("txg sync");
                counts[0].fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(15));
            }
        }));
    }
    {
        let (pool, stop, counts) = (pool.clone(), stop.clone(), counts.clone());
        background.push(thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let s = pools::scrub(&pool);
                assert_eq!(s.errors, 0, "scrub found errors: {s:?}");
                counts[1].fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    {
        let (pool, stop, counts) = (pool.clone(), stop.clone(), counts.clone());
        background.push(thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                tarn_dataset::snapshot(&pool, &[format!("tank/fs@s{n}")], false).expect("snapshot");
                if n >= 3 {
                    tarn_dataset::destroy(&pool, &format!("tank/fs@s{}", n - 3), false)
                        .expect("destroy an old snapshot");
                }
                n += 1;
                counts[2].fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(100));
            }
        }));
    }

    let mut rng = Rng::new(seed);
    let workers: Vec<_> = (0..WORKERS)
        .map(|t| {
            let (root, rng) = (root.clone(), rng.fork());
            thread::spawn(move || worker(&root, t, rng, fsync))
        })
        .collect();
    let mut expected = Model::new();
    for w in workers {
        expected.extend(w.join().expect("a worker failed"));
    }
    stop.store(true, Ordering::SeqCst);
    for b in background {
        b.join().expect("a background task failed");
    }
    let [syncs, scrubs, snaps] = counts.as_ref().each_ref().map(|c| c.load(Ordering::SeqCst));
    eprintln!("{syncs} syncs, {scrubs} scrubs, {snaps} snapshots during the run");
    assert!(syncs > 0 && snaps > 0, "the background tasks did not run");

    verify(&root, &expected, "through the mount");
    // The snapshots that remain are whole trees that read without error.
    for s in fs::read_dir(root.join(".snapshot")).unwrap() {
        let mut seen = Model::new();
        tree(&s.unwrap().path(), "", &mut seen);
    }
    let s = pools::scrub(&pool);
    assert_eq!(s.errors, 0, "final scrub: {s:?}");
    assert_eq!(pools::cksum_errors(&pool), 0);

    // What a crash right after a sync leaves: everything.
    m.unmount().expect("unmount");
    drop(fs);
    pool.sync().expect("sync");
    pool.abandon();
    drop(pool);
    let pool = pools::import(dir.path(), "tank");
    let fs = Arc::new(datasets::mount(&pool, "tank/fs"));
    let m = mount(fs, mp.path());
    verify(m.mountpoint(), &expected, "after re-import");
}

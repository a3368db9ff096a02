//! `tarn demo`: the README's first command. It makes (or reuses) a raidz1
//! pool of four sparse files in one folder, with a filesystem shared over
//! NFS and WebDAV and a volume served over NBD, prints what to try, and
//! runs the daemon in the foreground on a socket in that folder; Ctrl-C
//! exports the pool cleanly, and running it again brings the same data
//! back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tarn_api::access::{Access, NbdShare, NfsShare, Share, WebdavShare};
use tarn_api::pool::{CreateRequest, Health, ImportRequest, ImportResult, VdevKind, VdevSpec};
use tarn_api::{Backend, ErrorCode};

use crate::error::{DaemonError, IoContext, Result};
use crate::servers::ServerOptions;
use crate::transport::{serve, DaemonOptions, Prepared};

/// Name of the demo pool.
pub const DEMO_POOL: &str = "demo";
/// The demo's filesystem.
pub const DEMO_FS: &str = "demo/files";
/// The demo's user.
pub const DEMO_USER: &str = "demo";
/// The demo's share.
pub const DEMO_SHARE: &str = "files";
/// The demo's volume: a thin disk for a virtual machine.
pub const DEMO_VOL: &str = "demo/disk";
/// The share (NBD export name) of the demo's volume.
pub const DEMO_VOL_SHARE: &str = "disk";

/// What `tarn demo` was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoOptions {
    /// Folder for the member files, the socket and the state.
    pub dir: PathBuf,
    /// Size of each (sparse) member file, in MiB; at least 64 is used.
    pub size_mib: u64,
    /// NFS (and MOUNT) port on 127.0.0.1; 0 picks a free one.
    pub nfs_port: u16,
    /// WebDAV port on 127.0.0.1; 0 picks a free one.
    pub webdav_port: u16,
    /// NBD port on 127.0.0.1; 0 picks a free one.
    pub nbd_port: u16,
}

/// The demo user's password: made up at the first run and kept in the
/// demo folder (mode 0600), so every run prints the same one.
fn demo_password(dir: &Path) -> Result<String> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("demo-password");
    if let Ok(p) = std::fs::read_to_string(&path) {
        let p = p.trim().to_string();
        if !p.is_empty() {
            return Ok(p);
        }
    }
    let mut raw = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .io_context(|| "cannot read /dev/urandom")?;
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyz23456789";
    let p: String = raw
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .io_context(|| format!("cannot write {}", path.display()))?;
    writeln!(f, "{p}")?;
    Ok(p)
}

/// The longest path a Unix socket can be bound to (`sun_path` less its
/// terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// Runs the demo until the daemon stops.
pub fn run_demo(args: &DemoOptions) -> Result<()> {
    let dir = absolute(&args.dir)?;
    // The socket lives in the folder: a path the kernel cannot bind (a
    // Unix socket's path holds at most 107 bytes) is refused before
    // anything is made, with the option that helps.
    let socket = dir.join("tarn.sock");
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(DaemonError::msg(format!(
            "the demo folder's path is too long for its socket ({} holds {} bytes, at most \
             {MAX_SOCKET_PATH}); choose a shorter one with --dir, such as --dir /tmp/tarn-demo",
            socket.display(),
            socket.as_os_str().len()
        )));
    }
    std::fs::create_dir_all(&dir).io_context(|| format!("cannot create {}", dir.display()))?;
    let size = args.size_mib.max(64) << 20;
    let mut devices = Vec::new();
    for i in 0..4 {
        let p = dir.join(format!("disk{i}.img"));
        if !p.exists() {
            let f = std::fs::File::create(&p)
                .io_context(|| format!("cannot create {}", p.display()))?;
            f.set_len(size)?;
        }
        devices.push(p.to_string_lossy().into_owned());
    }
    let mut opts = DaemonOptions::new(socket.clone(), dir.join("state"));
    opts.handle_signals = true;
    let loopback = std::net::Ipv4Addr::LOCALHOST;
    opts.servers = ServerOptions {
        nfs: Some((loopback, args.nfs_port).into()),
        webdav: Some((loopback, args.webdav_port).into()),
        nbd: Some((loopback, args.nbd_port).into()),
        ..ServerOptions::default()
    };
    // The socket and the stop signals first, as `tarn daemon` takes them.
    let prepared = Prepared::take(&opts)?;
    let backend = match crate::start_node(&opts) {
        Ok(b) => b,
        Err(e) => {
            prepared.abandon();
            return Err(e.context(
                "cannot start the demo's daemon (ports taken? try --nfs-port 0 --webdav-port 0 \
                 --nbd-port 0)",
            ));
        }
    };
    // A demo that cannot set itself up stops its node as a stop would
    // (its filesystem unmounted, its pool exported) before it exits.
    if let Err(e) = set_up(args, &dir, &devices, &socket, &backend) {
        crate::stop_node(&backend);
        prepared.abandon();
        return Err(e);
    }
    serve(opts, backend, prepared)
}

/// Brings the demo's pool, filesystem, user, shares and volume into being
/// (or back), and prints where they are served.
fn set_up(
    args: &DemoOptions,
    dir: &Path,
    devices: &[String],
    socket: &Path,
    backend: &crate::Pools,
) -> Result<()> {
    // A pool the daemon could not bring back at start (the folder was
    // moved, so the paths it recorded lead nowhere) is listed UNAVAIL: it
    // is imported again from this folder below.
    let imported = backend
        .pool_list()?
        .iter()
        .any(|p| p.name == DEMO_POOL && p.health != Health::Unavail);
    let how = if imported {
        "reused"
    } else {
        // Exported by an earlier run (or its state folder was removed)?
        let req = ImportRequest {
            dirs: vec![dir.to_string_lossy().into_owned()],
            devices: Vec::new(),
            pool: Some(DEMO_POOL.into()),
            new_name: None,
            force: false,
            discard_log: false,
        };
        match backend.pool_import(&req) {
            Ok(ImportResult::Imported(_)) => "imported",
            // Any error but "no such pool" is the user's to see: creating
            // over it would need -f and could destroy the demo's data.
            Err(e) if e.code != ErrorCode::NotFound => {
                return Err(DaemonError::msg(format!(
                    "cannot import the demo pool from {}: {e}",
                    dir.display()
                )))
            }
            _ => {
                let mut properties = BTreeMap::new();
                properties.insert("compression".to_string(), "lz4".to_string());
                backend.pool_create(&CreateRequest {
                    name: DEMO_POOL.into(),
                    vdevs: vec![VdevSpec {
                        kind: VdevKind::Raidz1,
                        devices: devices.to_vec(),
                    }],
                    ashift: None,
                    properties,
                    force: false,
                })?;
                "created"
            }
        }
    };
    // A filesystem with lz4, mounted under the demo folder when this
    // machine can mount FUSE (root and /dev/fuse).
    let files = dir.join("files");
    // SAFETY: geteuid has no preconditions and cannot fail.
    let can_mount = unsafe { libc::geteuid() } == 0 && Path::new("/dev/fuse").exists();
    let fs_info = backend
        .dataset_list(false)?
        .into_iter()
        .find(|d| d.name == DEMO_FS);
    let has_fs = fs_info.is_some();
    // Mounted where the demo folder is now, also after it was moved.
    let here = files.display().to_string();
    if let Some(mp) = fs_info.and_then(|d| d.mountpoint) {
        if can_mount && mp != here && mp != "none" {
            std::fs::create_dir_all(&files)
                .io_context(|| format!("cannot create {}", files.display()))?;
            backend.dataset_set(DEMO_FS, "mountpoint", &here)?;
        }
    }
    if !has_fs {
        let mut props = BTreeMap::new();
        props.insert("compression".to_string(), "lz4".to_string());
        if can_mount {
            std::fs::create_dir_all(&files)
                .io_context(|| format!("cannot create {}", files.display()))?;
            props.insert("mountpoint".to_string(), files.display().to_string());
        }
        backend.dataset_create(&tarn_api::params::DatasetCreateParams {
            name: DEMO_FS.into(),
            properties: props,
            parents: false,
            key: None,
        })?;
    }
    // A demo user and a share of the filesystem over NFS and WebDAV.
    let password = demo_password(dir)?;
    let users = backend.user_list()?;
    let user = match users.iter().find(|u| u.name == DEMO_USER) {
        Some(u) => u.clone(),
        None => backend.user_add(Some(DEMO_POOL), DEMO_USER, &password, None, None, false)?,
    };
    let shares = backend.share_list()?;
    if !shares.iter().any(|s| s.share.name == DEMO_SHARE) {
        let share = Share {
            name: DEMO_SHARE.to_string(),
            dataset: DEMO_FS.to_string(),
            nfs: Some(NfsShare {
                clients: vec!["127.0.0.1/32".to_string()],
                read_only: false,
                root_squash: true,
                all_squash: true,
                anon_uid: user.uid,
                anon_gid: user.gid,
            }),
            webdav: Some(WebdavShare {
                users: [(DEMO_USER.to_string(), Access::Rw)].into_iter().collect(),
            }),
            nbd: None,
            iscsi: None,
            smb: None,
        };
        backend.share_add(&share, Some(DEMO_USER))?;
    }
    // A thin volume, one member file's size, served over NBD on loopback:
    // a disk to try a virtual machine's view on (qemu, nbd-client).
    let vol_mib = args.size_mib.max(64);
    if !backend
        .dataset_list(false)?
        .iter()
        .any(|d| d.name == DEMO_VOL)
    {
        backend.volume_create(&tarn_api::params::VolumeCreateParams {
            name: DEMO_VOL.into(),
            size: format!("{vol_mib}M"),
            block_size: None,
            sparse: true,
            properties: BTreeMap::new(),
            parents: false,
            key: None,
        })?;
    }
    if !shares.iter().any(|s| s.share.name == DEMO_VOL_SHARE) {
        let share = Share {
            name: DEMO_VOL_SHARE.to_string(),
            dataset: DEMO_VOL.to_string(),
            nfs: None,
            webdav: None,
            nbd: Some(NbdShare {
                clients: vec!["127.0.0.1/32".to_string()],
                read_only: false,
            }),
            iscsi: None,
            smb: None,
        };
        backend.share_add(&share, None)?;
    }
    let ep = backend.endpoints();
    let serve_hint = match (ep.webdav, ep.nfs) {
        (Some(w), Some(n)) => {
            let (wp, np) = (w.port(), n.port());
            format!(
                "\
WebDAV   http://127.0.0.1:{wp}/{DEMO_SHARE}/   user {DEMO_USER}, password {password}
  (a browser lists the folder; rclone/cadaver/Finder/Windows connect to it)
  curl -u {DEMO_USER}:{password} -T README.md http://127.0.0.1:{wp}/{DEMO_SHARE}/README.md
  curl -u {DEMO_USER}:{password} http://127.0.0.1:{wp}/{DEMO_SHARE}/README.md
NFS      127.0.0.1:/{DEMO_SHARE}, port {np} (NFS and MOUNT), every client acts as {DEMO_USER}
  nfs-ls 'nfs://127.0.0.1/{DEMO_SHARE}?nfsport={np}&mountport={np}&version=3'
  sudo mount -t nfs -o vers=3,proto=tcp,port={np},mountport={np},nolock 127.0.0.1:/{DEMO_SHARE} /mnt
  (macOS: sudo mount -t nfs -o vers=3,tcp,port={np},mountport={np},nolocks 127.0.0.1:/{DEMO_SHARE} /Volumes/tarn)

"
            )
        }
        _ => String::new(),
    };
    let nbd_hint = match ep.nbd {
        Some(a) => {
            let url = format!("nbd://127.0.0.1:{}/{DEMO_VOL_SHARE}", a.port());
            format!(
                "\
NBD      {url}   a {vol_mib} MiB thin volume ({DEMO_VOL}), a virtual machine's disk
  qemu-img info {url}
  qemu-io -f raw -c 'write -P 7 0 1M' -c 'read -P 7 0 1M' {url}
  sudo modprobe nbd && sudo nbd-client 127.0.0.1 {port} /dev/nbd0 -N {DEMO_VOL_SHARE}    # then mkfs, mount

",
                port = a.port(),
            )
        }
        None => String::new(),
    };
    let mounted = backend
        .dataset_mounts()?
        .iter()
        .any(|m| m.dataset == DEMO_FS);
    let files_hint = if mounted {
        let f = files.display();
        format!(
            "  ls {f}    # the filesystem {DEMO_FS}, mounted with FUSE\n  \
             cp -r /etc/apt {f}/ && tarn snapshot {DEMO_FS}@first\n  \
             rm -r {f}/apt && ls {f}/.snapshot/first/apt    # snapshots are browsable\n  \
             tarn dataset list -t all\n"
        )
    } else {
        format!(
            "  tarn dataset list -t all    # the filesystem {DEMO_FS}\n  \
             sudo tarn mount {DEMO_FS} /mnt    # mounting it needs root\n"
        )
    };
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "tarn".into());
    println!(
        "\
tarn demo: pool '{DEMO_POOL}' {how} — raidz1 over four sparse files in {dir}

{serve_hint}{nbd_hint}Try it from another terminal:

  alias tarn={exe}
  export TARN_SOCKET={socket}
  tarn pool status {DEMO_POOL}
{files_hint}  tarn object put {DEMO_POOL} readme README.md --sync
  tarn object get {DEMO_POOL} readme /tmp/readme.copy && cmp README.md /tmp/readme.copy
  tarn pool scrub --wait {DEMO_POOL}
  tarn pool offline {DEMO_POOL} {d1}     # one disk out: DEGRADED, data still there
  tarn pool online {DEMO_POOL} {d1}      # back: only what it missed is resilvered
  tarn pool iostat {DEMO_POOL} 1

Ctrl-C stops the servers, unmounts and exports the pool cleanly; run
`tarn demo` again and the data is still there. More in docs/getting-started.md.
",
        dir = dir.display(),
        socket = socket.display(),
        d1 = devices[1],
    );
    Ok(())
}

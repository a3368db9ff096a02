//! Serves in-memory devices over NBD until interrupted, for trying
//! clients by hand: `cargo run -p tarn-nbd --example mem_server -- 127.0.0.1:10809`
//! serves `disk` (64 MiB, writable) and `ro` (16 MiB, read-only).

use std::sync::Arc;

use tarn_nbd::{NbdConfig, NbdExport, NbdServer};
use tarn_vol::testing::MemDevice;

fn main() {
    let bind = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:10809".into());
    let mut disk = NbdExport::new("disk", Arc::new(MemDevice::new(64 << 20, 4096)));
    disk.description = Some("64 MiB in memory".into());
    let mut ro = NbdExport::new("ro", Arc::new(MemDevice::new(16 << 20, 4096)));
    ro.read_only = true;
    let cfg = NbdConfig {
        bind: bind.parse().expect("an address such as 127.0.0.1:10809"),
        default_export: Some("disk".into()),
        ..NbdConfig::default()
    };
    let r = NbdServer::start(cfg, vec![disk, ro]).expect("the server starts");
    eprintln!(
        "serving nbd://{}/disk and nbd://{}/ro",
        r.local_addr(),
        r.local_addr()
    );
    loop {
        std::thread::park();
    }
}

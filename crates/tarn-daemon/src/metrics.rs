//! `/metrics`: the daemon's counters in the Prometheus text format
//! (version 0.0.4), for Prometheus, VictoriaMetrics, Netdata or Grafana
//! Agent (`tarn daemon --metrics ADDR:PORT`, docs/metrics.md).
//!
//! # What is measured, and what it costs
//!
//! Nothing is gathered for the endpoint's sake between scrapes: it reads
//! what tarn keeps anyway (the pools' status and device counters, the
//! block cache's counters, the servers' connection counters) plus
//! latency histograms kept on the hot paths by `tarn-stats`: a few
//! relaxed atomic additions per device I/O, per txg sync and per NFS or
//! WebDAV request. A scrape builds the text from those snapshots with
//! `prometheus-client`'s encoder (a custom collector), so its cost is
//! one pool status per pool, paid by the scraper, not by I/O.
//!
//! # Who may scrape
//!
//! The counters name pools, devices and protocols, never files or users,
//! but they still describe the machine. The endpoint listens only where
//! it is told; off loopback it needs a bearer token (`--metrics-token-file`),
//! compared in constant time. It answers `GET /metrics` and nothing else,
//! one request per connection, each bounded in size and time (a slow
//! client holds the endpoint for at most [`IO_TIMEOUT`] to send its
//! request and as long to read the answer, not the daemon; its stop
//! waits for no more than that).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tarn_api::pool::{PoolStatus, VdevStatus};
use tarn_api::Backend;

use crate::pools::Pools;

/// Time a scraper has to send its request and read the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_HEAD: usize = 8 << 10;

type Labels = Vec<(&'static str, String)>;

/// Everything one scrape reports, gathered before encoding.
#[derive(Debug, Default)]
struct Gathered {
    gauges: Vec<(&'static str, &'static str, Labels, f64)>,
    counters: Vec<(&'static str, &'static str, Labels, u64)>,
    histograms: Vec<(&'static str, &'static str, Labels, tarn_stats::Snapshot)>,
}

impl Gathered {
    fn gauge(&mut self, name: &'static str, help: &'static str, l: Labels, v: f64) {
        self.gauges.push((name, help, l, v));
    }

    fn counter(&mut self, name: &'static str, help: &'static str, l: Labels, v: u64) {
        self.counters.push((name, help, l, v));
    }

    fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        l: Labels,
        s: tarn_stats::Snapshot,
    ) {
        self.histograms.push((name, help, l, s));
    }
}

/// The leaves of a vdev tree, with the top-level vdev each belongs to.
fn leaves<'a>(v: &'a VdevStatus, top: &'a str, out: &mut Vec<(&'a str, &'a VdevStatus)>) {
    if v.children.is_empty() {
        out.push((top, v));
    }
    for c in &v.children {
        leaves(c, top, out);
    }
}

fn pool_metrics(g: &mut Gathered, st: &PoolStatus, pools: &Pools) {
    let pool = || vec![("pool", st.name.clone())];
    g.gauge(
        "tarn_pool_health",
        "1 for the pool's current health (the state label), as pool status shows it",
        vec![
            ("pool", st.name.clone()),
            ("state", format!("{:?}", st.health).to_uppercase()),
        ],
        1.0,
    );
    g.gauge(
        "tarn_pool_txg",
        "The last committed transaction group",
        pool(),
        st.txg as f64,
    );
    if let Some(scan) = &st.scan {
        let l = || {
            vec![
                ("pool", st.name.clone()),
                ("kind", format!("{:?}", scan.kind).to_lowercase()),
                ("state", format!("{:?}", scan.state).to_lowercase()),
            ]
        };
        g.gauge(
            "tarn_pool_scan_examined_bytes",
            "Bytes the scrub or resilver has examined",
            l(),
            scan.examined_bytes as f64,
        );
        g.gauge(
            "tarn_pool_scan_total_bytes",
            "Bytes the scrub or resilver examines in all",
            l(),
            scan.total_bytes as f64,
        );
        g.gauge(
            "tarn_pool_scan_repaired_bytes",
            "Bytes the scrub or resilver repaired",
            l(),
            scan.repaired_bytes as f64,
        );
        g.gauge(
            "tarn_pool_scan_errors",
            "Blocks the scrub or resilver could not repair",
            l(),
            scan.errors as f64,
        );
    }
    let mut all = Vec::new();
    for v in st.vdevs.iter().chain(&st.logs) {
        leaves(v, &v.name, &mut all);
    }
    for (top, leaf) in all {
        let l = || {
            vec![
                ("pool", st.name.clone()),
                ("vdev", top.to_string()),
                ("device", leaf.name.clone()),
            ]
        };
        let c = &leaf.counters;
        g.counter("tarn_device_read_ops", "Successful reads", l(), c.read_ops);
        g.counter(
            "tarn_device_write_ops",
            "Successful writes",
            l(),
            c.write_ops,
        );
        g.counter("tarn_device_read_bytes", "Bytes read", l(), c.read_bytes);
        g.counter(
            "tarn_device_written_bytes",
            "Bytes written",
            l(),
            c.write_bytes,
        );
        for (kind, n) in [
            ("read", c.read_errors),
            ("write", c.write_errors),
            ("checksum", c.cksum_errors),
        ] {
            let mut l = l();
            l.push(("kind", kind.to_string()));
            g.counter(
                "tarn_device_errors",
                "Read, write and checksum errors (the columns of pool status)",
                l,
                n,
            );
        }
    }
    if let Ok(p) = pools.get(&st.name) {
        let (devices, syncs) = p.latencies();
        for (device, read, write) in devices {
            let l = || vec![("pool", st.name.clone()), ("device", device.clone())];
            g.histogram(
                "tarn_device_read_latency_seconds",
                "Time a successful read took at the device",
                l(),
                read,
            );
            g.histogram(
                "tarn_device_write_latency_seconds",
                "Time a successful write took at the device",
                l(),
                write,
            );
        }
        g.histogram(
            "tarn_pool_txg_sync_seconds",
            "Time a transaction group sync took, from quiesce to the uberblock",
            pool(),
            syncs,
        );
        g.gauge(
            "tarn_pool_dirty_bytes",
            "Data the open transaction group holds for its sync",
            pool(),
            p.dirty_bytes() as f64,
        );
    }
}

/// Reads everything a scrape reports.
fn gather(pools: &Pools) -> Gathered {
    let mut g = Gathered::default();
    g.gauge(
        "tarn_build_info",
        "1, with this tarn's version",
        vec![("version", env!("CARGO_PKG_VERSION").to_string())],
        1.0,
    );
    for e in pools.pool_list().unwrap_or_default() {
        let l = || vec![("pool", e.name.clone())];
        g.gauge("tarn_pool_size_bytes", "Usable size", l(), e.size as f64);
        g.gauge(
            "tarn_pool_allocated_bytes",
            "Allocated space",
            l(),
            e.allocated as f64,
        );
        g.gauge("tarn_pool_free_bytes", "Free space", l(), e.free as f64);
    }
    let statuses = pools.pool_status(None).unwrap_or_default();
    for st in &statuses {
        pool_metrics(&mut g, st, pools);
    }
    // One block cache serves every pool: its counters once.
    if let Some(c) = statuses.iter().find_map(|s| s.cache) {
        g.gauge(
            "tarn_cache_bytes",
            "Bytes of verified blocks the cache holds",
            vec![],
            c.bytes as f64,
        );
        g.gauge(
            "tarn_cache_max_bytes",
            "The cache's bound",
            vec![],
            c.max_bytes as f64,
        );
        for (kind, hits, misses) in [
            ("data", c.data_hits, c.data_misses),
            ("meta", c.meta_hits, c.meta_misses),
        ] {
            let l = || vec![("kind", kind.to_string())];
            g.counter("tarn_cache_hits", "Lookups the cache answered", l(), hits);
            g.counter(
                "tarn_cache_misses",
                "Lookups that read the disks",
                l(),
                misses,
            );
        }
        g.counter(
            "tarn_cache_evicted",
            "Blocks evicted to stay within the bound",
            vec![],
            c.evicted,
        );
        g.counter(
            "tarn_cache_prefetched",
            "Blocks read ahead of sequential readers",
            vec![],
            c.prefetched,
        );
    }
    let stats = pools.servers.stats();
    for (proto, conns) in [
        ("nfs", stats.nfs),
        ("webdav", stats.webdav),
        ("nbd", stats.nbd),
        ("iscsi", stats.iscsi),
    ] {
        let Some(c) = conns else {
            continue;
        };
        let l = || vec![("protocol", proto.to_string())];
        g.gauge(
            "tarn_connections_open",
            "Open connections",
            l(),
            c.open as f64,
        );
        g.counter(
            "tarn_connections_accepted",
            "Connections accepted",
            l(),
            c.accepted,
        );
        for (reason, n) in [
            ("per_address", c.refused_per_address),
            ("full", c.refused_full),
            ("unlisted", c.refused_unlisted),
        ] {
            let mut l = l();
            l.push(("reason", reason.to_string()));
            g.counter(
                "tarn_connections_refused",
                "Connections refused, by reason",
                l,
                n,
            );
        }
        g.counter(
            "tarn_connections_evicted",
            "Idle connections closed for newcomers",
            l(),
            c.evicted,
        );
        g.counter(
            "tarn_connections_idle_closed",
            "Connections closed after their idle timeout",
            l(),
            c.idle_closed,
        );
    }
    if let Some(w) = pools.web.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        g.gauge(
            "tarn_web_thumbnail_cache_bytes",
            "Memory held by the web page's cached thumbnails",
            vec![],
            w.thumbnail_cache_bytes() as f64,
        );
    }
    if let Some(smb) = stats.smb {
        g.gauge(
            "tarn_smb_up",
            "1 while the supervised smbd runs",
            vec![],
            if smb.pid.is_some() { 1.0 } else { 0.0 },
        );
        g.counter(
            "tarn_smb_restarts",
            "Times smbd ended on its own and was started again",
            vec![],
            smb.restarts,
        );
    }
    for (proto, op, snap, errors) in pools.servers.request_stats() {
        let l = || vec![("protocol", proto.to_string()), ("op", op.to_string())];
        if snap.count == 0 {
            continue;
        }
        g.histogram(
            "tarn_request_duration_seconds",
            "Time from a request's arrival to its answer (WebDAV: to the response head)",
            l(),
            snap,
        );
        g.counter(
            "tarn_request_errors",
            "Requests answered with an error (NFS: a status other than OK; WebDAV: 5xx)",
            l(),
            errors,
        );
    }
    g
}

/// The collector: one family per name, its series in gathering order.
#[derive(Debug)]
struct Scrape(Gathered);

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = &self.0;
        let mut names: Vec<(&str, &str, MetricType)> = Vec::new();
        let mut note = |n: &'static str, h: &'static str, t: MetricType| {
            if !names.iter().any(|(x, _, _)| *x == n) {
                names.push((n, h, t));
            }
        };
        for (n, h, _, _) in &g.gauges {
            note(n, h, MetricType::Gauge);
        }
        for (n, h, _, _) in &g.counters {
            note(n, h, MetricType::Counter);
        }
        for (n, h, _, _) in &g.histograms {
            note(n, h, MetricType::Histogram);
        }
        for (name, help, ty) in names {
            let mut family = enc.encode_descriptor(name, help, None, ty)?;
            match ty {
                MetricType::Gauge => {
                    for (_, _, l, v) in g.gauges.iter().filter(|x| x.0 == name) {
                        let m = prometheus_client::metrics::gauge::ConstGauge::new(*v);
                        m.encode(family.encode_family(l)?)?;
                    }
                }
                MetricType::Counter => {
                    for (_, _, l, v) in g.counters.iter().filter(|x| x.0 == name) {
                        let m = prometheus_client::metrics::counter::ConstCounter::new(*v);
                        m.encode(family.encode_family(l)?)?;
                    }
                }
                _ => {
                    for (_, _, l, s) in g.histograms.iter().filter(|x| x.0 == name) {
                        // The encoder takes per-bucket counts and sums them.
                        let mut prev = 0;
                        let buckets: Vec<(f64, u64)> = s
                            .buckets
                            .iter()
                            .map(|(b, c)| {
                                let n = c.saturating_sub(prev);
                                prev = *c;
                                (*b, n)
                            })
                            .collect();
                        family
                            .encode_family(l)?
                            .encode_histogram::<Labels>(s.sum_secs, s.count, &buckets, None)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The text of one scrape.
pub fn render(pools: &Pools) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(gather(pools))));
    let mut out = String::new();
    if prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// The running endpoint.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr`; `token`, when given, must come as `Authorization:
    /// Bearer TOKEN`. Off loopback a token is required.
    pub fn start(
        addr: SocketAddr,
        token: Option<String>,
        pools: Weak<Pools>,
    ) -> Result<MetricsServer, String> {
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(format!(
                "metrics on {addr} would be open to the network: give --metrics-token-file, \
                 or listen on 127.0.0.1"
            ));
        }
        let listener = TcpListener::bind(addr)
            .map_err(|e| format!("metrics: cannot listen on {addr}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("metrics: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tarn-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(s) = conn else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    let Some(p) = pools.upgrade() else {
                        return;
                    };
                    if let Err(e) = serve(s, token.as_deref(), &p) {
                        log::debug!("tarn: metrics request: {e}");
                    }
                }
            })
            .map_err(|e| format!("metrics: cannot start its thread: {e}"))?;
        log::info!("tarn: metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Equal in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The answer to one request head.
fn answer(head: &str, token: Option<&str>) -> Result<(), (&'static str, &'static str)> {
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    let mut parts = request.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return Err(("405 Method Not Allowed", "GET /metrics only\n"));
    }
    if target.split('?').next() != Some("/metrics") {
        return Err(("404 Not Found", "GET /metrics\n"));
    }
    if let Some(want) = token {
        let given = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
            .and_then(|(_, v)| v.trim().strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), want.as_bytes())) {
            return Err(("401 Unauthorized", "a bearer token is needed\n"));
        }
    }
    Ok(())
}

fn serve(mut s: TcpStream, token: Option<&str>, pools: &Pools) -> std::io::Result<()> {
    // One deadline for the whole request head, not one per read: a
    // client trickling a byte at a time is cut off at IO_TIMEOUT.
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            let _ = s.write_all(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\
                  Content-Length: 0\r\n\r\n",
            );
            return Ok(());
        }
    }
    let text = String::from_utf8_lossy(&head);
    let is_head = text.starts_with("HEAD ");
    let (status, ctype, body) = match answer(&text, token) {
        Ok(()) => (
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            render(pools),
        ),
        Err((status, msg)) => (status, "text/plain; charset=utf-8", msg.to_string()),
    };
    let auth = if status.starts_with("401") {
        "WWW-Authenticate: Bearer realm=\"tarn metrics\"\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{auth}\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    if !is_head {
        s.write_all(body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let get = |extra: &str| format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        assert!(answer(&get(""), None).is_ok());
        assert!(answer("GET /metrics?x=1 HTTP/1.1\r\n\r\n", None).is_ok());
        assert_eq!(
            answer("GET / HTTP/1.1\r\n\r\n", None).unwrap_err().0,
            "404 Not Found"
        );
        assert_eq!(
            answer("POST /metrics HTTP/1.1\r\n\r\n", None)
                .unwrap_err()
                .0,
            "405 Method Not Allowed"
        );
        let t = Some("s3cret");
        assert!(answer(&get("Authorization: Bearer s3cret\r\n"), t).is_ok());
        assert!(answer(&get("authorization:   Bearer s3cret \r\n"), t).is_ok());
        for bad in [
            "",
            "Authorization: Bearer s3cre\r\n",
            "Authorization: Basic s3cret\r\n",
        ] {
            assert_eq!(
                answer(&get(bad), t).unwrap_err().0,
                "401 Unauthorized",
                "{bad}"
            );
        }
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}

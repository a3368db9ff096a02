//! Times how long the web page takes to show something in a real browser
//! (headless chromium through its DevTools protocol), for
//! `scripts/bench-web.sh`. Not a test.
//!
//! ```text
//! web-render URL EXPR [--runs N] [--fresh-cache] [--login USER:PASSWORD] [--mbit N]
//!     Opens URL N times (default 5) and prints the milliseconds from the
//!     navigation until the JavaScript expression EXPR is true, each run
//!     and the median: `runs_ms=812,790,801 median_ms=801`. With
//!     --fresh-cache the browser's cache is emptied before each run; with
//!     --login the page's login form is filled in once first; with --mbit
//!     the browser's network is held to N Mbit/s each way with 4 ms of
//!     latency (a home Wi-Fi), for the page and the servers alike.
//! web-render --jpeg WIDTH HEIGHT OUT
//!     Writes a JPEG that compresses like a photo (smooth shapes and some
//!     grain), to fill a folder of photos.
//! ```

#[path = "../tests/common/browser.rs"]
#[allow(dead_code)]
mod browser;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn jpeg(w: u32, h: u32, out: &str) -> Result<(), String> {
    let mut seed: u32 = 0x9E37_79B9;
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let grain = (seed % 24) as i32 - 12;
        let fx = x as f32 / w as f32;
        let fy = y as f32 / h as f32;
        let wave = ((fx * 9.0).sin() * (fy * 7.0).cos() * 60.0) as i32;
        let c = |base: f32, k: i32| (base * 255.0) as i32 + wave * k + grain;
        let px = |v: i32| v.clamp(0, 255) as u8;
        image::Rgb([px(c(fx, 1)), px(c(fy, -1)), px(c(1.0 - fx * fy, 1))])
    });
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85)
        .encode_image(&img)
        .map_err(|e| e.to_string())?;
    std::fs::write(out, bytes).map_err(|e| format!("{out}: {e}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--jpeg") {
        let (Some(w), Some(h), Some(out)) = (
            args.get(1).and_then(|v| v.parse().ok()),
            args.get(2).and_then(|v| v.parse().ok()),
            args.get(3),
        ) else {
            eprintln!("usage: web-render --jpeg WIDTH HEIGHT OUT");
            std::process::exit(2);
        };
        if let Err(e) = jpeg(w, h, out) {
            eprintln!("web-render: {e}");
            std::process::exit(1);
        }
        return;
    }
    let (Some(url), Some(expr)) = (args.first(), args.get(1)) else {
        eprintln!("usage: web-render URL EXPR [--runs N] [--fresh-cache]");
        std::process::exit(2);
    };
    let mut runs = 5;
    let mut fresh = false;
    let mut login = None;
    let mut mbit: Option<f64> = None;
    let mut rest = args[2..].iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--runs" => runs = rest.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            "--fresh-cache" => fresh = true,
            "--login" => login = rest.next().and_then(|v| v.split_once(':')),
            "--mbit" => mbit = rest.next().and_then(|v| v.parse().ok()),
            other => {
                eprintln!("web-render: unknown option {other}");
                std::process::exit(2);
            }
        }
    }
    let b = browser::Browser::start();
    let mut page = b.page();
    page.call("Page.enable", json!({}));
    page.call("Network.enable", json!({}));
    if let Some(m) = mbit {
        let bytes_per_sec = m * 1e6 / 8.0;
        page.call(
            "Network.emulateNetworkConditions",
            json!({"offline": false, "latency": 4, "downloadThroughput": bytes_per_sec,
                "uploadThroughput": bytes_per_sec}),
        );
    }
    if let Some((user, password)) = login {
        page.call("Page.navigate", json!({ "url": url }));
        page.log_in(user, password);
    }
    let mut times = Vec::new();
    for _ in 0..runs {
        page.call("Page.navigate", json!({"url": "about:blank"}));
        std::thread::sleep(Duration::from_millis(200));
        if fresh {
            page.call("Network.clearBrowserCache", json!({}));
        }
        let t0 = Instant::now();
        page.call("Page.navigate", json!({ "url": url }));
        loop {
            let r = page.call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true}),
            );
            if r["result"]["value"] == Value::Bool(true) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(300) {
                eprintln!("web-render: {expr} not true after 300 s");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let list: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
    println!(
        "runs_ms={} median_ms={:.0}",
        list.join(","),
        sorted[sorted.len() / 2]
    );
}

//! Disk health: SMART and NVMe health data of the pools' devices, read
//! with smartmontools (`smartctl --json -a DEV`), judged against simple
//! thresholds, and turned into events when something new needs a human.
//!
//! The JSON smartctl writes differs by protocol (ATA attributes by id,
//! the NVMe health log, SCSI defect lists and error counters) and many
//! fields are missing on some drives, behind some controllers, or with
//! older smartctl versions; every field is read as optional, and what is
//! absent is simply not judged. A file-backed device says "no health
//! data" plainly instead of failing. The daemon looks at every device's
//! health every 30 minutes (`TARN_HEALTH_INTERVAL_SECS`) from the
//! scheduler thread and records a `disk.warning` event for each warning
//! that was not there at the previous look (a pending sector that stays
//! pending is reported once).
//!
//! Thresholds: any pending, reallocated (or grown-defect) or
//! uncorrectable sector and any NVMe media error is a warning; a drive
//! that says its SMART check FAILED, an NVMe critical-warning bit, or a
//! failed latest self-test is critical; so is 90 % or more of an NVMe's
//! rated endurance used; 60 °C (70 °C for NVMe) or more is a warning.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use tarn_api::health::DiskHealth;
use tarn_api::pool::VdevStatus;

fn u(v: &Value) -> Option<u64> {
    v.as_u64()
}

/// Reads smartctl's JSON into a health report for `device` of `pool`.
pub fn parse(device: &str, pool: &str, json: &Value) -> DiskHealth {
    let mut h = DiskHealth {
        device: device.to_string(),
        pool: pool.to_string(),
        ..DiskHealth::default()
    };
    h.protocol = json["device"]["protocol"].as_str().map(str::to_string);
    if h.protocol.is_none() {
        let why = json["smartctl"]["messages"]
            .as_array()
            .and_then(|m| m.first())
            .and_then(|m| m["string"].as_str())
            .unwrap_or("smartctl found no health data");
        h.note = Some(format!("no health data: {why}"));
        return h;
    }
    h.model = json["model_name"].as_str().map(str::to_string);
    h.serial = json["serial_number"].as_str().map(str::to_string);
    h.temperature_c = json["temperature"]["current"].as_i64();
    h.power_on_hours = u(&json["power_on_time"]["hours"]);
    h.smart_passed = json["smart_status"]["passed"].as_bool();
    // ATA attributes, by id.
    if let Some(table) = json["ata_smart_attributes"]["table"].as_array() {
        let raw = |id: u64| {
            table
                .iter()
                .find(|a| a["id"].as_u64() == Some(id))
                .and_then(|a| u(&a["raw"]["value"]))
        };
        h.reallocated = raw(5);
        h.pending = raw(197);
        h.uncorrectable = raw(198);
        h.power_on_hours = h.power_on_hours.or_else(|| raw(9));
        if h.temperature_c.is_none() {
            h.temperature_c = raw(194).map(|t| (t & 0xff) as i64);
        }
    }
    // The NVMe health log.
    let nvme = &json["nvme_smart_health_information_log"];
    if nvme.is_object() {
        h.media_errors = u(&nvme["media_errors"]);
        h.percentage_used = u(&nvme["percentage_used"]);
        h.temperature_c = h.temperature_c.or_else(|| nvme["temperature"].as_i64());
        h.power_on_hours = h.power_on_hours.or_else(|| u(&nvme["power_on_hours"]));
        if let Some(cw) = u(&nvme["critical_warning"]).filter(|c| *c != 0) {
            h.warnings.push(format!(
                "the drive raises critical warning bits {cw:#04x} (spare, temperature, \
                 reliability, read-only or backup)"
            ));
            h.critical = true;
        }
    }
    // SCSI: grown defects and uncorrected errors.
    if let Some(g) = u(&json["scsi_grown_defect_list"]) {
        h.reallocated = Some(g);
    }
    let log = &json["scsi_error_counter_log"];
    if log.is_object() {
        let r = u(&log["read"]["total_uncorrected_errors"]).unwrap_or(0);
        let w = u(&log["write"]["total_uncorrected_errors"]).unwrap_or(0);
        h.uncorrectable = Some(r + w);
    }
    // The latest self-test.
    if let Some(t) = json["ata_smart_self_test_log"]["standard"]["table"]
        .as_array()
        .and_then(|t| t.first())
    {
        h.last_self_test = Some(format!(
            "{}: {}",
            t["type"]["string"].as_str().unwrap_or("self-test"),
            t["status"]["string"].as_str().unwrap_or("?")
        ));
        h.last_self_test_passed = t["status"]["passed"].as_bool();
    } else if let Some(t) = json["nvme_self_test_log"]["table"]
        .as_array()
        .and_then(|t| t.first())
    {
        let result = u(&t["self_test_result"]["value"]);
        h.last_self_test = Some(format!(
            "{}: {}",
            t["self_test_code"]["string"]
                .as_str()
                .unwrap_or("self-test"),
            t["self_test_result"]["string"].as_str().unwrap_or("?")
        ));
        h.last_self_test_passed = result.map(|r| r == 0);
    }
    judge(&mut h);
    h
}

/// One thing the thresholds say about a drive: what kind of warning it
/// is, the count that makes it news again when it grows (bad sectors and
/// errors; none for a warning that is news once, such as a temperature,
/// whose degrees move from one look to the next), whether it is critical,
/// and its sentence.
struct Signal {
    kind: &'static str,
    count: Option<u64>,
    critical: bool,
    text: String,
}

/// What the thresholds say about `h`.
fn signals(h: &DiskHealth) -> Vec<Signal> {
    let mut out = Vec::new();
    let mut warn = |kind, count, critical, text: String| {
        out.push(Signal {
            kind,
            count,
            critical,
            text,
        })
    };
    if h.smart_passed == Some(false) {
        warn(
            "smart",
            None,
            true,
            "the drive's own SMART check says FAILED: replace it".into(),
        );
    }
    if let Some(n) = h.pending.filter(|n| *n > 0) {
        warn(
            "pending",
            Some(n),
            false,
            format!("{n} sectors are pending reallocation (unreadable)"),
        );
    }
    if let Some(n) = h.reallocated.filter(|n| *n > 0) {
        warn(
            "reallocated",
            Some(n),
            false,
            format!("{n} sectors were reallocated"),
        );
    }
    if let Some(n) = h.uncorrectable.filter(|n| *n > 0) {
        warn(
            "uncorrectable",
            Some(n),
            false,
            format!("{n} uncorrectable errors"),
        );
    }
    if let Some(n) = h.media_errors.filter(|n| *n > 0) {
        warn("media", Some(n), false, format!("{n} media errors"));
    }
    if let Some(p) = h.percentage_used.filter(|p| *p >= 90) {
        warn(
            "endurance",
            None,
            true,
            format!("{p} % of the rated endurance is used"),
        );
    }
    let hot = if h.protocol.as_deref() == Some("NVMe") {
        70
    } else {
        60
    };
    if let Some(t) = h.temperature_c.filter(|t| *t >= hot) {
        warn("hot", None, false, format!("it runs at {t} °C"));
    }
    if h.last_self_test_passed == Some(false) {
        warn(
            "self-test",
            None,
            true,
            format!(
                "the latest self-test failed ({})",
                h.last_self_test.as_deref().unwrap_or("?")
            ),
        );
    }
    out
}

/// Adds the warnings the thresholds give.
fn judge(h: &mut DiskHealth) {
    for s in signals(h) {
        h.warnings.push(s.text);
        h.critical |= s.critical;
    }
}

/// Whether `path` is a block device (a disk, not a file).
pub(crate) fn is_block_device(path: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// How long one `smartctl` may take: the disk whose health matters most
/// (a failing one) is the one most likely to hang it, and the schedules
/// and alerts wait for it meanwhile.
const SMARTCTL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `cmd` and returns what it printed on stdout, or None (and the
/// program killed) when it did not end within `limit`.
fn run_bounded(cmd: &mut Command, limit: std::time::Duration) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.take(64 << 20).read_to_end(&mut buf);
        }
        buf
    });
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            return Ok(Some(reader.join().unwrap_or_default()));
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // The pipe closes with the program: the reader ends.
            let _ = reader.join();
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Reads the health of `device` (of `pool`) now.
pub fn read(device: &str, pool: &str) -> DiskHealth {
    let none = |note: String| DiskHealth {
        device: device.to_string(),
        pool: pool.to_string(),
        note: Some(note),
        ..DiskHealth::default()
    };
    if !is_block_device(device) {
        return none("no health data: a file, not a disk".into());
    }
    let stdout = match run_bounded(
        Command::new("smartctl").args(["--json", "-a", device]),
        SMARTCTL_TIMEOUT,
    ) {
        Ok(Some(o)) => o,
        Ok(None) => {
            return none(format!(
                "no health data: smartctl did not answer within {} s (a failing disk, or its \
                 bridge, can hang it); it was stopped",
                SMARTCTL_TIMEOUT.as_secs()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return none(
                "no health data: smartctl is not installed (apt-get install smartmontools)".into(),
            )
        }
        Err(e) => return none(format!("no health data: cannot run smartctl: {e}")),
    };
    // smartctl's exit status is a bit mask that is often non-zero for a
    // readable report (e.g. old errors in a log): the JSON decides.
    match serde_json::from_slice::<Value>(&stdout) {
        Ok(v) => parse(device, pool, &v),
        Err(e) => none(format!(
            "no health data: smartctl's answer cannot be read: {e}"
        )),
    }
}

/// Every leaf device of a pool's vdev tree.
pub fn leaves(vdevs: &[VdevStatus]) -> Vec<String> {
    fn walk(v: &VdevStatus, out: &mut Vec<String>) {
        if v.children.is_empty() {
            out.push(v.name.clone());
        }
        for c in &v.children {
            walk(c, out);
        }
    }
    let mut out = Vec::new();
    for v in vdevs {
        walk(v, &mut out);
    }
    out
}

/// Starts a self-test (`short` or `long`) on a disk.
pub fn self_test(device: &str, kind: &str) -> Result<String, String> {
    if kind != "short" && kind != "long" {
        return Err(format!("'{kind}': a self-test is short or long"));
    }
    if !is_block_device(device) {
        return Err(format!(
            "{device} is a file, not a disk: it has no self-test"
        ));
    }
    let out = Command::new("smartctl")
        .args(["-t", kind, device])
        .output()
        .map_err(|e| format!("cannot run smartctl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code().is_some_and(|c| c & 0b11 != 0) {
        return Err(format!(
            "smartctl could not start the test: {}",
            text.lines().last().unwrap_or("").trim()
        ));
    }
    Ok(format!(
        "a {kind} self-test runs on {device}; its result shows in `tarn disk health {device}`"
    ))
}

/// The kinds of warning each device had at the last look, with their
/// counts (see [`Signal`]).
type Seen = BTreeMap<String, BTreeMap<String, Option<u64>>>;

/// What the last health look saw: warnings per device, and when it was.
pub struct Watch {
    last: Mutex<(Option<Instant>, Seen)>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            last: Mutex::new((None, BTreeMap::new())),
        }
    }
}

impl Watch {
    /// If a look is due, reads every device's health and returns the
    /// warnings that are new since the previous look, with the report.
    pub fn look(&self, devices: &[(String, String)]) -> Vec<(DiskHealth, Vec<String>)> {
        let every = Duration::from_secs(
            std::env::var("TARN_HEALTH_INTERVAL_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1800),
        );
        {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.0.is_some_and(|t| t.elapsed() < every) {
                return Vec::new();
            }
        }
        let reports: Vec<DiskHealth> = devices
            .iter()
            .filter(|(d, _)| Path::new(d).is_absolute())
            .map(|(d, p)| read(d, p))
            .collect();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.0 = Some(Instant::now());
        news(&mut last.1, reports)
    }
}

/// The warnings of `reports` that are news since `seen` (the previous
/// look's): a kind of warning the device did not have, or a count that
/// grew (more bad sectors). The same warning again is not, even in other
/// words (a drive at 61 °C, then 62 °C); one that went away and came back
/// is. `seen` becomes this look's.
pub fn news(seen: &mut Seen, reports: Vec<DiskHealth>) -> Vec<(DiskHealth, Vec<String>)> {
    let mut out = Vec::new();
    let mut now = BTreeMap::new();
    for h in reports {
        let before = seen.get(&h.device).cloned().unwrap_or_default();
        let mut mine = BTreeMap::new();
        let mut new = Vec::new();
        let signals = signals(&h);
        // Warnings read straight from the drive's report (NVMe's critical
        // warning bits) rather than judged here: each sentence its own
        // kind, news once.
        let read: Vec<(String, Option<u64>, String)> = h
            .warnings
            .iter()
            .filter(|w| !signals.iter().any(|s| &s.text == *w))
            .map(|w| (format!("said: {w}"), None, w.clone()))
            .collect();
        let judged = signals
            .into_iter()
            .map(|s| (s.kind.to_string(), s.count, s.text));
        for (kind, count, text) in judged.chain(read) {
            if before.get(&kind).is_none_or(|was| count > *was) {
                new.push(text);
            }
            mine.insert(kind, count);
        }
        now.insert(h.device.clone(), mine);
        if !new.is_empty() {
            out.push((h, new));
        }
    }
    *seen = now;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hanging_program_is_stopped_at_its_limit() {
        let t0 = std::time::Instant::now();
        let got = run_bounded(
            Command::new("sleep").arg("30"),
            std::time::Duration::from_millis(200),
        )
        .unwrap();
        assert_eq!(got, None);
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        let got = run_bounded(
            Command::new("echo").arg("answer"),
            std::time::Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(got.as_deref(), Some(&b"answer\n"[..]));
    }

    fn doc(name: &str) -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/smart")
            .join(name);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn ata_attributes_and_a_failed_self_test() {
        let h = parse("/dev/sda", "tank", &doc("ata.json"));
        assert_eq!(h.protocol.as_deref(), Some("ATA"));
        assert_eq!(h.model.as_deref(), Some("WDC WD40EFRX-68N32N0"));
        assert_eq!(h.serial.as_deref(), Some("WD-WCC7K0000001"));
        assert_eq!(h.temperature_c, Some(35));
        assert_eq!(h.power_on_hours, Some(23456));
        assert_eq!(
            (h.reallocated, h.pending, h.uncorrectable),
            (Some(8), Some(2), Some(0))
        );
        assert_eq!(h.last_self_test_passed, Some(false));
        assert!(h
            .last_self_test
            .as_deref()
            .unwrap()
            .contains("read failure"));
        assert!(h.critical, "a failed self-test is critical");
        assert_eq!(h.warnings.len(), 3, "{:?}", h.warnings);
        assert!(h
            .warnings
            .iter()
            .any(|w| w.contains("2 sectors are pending")));
    }

    #[test]
    fn nvme_wear_and_heat() {
        let h = parse("/dev/nvme0", "tank", &doc("nvme.json"));
        assert_eq!(h.protocol.as_deref(), Some("NVMe"));
        assert_eq!((h.percentage_used, h.media_errors), (Some(93), Some(0)));
        assert_eq!(h.temperature_c, Some(78));
        assert_eq!(h.power_on_hours, Some(9876));
        assert_eq!(h.last_self_test_passed, Some(true));
        assert!(h.critical, "93 % of endurance used");
        assert_eq!(h.warnings.len(), 2, "{:?}", h.warnings);
    }

    #[test]
    fn scsi_defects_errors_and_a_failed_verdict() {
        let h = parse("/dev/sdb", "tank", &doc("scsi.json"));
        assert_eq!(h.protocol.as_deref(), Some("SCSI"));
        assert_eq!((h.reallocated, h.uncorrectable), (Some(3), Some(1)));
        assert_eq!(h.power_on_hours, Some(40000));
        assert_eq!(h.smart_passed, Some(false));
        assert!(h.critical);
        assert_eq!(h.warnings.len(), 3, "{:?}", h.warnings);
        assert_eq!(h.last_self_test, None);
    }

    #[test]
    fn missing_fields_are_not_judged() {
        let h = parse("/dev/vda", "tank", &doc("minimal.json"));
        assert!(h.note.as_deref().unwrap().contains("Unable to detect"));
        assert!(h.warnings.is_empty());
        // A drive that reports nothing but its name.
        let v: Value = serde_json::json!({"device": {"protocol": "ATA"}, "model_name": "X"});
        let h = parse("/dev/sdz", "tank", &v);
        assert_eq!(h.model.as_deref(), Some("X"));
        assert!(h.warnings.is_empty() && !h.critical && h.note.is_none());
        // Wrong types are ignored, not fatal.
        let v: Value = serde_json::json!({"device": {"protocol": "ATA"}, "temperature": {"current": "hot"},
            "ata_smart_attributes": {"table": [{"id": 197, "raw": {"value": "x"}}]}});
        let h = parse("/dev/sdz", "tank", &v);
        assert_eq!((h.temperature_c, h.pending), (None, None));
    }

    #[test]
    fn files_have_no_health_data() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("disk0");
        std::fs::write(&f, b"x").unwrap();
        let h = read(f.to_str().unwrap(), "tank");
        assert_eq!(
            h.note.as_deref(),
            Some("no health data: a file, not a disk")
        );
        assert!(self_test(f.to_str().unwrap(), "short").is_err());
        assert!(self_test("/dev/null", "medium").is_err());
    }

    /// The warnings of `h` judged again after a test changed its readings.
    fn rejudge(h: &mut DiskHealth) {
        h.warnings.clear();
        h.critical = false;
        judge(h);
    }

    #[test]
    fn a_warning_is_new_once() {
        let mut seen = BTreeMap::new();
        let ata = parse("/dev/sda", "tank", &doc("ata.json"));
        let first = news(&mut seen, vec![ata.clone()]);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1.len(), 3, "every warning is new at first");
        assert!(
            news(&mut seen, vec![ata.clone()]).is_empty(),
            "the same again: nothing"
        );
        let mut hot = ata.clone();
        hot.temperature_c = Some(61);
        rejudge(&mut hot);
        let again = news(&mut seen, vec![hot.clone()]);
        assert_eq!(again[0].1, ["it runs at 61 °C"]);
        // Still hot, a degree more: the same warning, not news.
        hot.temperature_c = Some(62);
        rejudge(&mut hot);
        assert!(news(&mut seen, vec![hot.clone()]).is_empty());
        // More bad sectors are news; fewer (a sector remapped) are not.
        let pending = hot.pending.expect("the document has pending sectors");
        hot.pending = Some(pending + 8);
        rejudge(&mut hot);
        let grew = news(&mut seen, vec![hot.clone()]);
        assert_eq!(
            grew[0].1,
            [format!(
                "{} sectors are pending reallocation (unreadable)",
                pending + 8
            )]
        );
        hot.pending = Some(pending + 4);
        rejudge(&mut hot);
        assert!(news(&mut seen, vec![hot.clone()]).is_empty());
        // Cooled down and hot again: news again.
        hot.temperature_c = Some(40);
        rejudge(&mut hot);
        assert!(news(&mut seen, vec![hot.clone()]).is_empty());
        hot.temperature_c = Some(61);
        rejudge(&mut hot);
        assert_eq!(news(&mut seen, vec![hot])[0].1, ["it runs at 61 °C"]);
        // Gone and back: new again.
        assert!(news(&mut seen, vec![]).is_empty());
        assert_eq!(news(&mut seen, vec![ata])[0].1.len(), 3);
        // What the drive says of itself (NVMe's critical warning bits)
        // is news too, once.
        let mut doc = doc("nvme.json");
        doc["nvme_smart_health_information_log"]["critical_warning"] = 4.into();
        let nvme = parse("/dev/nvme0", "tank", &doc);
        let first = news(&mut seen, vec![nvme.clone()]);
        assert!(
            first[0]
                .1
                .iter()
                .any(|w| w.contains("critical warning bits")),
            "{first:?}"
        );
        assert!(news(&mut seen, vec![nvme]).is_empty());
    }
}

//! `tarn disk ...`: the health of the pools' disks (SMART, NVMe), through
//! the daemon, which reads it with smartmontools.

use anyhow::bail;
use clap::Subcommand;
use tarn_api::health::DiskHealth;
use tarn_api::method;
use tarn_api::params::{DiskParams, NoParams};

use crate::render::table;
use crate::session::{decode, Out, Session};

/// `tarn disk ...`.
#[derive(Subcommand, Debug)]
pub enum DiskCommand {
    /// Every device of the imported pools with its health at a glance
    List,
    /// Everything known about one device's health
    Health {
        /// The device, as its pool names it (e.g. /dev/sdb)
        device: String,
    },
    /// Start a self-test on a disk (its result shows in `tarn disk health`)
    Selftest {
        /// The device
        device: String,
        /// `short` (minutes) or `long` (hours)
        #[arg(default_value = "short")]
        test: String,
    },
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

fn verdict(h: &DiskHealth) -> String {
    if h.note.is_some() {
        "no data".into()
    } else if h.critical {
        "CRITICAL".into()
    } else if !h.warnings.is_empty() {
        "WARNING".into()
    } else {
        "ok".into()
    }
}

fn render_list(list: &[DiskHealth]) -> String {
    if list.is_empty() {
        return "no pools are imported\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|h| {
            vec![
                h.device.clone(),
                h.pool.clone(),
                opt(&h.protocol),
                opt(&h.model),
                h.temperature_c
                    .map(|t| format!("{t}°C"))
                    .unwrap_or_else(|| "-".into()),
                opt(&h.power_on_hours),
                verdict(h),
            ]
        })
        .collect();
    let mut out = table(
        &["DEVICE", "POOL", "KIND", "MODEL", "TEMP", "HOURS", "HEALTH"],
        &rows,
        &[0, 1, 2, 3, 6],
    );
    for h in list {
        for w in &h.warnings {
            out.push_str(&format!("{}: {w}\n", h.device));
        }
    }
    out
}

fn render_one(h: &DiskHealth) -> String {
    let mut out = format!("{} (pool {}): {}\n", h.device, h.pool, verdict(h));
    if let Some(n) = &h.note {
        out.push_str(&format!("  {n}\n"));
        return out;
    }
    let mut line = |k: &str, v: String| {
        if v != "-" {
            out.push_str(&format!("  {k:<22} {v}\n"));
        }
    };
    line("protocol", opt(&h.protocol));
    line("model", opt(&h.model));
    line("serial", opt(&h.serial));
    line("temperature (°C)", opt(&h.temperature_c));
    line("power-on hours", opt(&h.power_on_hours));
    line(
        "SMART verdict",
        h.smart_passed
            .map(|p| if p { "PASSED" } else { "FAILED" }.to_string())
            .unwrap_or_else(|| "-".into()),
    );
    line("reallocated / defects", opt(&h.reallocated));
    line("pending sectors", opt(&h.pending));
    line("uncorrectable", opt(&h.uncorrectable));
    line("media errors", opt(&h.media_errors));
    line("endurance used (%)", opt(&h.percentage_used));
    line("latest self-test", opt(&h.last_self_test));
    for w in &h.warnings {
        out.push_str(&format!("  ! {w}\n"));
    }
    out
}

pub(crate) fn disk_command(
    client: &mut Session,
    out: &Out,
    cmd: DiskCommand,
) -> anyhow::Result<()> {
    match cmd {
        DiskCommand::List => {
            let v = client.call(method::DISK_LIST, &NoParams {})?;
            let list: Vec<DiskHealth> = decode(method::DISK_LIST, v.clone())?;
            out.raw_or(&v, || render_list(&list))?;
        }
        DiskCommand::Health { device } => {
            let v = client.call(method::DISK_HEALTH, &DiskParams { device, test: None })?;
            let h: DiskHealth = decode(method::DISK_HEALTH, v.clone())?;
            out.raw_or(&v, || render_one(&h))?;
        }
        DiskCommand::Selftest { device, test } => {
            if test != "short" && test != "long" {
                bail!("'{test}': a self-test is short or long");
            }
            let v = client.call(
                method::DISK_SELFTEST,
                &DiskParams {
                    device,
                    test: Some(test),
                },
            )?;
            let msg: String = decode(method::DISK_SELFTEST, v.clone())?;
            out.raw_or(&v, || format!("{msg}\n"))?;
        }
    }
    Ok(())
}

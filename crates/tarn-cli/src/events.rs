//! `tarn events` (what the daemon saw happen) and `tarn alert ...` (where
//! it sends events: webhooks, email, programs).

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use tarn_api::events::{
    Alert, AlertInfo, AlertTarget, AlertTestResult, Event, Severity, SmtpSecurity,
};
use tarn_api::method;
use tarn_api::params::{AlertAddParams, AlertParams, AlertTestParams, EventsParams, NoParams};

use crate::render::table;
use crate::session::{decode, Out, Session};

/// `tarn events`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Keep following: print new events as they happen (Ctrl-C stops)
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// How many of the latest to show
    #[arg(short = 'n', long, default_value_t = 50)]
    pub count: usize,
}

/// `tarn alert ...`.
#[derive(Subcommand, Debug)]
pub enum AlertCommand {
    /// Add (or replace) an alert: `tarn alert add ops webhook
    /// https://hooks.example.org/tarn`, `tarn alert add me email --smtp
    /// smtp.example.org:587 --from nas@example.org --to me@example.org
    /// --user nas --password-stdin`, `tarn alert add log program
    /// /usr/local/bin/tarn-event`
    Add {
        /// Alert name
        name: String,
        /// `webhook`, `email` or `program`
        kind: String,
        /// webhook: the URL; program: its absolute path
        target: Option<String>,
        /// email: the SMTP server, HOST:PORT
        #[arg(long, value_name = "HOST:PORT")]
        smtp: Option<String>,
        /// email: the sender
        #[arg(long)]
        from: Option<String>,
        /// email: a recipient (repeatable)
        #[arg(long)]
        to: Vec<String>,
        /// email: login name
        #[arg(long)]
        user: Option<String>,
        /// email: read the login's password from the first line of stdin
        #[arg(long, requires = "user")]
        password_stdin: bool,
        /// email: starttls (default), tls (from the first byte, port 465)
        /// or none (a relay on a trusted network only)
        #[arg(long, default_value = "starttls")]
        security: String,
        /// Send events from this severity up: info, warning (default) or
        /// critical
        #[arg(long, default_value = "warning")]
        min_severity: String,
    },
    /// Remove an alert
    Del {
        /// Alert name
        name: String,
    },
    /// List alerts with what they sent and held back
    List,
    /// Send a test event through an alert (or all) now
    Test {
        /// Alert name [default: every alert]
        name: Option<String>,
    },
}

fn severity(s: &str) -> anyhow::Result<Severity> {
    Ok(match s {
        "info" => Severity::Info,
        "warning" => Severity::Warning,
        "critical" => Severity::Critical,
        other => bail!("'{other}': severities are info, warning and critical"),
    })
}

fn sev_word(s: Severity) -> &'static str {
    match s {
        Severity::Info => "info",
        Severity::Warning => "WARNING",
        Severity::Critical => "CRITICAL",
    }
}

fn event_line(e: &Event) -> String {
    let about = [e.pool.as_deref(), e.device.as_deref()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "{}  {:<8} {:<16} {}{}\n",
        tarn_api::time::utc_minutes(e.time_unix),
        sev_word(e.severity),
        e.kind,
        if about.is_empty() {
            String::new()
        } else {
            format!("[{about}] ")
        },
        e.message
    )
}

pub(crate) fn events_command(
    client: &mut Session,
    out: &Out,
    args: EventsArgs,
) -> anyhow::Result<()> {
    let v = client.call(
        method::EVENTS_LIST,
        &EventsParams {
            after: None,
            limit: Some(args.count),
        },
    )?;
    let list: Vec<Event> = decode(method::EVENTS_LIST, v.clone())?;
    if !args.follow {
        return out.raw_or(&v, || {
            if list.is_empty() {
                "no events\n".to_string()
            } else {
                list.iter().map(event_line).collect()
            }
        });
    }
    let mut last = list.last().map(|e| e.id);
    let json = !out.is_human();
    let print = |e: &Event| -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(e)?);
        } else {
            print!("{}", event_line(e));
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        Ok(())
    };
    for e in &list {
        print(e)?;
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let v = client.call(
            method::EVENTS_LIST,
            &EventsParams {
                after: last,
                limit: Some(1000),
            },
        )?;
        let list: Vec<Event> = decode(method::EVENTS_LIST, v)?;
        for e in &list {
            print(e)?;
            last = Some(e.id);
        }
    }
}

fn render_alerts(list: &[AlertInfo]) -> String {
    if list.is_empty() {
        return "no alerts; add one with `tarn alert add NAME webhook URL` (or email, program)\n"
            .into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let target = match &i.alert.target {
                AlertTarget::Webhook { url } => format!("webhook {url}"),
                AlertTarget::Email { smtp, to, .. } => format!("email {} via {smtp}", to.join(",")),
                AlertTarget::Program { path } => format!("program {path}"),
            };
            vec![
                i.alert.name.clone(),
                target,
                format!("{}+", sev_word(i.alert.min_severity).to_lowercase()),
                i.sent.to_string(),
                i.suppressed.to_string(),
                i.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "SENDS TO",
            "EVENTS",
            "SENT",
            "HELD BACK",
            "LAST ERROR",
        ],
        &rows,
        &[0, 1, 2, 5],
    )
}

pub(crate) fn alert_command(
    client: &mut Session,
    out: &Out,
    cmd: AlertCommand,
) -> anyhow::Result<()> {
    match cmd {
        AlertCommand::Add {
            name,
            kind,
            target,
            smtp,
            from,
            to,
            user,
            password_stdin,
            security,
            min_severity,
        } => {
            let target = match kind.as_str() {
                "webhook" => AlertTarget::Webhook {
                    url: target.context("a webhook alert needs its URL")?,
                },
                "program" => AlertTarget::Program {
                    path: target.context("a program alert needs the program's path")?,
                },
                "email" => {
                    if target.is_some() {
                        bail!("an email alert takes --smtp, --from and --to, not a target");
                    }
                    let password = if password_stdin {
                        let mut line = String::new();
                        std::io::stdin().read_line(&mut line)?;
                        Some(line.trim_end_matches(['\n', '\r']).to_string())
                    } else {
                        None
                    };
                    AlertTarget::Email {
                        smtp: smtp.context("an email alert needs --smtp HOST:PORT")?,
                        from: from.context("an email alert needs --from ADDRESS")?,
                        to,
                        user,
                        password,
                        security: match security.as_str() {
                            "starttls" => SmtpSecurity::Starttls,
                            "tls" => SmtpSecurity::Tls,
                            "none" => SmtpSecurity::None,
                            other => bail!("--security {other}: starttls, tls or none"),
                        },
                    }
                }
                other => bail!("'{other}': an alert is a webhook, an email or a program"),
            };
            let alert = Alert {
                name,
                target,
                min_severity: severity(&min_severity)?,
            };
            tarn_api::events::check_alert(&alert).map_err(anyhow::Error::msg)?;
            client.call_quietly(out, method::ALERT_ADD, &AlertAddParams { alert })?;
        }
        AlertCommand::Del { name } => {
            client.call_quietly(out, method::ALERT_DEL, &AlertParams { name })?;
        }
        AlertCommand::List => {
            let v = client.call(method::ALERT_LIST, &NoParams {})?;
            let list: Vec<AlertInfo> = decode(method::ALERT_LIST, v.clone())?;
            out.raw_or(&v, || render_alerts(&list))?;
        }
        AlertCommand::Test { name } => {
            let v = client.call(method::ALERT_TEST, &AlertTestParams { name })?;
            let results: Vec<AlertTestResult> = decode(method::ALERT_TEST, v.clone())?;
            out.raw_or(&v, || {
                results
                    .iter()
                    .map(|r| match &r.error {
                        None => format!("{}: delivered\n", r.name),
                        Some(e) => format!("{}: FAILED: {e}\n", r.name),
                    })
                    .collect()
            })?;
            if let Some(bad) = results.iter().find(|r| r.error.is_some()) {
                bail!("alert '{}' could not deliver", bad.name);
            }
        }
    }
    Ok(())
}

//! Events and alerts as the API shows them: what happened to the pools and
//! the daemon that an owner should hear of (a device faulted, a scrub
//! finished, a pool filling up, a schedule that failed), and where the
//! daemon sends them (a webhook, an email, a program).

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// How much an event needs a human.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// For the record (a scrub that found nothing, a test).
    Info,
    /// Look soon (errors repaired, a pool 80 % full, a failed schedule).
    Warning,
    /// Act now (a device or pool faulted, data damaged, 90 % full).
    Critical,
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Increasing number, unique in the daemon's log.
    pub id: u64,
    /// When (Unix seconds).
    pub time_unix: u64,
    /// How urgent.
    pub severity: Severity,
    /// What kind, dotted: `device.faulted`, `pool.degraded`,
    /// `device.errors`, `scan.finished`, `pool.capacity`,
    /// `schedule.failed`, `daemon.crashed`, `alert.test`, …
    pub kind: String,
    /// The pool it is about, if any.
    #[serde(default)]
    pub pool: Option<String>,
    /// The device it is about, if any.
    #[serde(default)]
    pub device: Option<String>,
    /// A sentence for the owner.
    pub message: String,
}

/// How an email alert talks to its SMTP server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Plain connection upgraded with STARTTLS (port 587); refused if the
    /// server does not offer it.
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No encryption (a relay on the same machine or network only).
    None,
}

/// Where an alert goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum AlertTarget {
    /// An HTTP(S) POST of the event as JSON; retried with back-off on a
    /// failure or a 5xx answer.
    Webhook {
        /// `http://` or `https://` URL.
        url: String,
    },
    /// An email through an SMTP server.
    Email {
        /// `host:port` of the server.
        smtp: String,
        /// Sender address.
        from: String,
        /// Recipients.
        to: Vec<String>,
        /// Login, if the server wants one.
        #[serde(default)]
        user: Option<String>,
        /// Password for `user`; never shown by the API.
        #[serde(default)]
        password: Option<String>,
        /// Encryption.
        #[serde(default)]
        security: SmtpSecurity,
    },
    /// A program run with the event as JSON on its standard input (and
    /// `TARN_EVENT_KIND`, `TARN_EVENT_SEVERITY`, `TARN_EVENT_MESSAGE` in
    /// its environment).
    Program {
        /// Absolute path.
        path: String,
    },
}

/// An alert: a name, where events go, and from what severity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alert {
    /// Its name.
    pub name: String,
    /// Where events go.
    pub target: AlertTarget,
    /// Events below this severity are not sent.
    #[serde(default = "warning")]
    pub min_severity: Severity,
}

fn warning() -> Severity {
    Severity::Warning
}

/// An alert as `alert.list` shows it (the password replaced by `"*"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertInfo {
    /// The alert.
    pub alert: Alert,
    /// Events delivered since the daemon started.
    pub sent: u64,
    /// Events held back by throttling since the daemon started.
    pub suppressed: u64,
    /// The last delivery failure, if the last delivery failed.
    pub last_error: Option<String>,
}

/// What `alert.test` answers per alert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertTestResult {
    /// The alert.
    pub name: String,
    /// Why delivery failed; none: delivered.
    pub error: Option<String>,
}

/// Checks an alert before it is stored.
pub fn check_alert(a: &Alert) -> Result<(), ApiError> {
    crate::access::check_name("alert", &a.name)?;
    match &a.target {
        AlertTarget::Webhook { url } => {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || url.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(ApiError::invalid(format!(
                    "'{url}' is not an http:// or https:// URL"
                )));
            }
            // The URL is stored and shown whole; a password in it is not
            // sent anyway (webhooks carry their token in the path or query).
            let rest = &url[url.find("://").map_or(0, |i| i + 3)..];
            if rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())].contains('@') {
                return Err(ApiError::invalid(
                    "a user and password in a webhook URL are not supported: put the token \
                     in its path or query",
                ));
            }
        }
        AlertTarget::Email {
            smtp,
            from,
            to,
            password,
            security,
            ..
        } => {
            let port_ok = smtp
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(ApiError::invalid(format!(
                    "--smtp {smtp}: use HOST:PORT, e.g. smtp.example.org:587"
                )));
            }
            if password_in_clear(smtp, password.is_some(), *security) {
                return Err(ApiError::invalid(format!(
                    "--smtp {smtp} with --security none would send the password unencrypted \
                     over the network: use starttls or tls (none with a password is for a \
                     relay on this machine only)"
                )));
            }
            let addr_ok = |s: &str| {
                s.split_once('@')
                    .is_some_and(|(u, d)| !u.is_empty() && (d.contains('.') || d == "localhost"))
                    && !s
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control() || "<>,".contains(c))
            };
            if !addr_ok(from) {
                return Err(ApiError::invalid(format!(
                    "'{from}' is not an email address"
                )));
            }
            if to.is_empty() {
                return Err(ApiError::invalid("an email alert needs --to ADDRESS"));
            }
            if let Some(bad) = to.iter().find(|t| !addr_ok(t)) {
                return Err(ApiError::invalid(format!(
                    "'{bad}' is not an email address"
                )));
            }
        }
        AlertTarget::Program { path } => {
            if !path.starts_with('/') {
                return Err(ApiError::invalid(format!(
                    "'{path}': give the program by its absolute path"
                )));
            }
        }
    }
    Ok(())
}

/// Whether an email alert would send its password unencrypted off this
/// machine: a password with `--security none` to a server that is not on
/// a loopback address or `localhost`. Refused when an alert is added, and
/// again at delivery (for an alert stored before that check).
pub fn password_in_clear(smtp: &str, has_password: bool, security: SmtpSecurity) -> bool {
    has_password && security == SmtpSecurity::None && !smtp_is_local(smtp)
}

/// Whether an SMTP `host:port` names this machine (a loopback address or
/// `localhost`).
fn smtp_is_local(smtp: &str) -> bool {
    let host = smtp.rsplit_once(':').map_or(smtp, |(h, _)| h);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(target: AlertTarget) -> Alert {
        Alert {
            name: "a".into(),
            target,
            min_severity: Severity::Warning,
        }
    }

    #[test]
    fn alerts_are_checked() {
        check_alert(&alert(AlertTarget::Webhook {
            url: "https://hooks.example.org/x?y=1".into(),
        }))
        .unwrap();
        assert!(check_alert(&alert(AlertTarget::Webhook {
            url: "ftp://x".into()
        }))
        .is_err());
        for with_user in ["https://bob:pw@host/x", "https://TOKEN@host?q=1"] {
            assert!(
                check_alert(&alert(AlertTarget::Webhook {
                    url: with_user.into()
                }))
                .is_err(),
                "{with_user}"
            );
        }
        check_alert(&alert(AlertTarget::Webhook {
            url: "https://host/a@b".into(),
        }))
        .expect("an @ in the path is not a user");
        let email = |smtp: &str, from: &str, to: &[&str]| {
            alert(AlertTarget::Email {
                smtp: smtp.into(),
                from: from.into(),
                to: to.iter().map(|s| s.to_string()).collect(),
                user: None,
                password: None,
                security: SmtpSecurity::Starttls,
            })
        };
        check_alert(&email(
            "smtp.example.org:587",
            "nas@example.org",
            &["me@example.org"],
        ))
        .unwrap();
        check_alert(&email("127.0.0.1:2525", "nas@localhost", &["me@localhost"])).unwrap();
        assert!(check_alert(&email("smtp.example.org", "nas@example.org", &["a@b.c"])).is_err());
        assert!(check_alert(&email("h:25", "nas", &["a@b.c"])).is_err());
        assert!(check_alert(&email("h:25", "nas@x.org", &[])).is_err());
        assert!(check_alert(&email("h:25", "@localhost", &["a@b.c"])).is_err());
        assert!(check_alert(&email("h:25", "nas@x.org", &["a@b.c>\r\nRCPT"])).is_err());
        // A password goes unencrypted only to this machine.
        let with_password = |smtp: &str, security| {
            alert(AlertTarget::Email {
                smtp: smtp.into(),
                from: "nas@example.org".into(),
                to: vec!["me@example.org".into()],
                user: Some("nas".into()),
                password: Some("pw".into()),
                security,
            })
        };
        for smtp in [
            "smtp.example.org:25",
            "10.0.0.2:25",
            "[fe80::1]:25",
            "localhost.evil.org:25",
        ] {
            let e = check_alert(&with_password(smtp, SmtpSecurity::None))
                .expect_err(smtp)
                .to_string();
            assert!(e.contains("unencrypted"), "{smtp}: {e}");
            check_alert(&with_password(smtp, SmtpSecurity::Starttls)).expect(smtp);
        }
        for smtp in ["127.0.0.1:2525", "localhost:25", "[::1]:25", "LOCALHOST:25"] {
            check_alert(&with_password(smtp, SmtpSecurity::None)).expect(smtp);
        }
        assert!(check_alert(&alert(AlertTarget::Program {
            path: "notify.sh".into()
        }))
        .is_err());
        assert!(Severity::Critical > Severity::Warning && Severity::Warning > Severity::Info);
    }
}

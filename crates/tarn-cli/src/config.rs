//! The configuration file, `tarn daemon --config /etc/tarn/tarn.toml`
//! (docs/config.md): every `tarn daemon` flag as a TOML key, in sections.
//!
//! A key's value becomes the default of its flag, so a flag given on the
//! command line still wins, and the value goes through the flag's own
//! parser: the file accepts exactly what the command line accepts, with
//! the same ranges, and a new flag cannot be forgotten here (a test maps
//! every flag to a key). What the command line cannot say, the file is
//! checked for too: unknown sections and keys (with the nearest known
//! one as a hint), values of the wrong kind, and settings that only make
//! sense together (a certificate without its key). Every error names the
//! file and the line.

use std::path::Path;

use anyhow::Context;

/// A key of the file: its section ("" for the top level), its name, and
/// the `tarn daemon` argument it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The `[section]`, or "" at the top.
    pub section: &'static str,
    /// The key's name in it.
    pub name: &'static str,
    /// The argument id of the flag it sets (`socket` is the global one).
    pub id: &'static str,
}

const fn key(section: &'static str, name: &'static str, id: &'static str) -> Key {
    Key { section, name, id }
}

/// Every key, in the order of docs/config.md.
pub const KEYS: &[Key] = &[
    key("", "state_dir", "state_dir"),
    key("", "socket", "socket"),
    key("", "log_level", "log_level"),
    key("listen", "nfs", "nfs"),
    key("listen", "webdav", "webdav"),
    key("listen", "smb", "smb"),
    key("listen", "nbd", "nbd"),
    key("listen", "iscsi", "iscsi"),
    key("listen", "replication", "replication"),
    key("listen", "web", "web"),
    key("listen", "web_origin", "web_origin"),
    key("listen", "metrics", "metrics"),
    key("metrics", "token_file", "metrics_token_file"),
    key("tls", "cert", "tls_cert"),
    key("tls", "key", "tls_key"),
    key("tls", "webdav_plain_http", "webdav_plain_http"),
    key("tls", "nbd_tls_required", "nbd_tls_required"),
    key("smb", "include", "smb_include"),
    key("engine", "txg_interval", "txg_interval"),
    key("engine", "dirty_max_mib", "dirty_max_mib"),
    key("engine", "cache_mib", "cache_mib"),
    key("engine", "fuse_threads", "fuse_threads"),
    key("limits", "admin_max_connections", "admin_max_connections"),
    key("limits", "admin_idle_timeout", "admin_idle_timeout"),
    key("limits", "admin_request_timeout", "admin_request_timeout"),
    key("limits", "nfs_max_connections", "nfs_max_connections"),
    key(
        "limits",
        "nfs_max_connections_per_address",
        "nfs_max_connections_per_address",
    ),
    key("limits", "nfs_idle_timeout", "nfs_idle_timeout"),
    key(
        "limits",
        "nfs_max_inflight_per_connection",
        "nfs_max_inflight_per_connection",
    ),
    key("limits", "nfs_workers", "nfs_workers"),
    key("limits", "webdav_max_connections", "webdav_max_connections"),
    key(
        "limits",
        "webdav_max_connections_per_address",
        "webdav_max_connections_per_address",
    ),
    key("limits", "webdav_header_timeout", "webdav_header_timeout"),
];

/// Arguments of `tarn daemon` that are not settings.
pub const NOT_SETTINGS: &[&str] = &["config", "action", "help", "output"];

/// What a configuration file says: the flag defaults it sets, by argument
/// id, each with the key that set it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// (argument id, value), in the file's order.
    pub defaults: Vec<(&'static str, String)>,
    /// (`section.key`, value), for `tarn config check`.
    pub settings: Vec<(String, String)>,
}

impl Key {
    /// `section.name`, or `name` at the top.
    pub fn dotted(&self) -> String {
        if self.section.is_empty() {
            self.name.to_string()
        } else {
            format!("{}.{}", self.section, self.name)
        }
    }
}

fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> usize {
    let at = span.map_or(0, |s| s.start).min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Edit distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The hint for an unknown key `name` in `section`.
fn hint_for(section: &str, name: &str) -> String {
    if let Some(k) = KEYS.iter().find(|k| k.name == name) {
        return if k.section.is_empty() {
            format!("`{name}` goes at the top of the file, before any [section]")
        } else {
            format!("`{name}` goes in [{}]", k.section)
        };
    }
    let best = KEYS
        .iter()
        .filter(|k| k.section == section)
        .min_by_key(|k| distance(k.name, name));
    match best {
        Some(k) if distance(k.name, name) <= 3 => format!("did you mean `{}`?", k.name),
        _ => "see docs/config.md for the keys".to_string(),
    }
}

/// Parses a configuration file's text against `daemon`, the `tarn daemon`
/// command (for the flags' own value parsers). `file` names it in errors.
pub fn parse(text: &str, file: &str, daemon: &clap::Command) -> Result<Loaded, String> {
    use toml_edit::{Document, Item, Value};
    let doc = Document::parse(text).map_err(|e| {
        format!(
            "{file}:{}: {}",
            line_of(text, e.span()),
            e.message().trim_end()
        )
    })?;
    let mut out = Loaded::default();
    let mut entries: Vec<(Key, &Value, usize)> = Vec::new();
    let err = |line: usize, msg: String| format!("{file}:{line}: {msg}");
    for (name, item) in doc.as_table().iter() {
        let line = line_of(text, doc.as_table().key(name).and_then(|k| k.span()));
        match item {
            Item::Table(t) => {
                if !KEYS.iter().any(|k| k.section == name) {
                    let sections = ["listen", "tls", "smb", "metrics", "engine", "limits"];
                    let near = sections.iter().min_by_key(|s| distance(s, name));
                    return Err(err(
                        line,
                        format!(
                            "unknown section [{name}]{}",
                            near.filter(|s| distance(s, name) <= 3)
                                .map(|s| format!("; did you mean [{s}]?"))
                                .unwrap_or_else(|| format!(
                                    "; the sections are [{}]",
                                    sections.join("], [")
                                ))
                        ),
                    ));
                }
                for (k, v) in t.iter() {
                    let kline = line_of(text, t.key(k).and_then(|k| k.span()));
                    let Some(key) = KEYS.iter().find(|x| x.section == name && x.name == k) else {
                        return Err(err(
                            kline,
                            format!("unknown key `{k}` in [{name}]; {}", hint_for(name, k)),
                        ));
                    };
                    let Some(v) = v.as_value() else {
                        return Err(err(kline, format!("`{name}.{k}` takes a single value")));
                    };
                    entries.push((*key, v, kline));
                }
            }
            Item::Value(v) => {
                let Some(key) = KEYS.iter().find(|x| x.section.is_empty() && x.name == name) else {
                    return Err(err(
                        line,
                        format!("unknown key `{name}`; {}", hint_for("", name)),
                    ));
                };
                entries.push((*key, v, line));
            }
            _ => {
                return Err(err(
                    line,
                    format!("`{name}`: arrays of tables are not used here"),
                ))
            }
        }
    }
    for (key, v, line) in entries {
        let value = match v {
            Value::String(s) => s.value().clone(),
            Value::Integer(i) => i.value().to_string(),
            Value::Boolean(b) => b.value().to_string(),
            _ => {
                return Err(err(
                    line,
                    format!(
                        "`{}` takes a string, a whole number or true/false",
                        key.dotted()
                    ),
                ))
            }
        };
        check_value(daemon, &key, &value).map_err(|m| err(line, m))?;
        out.defaults.push((key.id, value.clone()));
        out.settings.push((key.dotted(), value));
    }
    let has = |id: &str| out.defaults.iter().any(|(i, v)| *i == id && v != "false");
    let pairs = [
        ("tls_cert", "tls_key", "tls.cert and tls.key go together"),
        ("tls_key", "tls_cert", "tls.cert and tls.key go together"),
        ("smb_include", "smb", "smb.include needs listen.smb"),
        (
            "nbd_tls_required",
            "nbd",
            "tls.nbd_tls_required needs listen.nbd",
        ),
        (
            "metrics_token_file",
            "metrics",
            "metrics.token_file needs listen.metrics",
        ),
    ];
    for (a, b, why) in pairs {
        if has(a) && !has(b) {
            return Err(format!("{file}: {why}"));
        }
    }
    // The daemon refuses metrics open to the network without a token, but
    // only after it has imported its pools: said here, before any start.
    let value = |id: &str| out.defaults.iter().find(|(i, _)| *i == id).map(|(_, v)| v);
    if let Some(addr) = value("metrics") {
        let open = addr
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| !a.ip().is_loopback());
        if open && !has("metrics_token_file") {
            return Err(format!(
                "{file}: listen.metrics on {addr} would be open to the network: give \
                 metrics.token_file, or listen on 127.0.0.1"
            ));
        }
    }
    if has("webdav_plain_http") && has("tls_cert") {
        return Err(format!(
            "{file}: tls.webdav_plain_http and a certificate (tls.cert) contradict each other"
        ));
    }
    Ok(out)
}

/// Runs `value` through the parser of the flag `key` sets.
fn check_value(daemon: &clap::Command, key: &Key, value: &str) -> Result<(), String> {
    if key.id == "socket" {
        return if value.is_empty() {
            Err("`socket` is a path".into())
        } else {
            Ok(())
        };
    }
    let Some(arg) = daemon.get_arguments().find(|a| a.get_id() == key.id) else {
        return Err(format!("`{}` is not a setting of this tarn", key.dotted()));
    };
    if !arg.get_action().takes_values() || arg.get_value_names() == Some(&["BOOL".into()]) {
        return match value {
            "true" | "false" => Ok(()),
            _ => Err(format!("`{}` is true or false", key.dotted())),
        };
    }
    // The flag alone, with its parser: the others' requirements (a
    // certificate needs its key) are checked on the whole file.
    let long = arg.get_long().unwrap_or(key.id);
    let alone = clap::Arg::new("value")
        .long(long.to_string())
        .value_name("V")
        .value_parser(arg.get_value_parser().clone());
    clap::Command::new("check")
        .no_binary_name(true)
        .arg(alone)
        .try_get_matches_from([format!("--{long}"), value.to_string()])
        .map(|_| ())
        .map_err(|e| {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("").trim();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            // clap names the flag; the file names the key.
            let first = first
                .split(&format!("'--{long} <"))
                .next()
                .unwrap_or(first)
                .trim_end()
                .trim_end_matches(" for")
                .to_string();
            let why: Vec<&str> = msg
                .lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            let mut out = format!("`{}`: {first}", key.dotted());
            if key.section == "listen" {
                out.push_str(": an address and a port, e.g. \"0.0.0.0:2049\" or \"[::]:2049\"");
                return out;
            }
            if let Some(tail) = msg.lines().next().and_then(|l| l.split_once(">': ")) {
                out.push_str(": ");
                out.push_str(tail.1.trim());
            }
            if !why.is_empty() {
                out.push_str(&format!(" ({})", why.join("; ")));
            }
            out
        })
}

/// Reads and parses the file at `path` (see [`parse`]).
pub fn load(path: &Path, daemon: &clap::Command) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
    parse(&text, &path.display().to_string(), daemon).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn daemon() -> clap::Command {
        let mut c = crate::Cli::command();
        c.build();
        c.find_subcommand("daemon").cloned().unwrap()
    }

    fn parse_ok(text: &str) -> Loaded {
        parse(text, "t.toml", &daemon()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> String {
        parse(text, "t.toml", &daemon()).unwrap_err()
    }

    #[test]
    fn every_flag_of_tarn_daemon_has_a_key() {
        let d = daemon();
        for arg in d.get_arguments() {
            let id = arg.get_id().as_str();
            if NOT_SETTINGS.contains(&id) {
                continue;
            }
            assert!(
                KEYS.iter().any(|k| k.id == id),
                "`tarn daemon --{}` has no key in the configuration file",
                id.replace('_', "-")
            );
        }
        for k in KEYS {
            assert!(
                k.id == "socket" || d.get_arguments().any(|a| a.get_id() == k.id),
                "{} sets no flag",
                k.dotted()
            );
        }
    }

    #[test]
    fn values_become_flag_defaults() {
        let l = parse_ok(
            "state_dir = \"/srv/tarn\"\n[listen]\nnfs = \"0.0.0.0:2049\"\n\n[engine]\n\
             cache_mib = 512\n[tls]\nwebdav_plain_http = true\n",
        );
        assert_eq!(
            l.defaults,
            [
                ("state_dir", "/srv/tarn".to_string()),
                ("nfs", "0.0.0.0:2049".to_string()),
                ("cache_mib", "512".to_string()),
                ("webdav_plain_http", "true".to_string()),
            ]
        );
        assert_eq!(
            l.settings[1],
            ("listen.nfs".to_string(), "0.0.0.0:2049".to_string())
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_line_and_a_hint() {
        let cases: &[(&str, &str)] = &[
            (
                "[listen]\nnfs = \"0.0.0.0:2049\"\nnfz = 1\n",
                "t.toml:3: unknown key `nfz` in [listen]; did you mean `nfs`?",
            ),
            (
                "nfs = \"0.0.0.0:2049\"\n",
                "t.toml:1: unknown key `nfs`; `nfs` goes in [listen]",
            ),
            (
                "[engine]\nstate_dir = \"/x\"\n",
                "`state_dir` goes at the top of the file",
            ),
            (
                "\n\n[lisen]\n",
                "t.toml:3: unknown section [lisen]; did you mean [listen]?",
            ),
            ("[engine]\ncache_mib = -1\n", "t.toml:2: `engine.cache_mib`"),
            (
                "[engine]\ntxg_interval = 0\n",
                "t.toml:2: `engine.txg_interval`",
            ),
            ("[listen]\nnfs = 2049\n", "t.toml:2: `listen.nfs`"),
            (
                "[listen]\nnfs = [1]\n",
                "t.toml:2: `listen.nfs` takes a string",
            ),
            (
                "[tls]\nwebdav_plain_http = \"yes\"\n",
                "t.toml:2: `tls.webdav_plain_http` is true or false",
            ),
            (
                "[tls]\ncert = \"/c.pem\"\n",
                "tls.cert and tls.key go together",
            ),
            (
                "[smb]\ninclude = \"/x.conf\"\n",
                "smb.include needs listen.smb",
            ),
            ("log_level = \"loud\"\n", "t.toml:1: `log_level`"),
            ("a = \n", "t.toml:1:"),
            ("[listen]\nnfs = \"a\"\nnfs = \"b\"\n", "t.toml:3:"),
            (
                "[listen]\nmetrics = \"0.0.0.0:9470\"\n",
                "t.toml: listen.metrics on 0.0.0.0:9470 would be open to the network",
            ),
        ];
        for (text, want) in cases {
            let e = parse_err(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // Metrics on loopback, or with a token, are fine.
        parse_ok("[listen]\nmetrics = \"127.0.0.1:9470\"\n");
        parse_ok("[listen]\nmetrics = \"0.0.0.0:9470\"\n[metrics]\ntoken_file = \"/t\"\n");
        let e = parse_err("[engine]\ntxg_interval = 0\n");
        assert!(e.contains("1..=300"), "the flag's range is the hint: {e}");
    }

    #[test]
    fn edit_distance() {
        assert_eq!(distance("nfs", "nfz"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}

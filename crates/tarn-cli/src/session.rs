//! A command's session: the connection to the daemon (opened on first use,
//! with the API version checked), where and how results are printed, and
//! the small conversions every command group needs (decoding an answer,
//! making paths absolute for the daemon).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use serde_json::Value;

use crate::client::Client;

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Tables and trees like the `zpool` commands.
    Human,
    /// The raw result of each API call, pretty-printed.
    Json,
}

/// The connection to the daemon, opened on first use so that mistakes in
/// the arguments are reported even when no daemon runs. A fresh connection
/// first checks that the daemon speaks this client's API version.
pub(crate) struct Session {
    pub(crate) path: PathBuf,
    client: Option<Client>,
}

impl Session {
    /// A session with the daemon on `path`; nothing is connected yet.
    pub(crate) fn new(path: PathBuf) -> Session {
        Session { path, client: None }
    }

    /// Calls `method` on the daemon and returns its raw JSON result.
    pub(crate) fn call(
        &mut self,
        method: &str,
        params: &impl serde::Serialize,
    ) -> anyhow::Result<Value> {
        // A connection that waited (`pool iostat 60`) may have been closed
        // by the daemon's idle timeout meanwhile: open a fresh one.
        let client = match self.client.take() {
            Some(client) if !client.closed_by_daemon() => client,
            _ => connect_checked(&self.path)?,
        };
        let mut result = self.client.insert(client).call(method, params);
        // A connection closed before the request could be written on it
        // (a daemon at its connection limit closes the connection idle the
        // longest, and under a flood of connections that can be this one,
        // between two of its requests): nothing was done, so the request
        // goes again on a fresh connection.
        let mut tries = 0;
        while tries < CONNECT_TRIES
            && result.as_ref().is_err_and(|e| {
                e.downcast_ref::<crate::client::ClosedUnanswered>()
                    .is_some_and(|c| !c.sent)
            })
        {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(20 << tries));
            let client = connect_checked(&self.path)?;
            result = self.client.insert(client).call(method, params);
        }
        result
    }

    /// Calls a method whose reply carries a streamed body into `out` (on a
    /// connection of its own).
    pub(crate) fn call_body_out(
        &mut self,
        method: &str,
        params: &impl serde::Serialize,
        out: &mut dyn std::io::Write,
    ) -> anyhow::Result<Value> {
        let mut client = connect_checked(&self.path)?;
        client.call_body_out(method, params, out)
    }

    /// Calls a method whose request carries `input` as a streamed body (on
    /// a connection of its own).
    pub(crate) fn call_body_in(
        &mut self,
        method: &str,
        params: &impl serde::Serialize,
        input: &mut dyn std::io::Read,
    ) -> anyhow::Result<Value> {
        let mut client = connect_checked(&self.path)?;
        client.call_body_in(method, params, input)
    }

    /// Calls a method whose answer needs no words for people (most changes
    /// answer `null`): prints it only with `-o json`.
    pub(crate) fn call_quietly(
        &mut self,
        out: &Out,
        method: &str,
        params: &impl serde::Serialize,
    ) -> anyhow::Result<()> {
        let v = self.call(method, params)?;
        out.raw_or(&v, String::new)
    }
}

/// Retries of [`connect_checked`]'s first request after its connection
/// was closed unheard.
const CONNECT_TRIES: u32 = 6;

/// A fresh connection whose daemon speaks this client's API. The first
/// request is a ping, safe to repeat: when a daemon at its connection
/// limit closes the new connection before it was heard (it makes room by
/// closing the connection idle the longest), the ping is tried again on
/// another connection, up to [`CONNECT_TRIES`] times with a growing pause
/// (2.5 s in all). Under a local program flooding the socket with
/// connections, a command descheduled between its connect and its write
/// on a busy machine lost its connection four times running in one test
/// run; six retries make that far less likely.
fn connect_checked(path: &Path) -> anyhow::Result<Client> {
    let mut tries = 0;
    loop {
        let mut client = Client::connect(path)?;
        match client.check_api_version() {
            Ok(_) => return Ok(client),
            Err(e) if tries < CONNECT_TRIES && e.is::<crate::client::ClosedUnanswered>() => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20 << tries));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Where results go.
pub(crate) struct Out {
    format: Format,
}

impl Out {
    /// Results printed in `format`.
    pub(crate) fn new(format: Format) -> Out {
        Out { format }
    }

    /// Whether results are for people (not JSON).
    pub(crate) fn is_human(&self) -> bool {
        matches!(self.format, Format::Human)
    }

    /// Prints the raw result in JSON mode, or `human()` otherwise. Fails
    /// if stdout is gone (e.g. `| head` ended), which [`crate::cli::is_broken_pipe`]
    /// recognises so the program can end quietly.
    pub(crate) fn raw_or(&self, raw: &Value, human: impl FnOnce() -> String) -> anyhow::Result<()> {
        let text = match self.format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(raw).unwrap_or_else(|_| raw.to_string());
                s.push('\n');
                s
            }
            Format::Human => human(),
        };
        if !text.is_empty() {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
        }
        Ok(())
    }
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(method: &str, v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| {
        format!(
            "the daemon's answer to {method} does not have the expected shape; \
             are the daemon and this client the same version? (`tarn daemon ping`)"
        )
    })
}

pub(crate) fn absolute(path: &Path) -> anyhow::Result<String> {
    let abs = std::path::absolute(path)
        .with_context(|| format!("cannot make {} absolute", path.display()))?;
    abs.to_str().map(str::to_string).ok_or_else(|| {
        anyhow!(
            "path {} is not valid UTF-8; rename it or use a symlink with a UTF-8 name",
            abs.display()
        )
    })
}

/// Devices named by path are made absolute; a bare word that is not a file
/// here (`sdb`, a GUID) is passed on for the daemon to match.
pub(crate) fn device_arg(device: &str) -> anyhow::Result<String> {
    if device.contains('/') || Path::new(device).exists() {
        absolute(Path::new(device))
    } else {
        Ok(device.to_string())
    }
}

//! Encryption keys: `tarn key load|unload|change|list` (ZFS's `load-key`,
//! `unload-key`, `change-key`), and asking for a new encryption root's key
//! when `dataset create` or `volume create` gives `-o keyformat=...`.
//!
//! A key at `keylocation=prompt` is read here: from the terminal without
//! echo (a new passphrase twice), or, when standard input is not a
//! terminal, as one line of it (a raw key: its 32 bytes), so scripts can
//! pipe it. It travels to the daemon once, inside the request on the admin
//! socket. A `file://` key is read by the daemon.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};

use anyhow::{bail, Context};
use clap::Subcommand;
use tarn_api::dataset::KeyRootInfo;
use tarn_api::method;
use tarn_api::params::{KeyChangeParams, KeyLoadParams, NameParams, OptionalNameParams};

use crate::render;
use crate::session::{decode, Out, Session};

/// `tarn key ...`.
#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Load the key of an encryption root, so its datasets can be mounted
    /// and shared (asks for a passphrase at keylocation=prompt)
    Load {
        /// Every encryption root at or below NAME
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Every encryption root of every pool
        #[arg(short = 'a', long)]
        all: bool,
        /// Read the key from here this time (`prompt` or `file:///path`)
        #[arg(short = 'L', long = "location", value_name = "LOCATION")]
        location: Option<String>,
        /// Drop intent log records kept since a crash that can no longer
        /// be read, instead of refusing the load (reported as damage)
        #[arg(long)]
        discard_log: bool,
        /// The encryption root
        name: Option<String>,
    },
    /// Unload the key of an encryption root: its datasets are unmounted,
    /// no longer shared, and locked
    Unload {
        /// Every encryption root at or below NAME
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Every encryption root of every pool
        #[arg(short = 'a', long)]
        all: bool,
        /// The encryption root
        name: Option<String>,
    },
    /// Change the key of an encryption root (`-o keyformat=...`,
    /// `-o keylocation=...`); its data is not rewritten
    Change {
        /// The encryption root (its key loaded)
        name: String,
    },
    /// The encryption roots, with whether their key is loaded
    List {
        /// Only those at or below this dataset
        name: Option<String>,
    },
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Reads one key of `format` for `what` from the terminal (twice when
/// `confirm`), or from standard input when it is not a terminal.
fn read_key(format: &str, what: &str, confirm: bool) -> anyhow::Result<Vec<u8>> {
    let stdin = std::io::stdin();
    if format == "raw" {
        if stdin.is_terminal() {
            bail!("a raw key is 32 bytes: pipe it in (`tarn ... < keyfile`) or keep it in a file");
        }
        let mut b = Vec::new();
        stdin
            .lock()
            .take(33)
            .read_to_end(&mut b)
            .context("reading the raw key from standard input")?;
        return Ok(b);
    }
    let noun = if format == "hex" {
        "hex key"
    } else {
        "passphrase"
    };
    if !stdin.is_terminal() {
        let mut line = String::new();
        stdin
            .read_line(&mut line)
            .context("reading the key from standard input")?;
        let line = line.strip_suffix('\n').unwrap_or(&line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        return Ok(line.as_bytes().to_vec());
    }
    let first = rpassword::prompt_password(format!("Enter {noun} for '{what}': "))
        .context("reading from the terminal")?;
    if confirm {
        let again = rpassword::prompt_password(format!("Re-enter {noun} for '{what}': "))
            .context("reading from the terminal")?;
        if again != first {
            bail!("the two {noun}s differ; nothing was changed");
        }
    }
    Ok(first.into_bytes())
}

/// The key of a new encryption root that `properties` ask for (with
/// `keyformat` and a prompt location), as the API carries it (hex); None
/// when the dataset inherits, or the daemon reads a key file.
pub(crate) fn new_root_key(
    name: &str,
    properties: &BTreeMap<String, String>,
) -> anyhow::Result<Option<String>> {
    let Some(format) = properties.get("keyformat") else {
        return Ok(None);
    };
    let location = properties
        .get("keylocation")
        .map(String::as_str)
        .unwrap_or("prompt");
    if location != "prompt" {
        return Ok(None);
    }
    Ok(Some(hex(&read_key(format, name, true)?)))
}

fn roots(client: &mut Session, name: Option<&str>) -> anyhow::Result<Vec<KeyRootInfo>> {
    let v = client.call(
        method::KEY_LIST,
        &OptionalNameParams {
            name: name.map(str::to_string),
        },
    )?;
    decode(method::KEY_LIST, v)
}

/// The roots a `load` or `unload` names: NAME itself, or with `-r` every
/// root at or below it, or with `-a` every root.
fn chosen(
    client: &mut Session,
    name: Option<String>,
    recursive: bool,
    all: bool,
) -> anyhow::Result<Vec<KeyRootInfo>> {
    match (name, recursive, all) {
        (None, _, true) => roots(client, None),
        (Some(n), true, false) => roots(client, Some(&n)),
        (Some(n), false, false) => {
            let found = roots(client, Some(&n))?;
            match found.into_iter().find(|r| r.name == n) {
                Some(r) => Ok(vec![r]),
                // Not a root: the daemon says why (not encrypted, or which
                // root it inherits from).
                None => Ok(vec![KeyRootInfo {
                    name: n,
                    keystatus: String::new(),
                    keyformat: String::new(),
                    keylocation: String::new(),
                }]),
            }
        }
        (Some(_), _, true) => bail!("-a loads every key: give no dataset with it"),
        (None, _, false) => bail!("name an encryption root, or give -a"),
    }
}

pub(crate) fn key_command(
    client: &mut Session,
    out: &Out,
    cmd: KeyCommand,
    props: Vec<(String, String)>,
) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Load {
            recursive,
            all,
            location,
            discard_log,
            name,
        } => {
            let many = recursive || all;
            let mut loaded = 0;
            for r in chosen(client, name, recursive, all)? {
                if many && r.keystatus == "available" {
                    continue;
                }
                let from = location.as_deref().unwrap_or(&r.keylocation);
                let key = if from == "prompt" {
                    Some(hex(&read_key(&r.keyformat, &r.name, false)?))
                } else {
                    None
                };
                let params = KeyLoadParams {
                    name: r.name.clone(),
                    key,
                    location: location.clone().filter(|l| l != "prompt"),
                    discard_log,
                };
                match client.call(method::KEY_LOAD, &params) {
                    Ok(_) => loaded += 1,
                    Err(e) if many => eprintln!("tarn: {}: {e:#}", r.name),
                    Err(e) => return Err(e),
                }
            }
            if many {
                let raw = serde_json::json!({ "loaded": loaded });
                out.raw_or(&raw, || format!("{loaded} key(s) loaded\n"))?;
            }
        }
        KeyCommand::Unload {
            recursive,
            all,
            name,
        } => {
            let many = recursive || all;
            for r in chosen(client, name, recursive, all)? {
                if many && r.keystatus != "available" {
                    continue;
                }
                let params = NameParams {
                    name: r.name.clone(),
                };
                match client.call(method::KEY_UNLOAD, &params) {
                    Ok(_) => {}
                    Err(e) if many => eprintln!("tarn: {}: {e:#}", r.name),
                    Err(e) => return Err(e),
                }
            }
        }
        KeyCommand::Change { name } => {
            let mut props: BTreeMap<String, String> = props.into_iter().collect();
            let keyformat = props.remove("keyformat");
            let keylocation = props.remove("keylocation");
            if let Some((k, _)) = props.into_iter().next() {
                bail!("-o {k}: `key change` takes keyformat and keylocation only");
            }
            let current = roots(client, Some(&name))?
                .into_iter()
                .find(|r| r.name == name);
            let format = keyformat
                .clone()
                .or_else(|| current.as_ref().map(|r| r.keyformat.clone()))
                .unwrap_or_else(|| "passphrase".into());
            let location = keylocation
                .clone()
                .or_else(|| current.as_ref().map(|r| r.keylocation.clone()))
                .unwrap_or_else(|| "prompt".into());
            let key = if location == "prompt" {
                Some(hex(&read_key(&format, &name, true)?))
            } else {
                None
            };
            let params = KeyChangeParams {
                name,
                keyformat,
                keylocation,
                key,
            };
            client.call_quietly(out, method::KEY_CHANGE, &params)?;
        }
        KeyCommand::List { name } => {
            let list = roots(client, name.as_deref())?;
            let raw = serde_json::to_value(&list)?;
            out.raw_or(&raw, || render::render_keys(&list))?;
        }
    }
    Ok(())
}

//! Encryption keys on the node: where a key comes from (the request, or a
//! `keylocation` file the daemon reads), loading file keys when a pool is
//! imported, and what a key's datasets need from the front ends when it
//! is loaded or unloaded.
//!
//! A key given at a prompt travels once, inside the request on the admin
//! socket (mode 0600, root's), as hex of the bytes typed; the daemon keeps
//! only the unwrapped master key in memory (`tarn_dataset::crypt`). A
//! `file://` key is read by the daemon itself, at import and whenever a
//! command names none: the file must be readable by the daemon's user.

use std::sync::Arc;

use tarn_api::ApiError;
use tarn_dataset::{KeyFormat, KeyInput};
use tarn_pool::Pool;
use zeroize::Zeroizing;

use crate::convert::ds_error;

/// Largest key file read: a passphrase is at most 512 bytes.
const MAX_KEY_FILE: u64 = 4096;

/// The bytes of a hex string (the API's encoding of key material).
pub(crate) fn unhex(s: &str) -> Result<Zeroizing<Vec<u8>>, ApiError> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(ApiError::invalid("the key must be sent as hex"));
    }
    let mut out = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for i in (0..s.len()).step_by(2) {
        out.push(
            u8::from_str_radix(&s[i..i + 2], 16)
                .map_err(|_| ApiError::invalid("the key must be sent as hex"))?,
        );
    }
    Ok(out)
}

/// Reads a key from `location` (`file:///path`): a passphrase or hex key
/// loses one trailing newline, a raw key is taken byte for byte.
pub(crate) fn read_location(
    format: KeyFormat,
    location: &str,
    root: &str,
) -> Result<Zeroizing<Vec<u8>>, ApiError> {
    let Some(path) = location.strip_prefix("file://") else {
        return Err(ApiError::invalid(format!(
            "the key of '{root}' is given at a prompt: run `tarn key load {root}` in a terminal, \
             or give -L file:///path"
        )));
    };
    use std::io::Read;
    let f = std::fs::File::open(path)
        .map_err(|e| ApiError::invalid(format!("key file {path} of '{root}': {e}")))?;
    let mut bytes = Zeroizing::new(Vec::new());
    f.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ApiError::invalid(format!("key file {path} of '{root}': {e}")))?;
    if bytes.len() as u64 > MAX_KEY_FILE {
        return Err(ApiError::invalid(format!(
            "key file {path} of '{root}' is larger than {MAX_KEY_FILE} bytes"
        )));
    }
    if format != KeyFormat::Raw {
        let n = bytes.len();
        if bytes.ends_with(b"\r\n") {
            bytes.truncate(n - 2);
        } else if bytes.ends_with(b"\n") {
            bytes.truncate(n - 1);
        }
    }
    Ok(bytes)
}

/// The key input for `root`: the bytes the request carries (hex), or
/// those of `location`'s file.
pub(crate) fn input(
    format: KeyFormat,
    location: &str,
    given: Option<&str>,
    root: &str,
) -> Result<KeyInput, ApiError> {
    let material = match given {
        Some(h) => unhex(h)?,
        None => read_location(format, location, root)?,
    };
    Ok(KeyInput::new(format, location, material.to_vec()))
}

/// The key of a new encryption root asked for by `properties` (with
/// `keyformat`), or None when the dataset inherits or is unencrypted.
pub(crate) fn new_root_input(
    name: &str,
    properties: &std::collections::BTreeMap<String, String>,
    given: Option<&str>,
) -> Result<Option<KeyInput>, ApiError> {
    let Some(format) = properties.get("keyformat") else {
        if given.is_some() {
            return Err(ApiError::invalid(format!(
                "a key was given for '{name}' without -o keyformat=...: a key belongs to a new \
                 encryption root"
            )));
        }
        return Ok(None);
    };
    let format = KeyFormat::parse(format).map_err(ds_error)?;
    let location = properties
        .get("keylocation")
        .map(String::as_str)
        .unwrap_or("prompt");
    input(format, location, given, name).map(Some)
}

/// Loads every key of `pool` kept in a file (at import, or at start): the
/// datasets of other keys stay locked until `tarn key load`. Failures are
/// reported and leave that key unloaded.
pub(crate) fn autoload(pool: &Arc<Pool>) {
    let Ok(roots) = tarn_dataset::encryption_roots(pool, None) else {
        return;
    };
    for (root, loaded, format, location) in roots {
        if loaded || !location.starts_with("file://") {
            continue;
        }
        let r = input(format, &location, None, &root)
            .and_then(|k| tarn_dataset::load_key(pool, &root, &k).map_err(ds_error));
        match r {
            Ok(_) => log::warn!("tarn: loaded the key of '{root}' from {location}"),
            Err(e) => log::warn!("tarn: the key of '{root}' was not loaded: {e}"),
        }
    }
}

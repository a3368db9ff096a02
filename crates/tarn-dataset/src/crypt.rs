//! Encryption keys of datasets: key records, loading, unloading and
//! changing them.
//!
//! # Theory
//!
//! An *encryption root* is a dataset created with its own key (`-o
//! encryption=on -o keyformat=...`). Its *key record* (`K` + key id in
//! the meta tree, JSON) holds the cipher, how the user gives the key
//! (`keyformat`, `keylocation`), the Argon2id parameters and salt for a
//! passphrase, and the dataset's random master key *wrapped* under the
//! user's key (`tarn_block::crypt`). Every dataset sealed with that master
//! key names the record in its own record (`key`): the root, the
//! filesystems and volumes created under it that did not get a key of
//! their own, their snapshots, and clones of those snapshots wherever they
//! live (a clone shares its origin's blocks, so it must share their key).
//! A record lives as long as one dataset names it; when its root is
//! destroyed while clones still use it, the oldest of them becomes the
//! root.
//!
//! **Loaded keys live only in memory** (`Dir::loaded`, key id → the
//! unwrapped master key). Loading derives the wrapping key (Argon2id takes
//! a few hundred milliseconds, so it runs outside every lock), unwraps the
//! master key (a wrong key fails the AEAD tag: [`DsError::WrongKey`]), and
//! then, as one exclusive operation, checks that the record did not change
//! meanwhile, installs the key and replays the intent log records that
//! were parked for its datasets at import (`zil`). Unloading is an
//! exclusive operation: everything pending commits first, so no staged
//! block of the key's datasets is left for a sync that could no longer
//! seal it, and the pool's cached plaintext is dropped. Changing the key
//! rewraps the master key under a new wrapping key: no data is rewritten.
//!
//! **Locked datasets.** A transaction on a dataset whose key is not loaded
//! fails with [`DsError::Locked`] before it reads anything, so no front end
//! can read ciphertext as data or write plaintext. What needs no key goes
//! on: scrub and resilver (checksums cover the ciphertext, tree nodes are
//! not encrypted), snapshots and their destruction, rename, space
//! accounting. A sync never seals with a missing key: `Dir::block_opts`
//! fails instead, which faults the pool rather than write plaintext.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tarn_block::crypt::WrappingKey;
pub use tarn_block::crypt::{random_bytes, Pbkdf};
use tarn_block::{BlockError, Cipher, KeySet};
use tarn_pool::Pool;
use zeroize::Zeroizing;

use crate::dsl::{with_dir, with_excl, Dir};
use crate::record::{hex, now_unix, P_KEY};
use crate::DsError;

/// How the user gives a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyFormat {
    /// A passphrase of 8 to 512 bytes, stretched with Argon2id.
    Passphrase,
    /// Exactly 32 raw bytes.
    Raw,
    /// 64 hexadecimal digits (32 bytes).
    Hex,
}

impl KeyFormat {
    /// Parses the `keyformat` property.
    pub fn parse(s: &str) -> Result<Self, DsError> {
        match s {
            "passphrase" => Ok(Self::Passphrase),
            "raw" => Ok(Self::Raw),
            "hex" => Ok(Self::Hex),
            _ => Err(DsError::Invalid(format!(
                "keyformat={s}: expected passphrase, raw or hex"
            ))),
        }
    }

    /// The property value users see.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Passphrase => "passphrase",
            Self::Raw => "raw",
            Self::Hex => "hex",
        }
    }
}

/// Checks a `keylocation`: `prompt`, or `file://` and an absolute path.
pub fn check_keylocation(s: &str) -> Result<(), DsError> {
    if s == "prompt" {
        return Ok(());
    }
    match s.strip_prefix("file://") {
        // Bounded as stored (JSON escapes quotes, backslashes and control
        // characters), so the key record always fits a meta tree value.
        Some(p)
            if p.starts_with('/')
                && !p.contains('\0')
                && serde_json::to_vec(s).map_or(usize::MAX, |j| j.len()) < 4096 =>
        {
            Ok(())
        }
        _ => Err(DsError::Invalid(format!(
            "keylocation={s}: expected prompt or file:///absolute/path"
        ))),
    }
}

/// A key as the user gives it, to create an encryption root, load its key
/// or change it.
pub struct KeyInput {
    /// How `material` is to be read.
    pub format: KeyFormat,
    /// Where the key comes from next time (`prompt` or `file:///path`).
    pub location: String,
    /// The passphrase or key bytes, as given (hex as text).
    pub material: Zeroizing<Vec<u8>>,
    /// Argon2id parameters for a new passphrase.
    pub pbkdf: Pbkdf,
}

impl std::fmt::Debug for KeyInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KeyInput({}, {}, <secret>)",
            self.format.name(),
            self.location
        )
    }
}

impl KeyInput {
    /// A key given in `format`, with the default Argon2id parameters.
    pub fn new(format: KeyFormat, location: &str, material: Vec<u8>) -> Self {
        KeyInput {
            format,
            location: location.to_string(),
            material: Zeroizing::new(material),
            pbkdf: Pbkdf::default(),
        }
    }
}

/// The Argon2id parameters and salt of a passphrase key, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PbkdfRec {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
    /// Lowercase hex.
    pub salt: String,
}

/// A key record (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeyRec {
    pub id: u64,
    pub guid: u64,
    /// The cipher's property name (`aes-256-gcm`, ...).
    pub cipher: String,
    pub keyformat: KeyFormat,
    pub keylocation: String,
    /// Passphrase keys only.
    #[serde(default)]
    pub pbkdf: Option<PbkdfRec>,
    /// The wrapped master key, lowercase hex.
    pub wrapped: String,
    /// The encryption root: the dataset whose key this is.
    pub root: u64,
    pub created_unix: u64,
}

pub(crate) fn key_key(id: u64) -> Vec<u8> {
    let mut k = vec![P_KEY];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(format!("odd or non-ASCII hex of {} characters", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

fn block_err(e: BlockError) -> DsError {
    match e {
        BlockError::WrongKey => DsError::WrongKey("the key or passphrase is wrong".into()),
        BlockError::InvalidProperty(m) => DsError::Invalid(m),
        other => DsError::Invalid(other.to_string()),
    }
}

impl KeyRec {
    pub(crate) fn cipher(&self) -> Result<Cipher, DsError> {
        Cipher::parse(&self.cipher)
            .map_err(|e| DsError::Corrupt(format!("key record {}: {e}", self.id)))
    }

    /// What the wrapped key is bound to: this record's identity and cipher.
    fn aad(&self) -> Result<Vec<u8>, DsError> {
        let mut a = b"tarn-key".to_vec();
        a.extend_from_slice(&self.guid.to_le_bytes());
        a.push(self.cipher()? as u8);
        Ok(a)
    }

    /// The wrapping key `input` gives for this record (Argon2id for a
    /// passphrase: slow, call it outside every lock).
    fn wrapping(&self, input: &KeyInput) -> Result<WrappingKey, DsError> {
        let raw = key_bytes(self.keyformat, &input.material)?;
        match (&self.pbkdf, self.keyformat) {
            (Some(p), KeyFormat::Passphrase) => {
                // A damaged or hostile record must not make a load take
                // gigabytes or hours.
                if p.memory_kib > 4 << 20 || p.iterations > 64 || !(1..=16).contains(&p.parallelism)
                {
                    return Err(DsError::Corrupt(format!(
                        "key record {}: Argon2id parameters out of range ({} KiB, {} passes, {} \
                         lanes)",
                        self.id, p.memory_kib, p.iterations, p.parallelism
                    )));
                }
                let salt = unhex(&p.salt)
                    .map_err(|e| DsError::Corrupt(format!("key record {}: salt: {e}", self.id)))?;
                let params = Pbkdf {
                    memory_kib: p.memory_kib,
                    iterations: p.iterations,
                    parallelism: p.parallelism,
                };
                WrappingKey::from_passphrase(&raw, &salt, params).map_err(block_err)
            }
            (None, KeyFormat::Raw | KeyFormat::Hex) => {
                WrappingKey::from_raw(&raw).map_err(block_err)
            }
            _ => Err(DsError::Corrupt(format!(
                "key record {}: a {} key with{} passphrase parameters",
                self.id,
                self.keyformat.name(),
                if self.pbkdf.is_some() { "" } else { "out" }
            ))),
        }
    }

    /// Unwraps the master key with `input`.
    pub(crate) fn unwrap(&self, input: &KeyInput) -> Result<KeySet, DsError> {
        if input.format != self.keyformat {
            return Err(DsError::Invalid(format!(
                "this key is a {}, not a {}",
                self.keyformat.name(),
                input.format.name()
            )));
        }
        let wrapping = self.wrapping(input)?;
        let wrapped = unhex(&self.wrapped)
            .map_err(|e| DsError::Corrupt(format!("key record {}: {e}", self.id)))?;
        KeySet::unwrap(self.cipher()?, &wrapping, &self.aad()?, &wrapped).map_err(block_err)
    }

    /// A record for `ks` wrapped under `input`, with a fresh salt.
    fn wrapped_for(
        id: u64,
        guid: u64,
        root: u64,
        ks: &KeySet,
        input: &KeyInput,
    ) -> Result<KeyRec, DsError> {
        check_keylocation(&input.location)?;
        let pbkdf = match input.format {
            KeyFormat::Passphrase => {
                let mut salt = [0u8; 16];
                random_bytes(&mut salt).map_err(block_err)?;
                Some(PbkdfRec {
                    memory_kib: input.pbkdf.memory_kib,
                    iterations: input.pbkdf.iterations,
                    parallelism: input.pbkdf.parallelism,
                    salt: hex(&salt),
                })
            }
            KeyFormat::Raw | KeyFormat::Hex => None,
        };
        let mut rec = KeyRec {
            id,
            guid,
            cipher: ks.cipher().name().to_string(),
            keyformat: input.format,
            keylocation: input.location.clone(),
            pbkdf,
            wrapped: String::new(),
            root,
            created_unix: now_unix(),
        };
        let w = rec.wrapping(input)?;
        rec.wrapped = hex(&ks.wrap(&w, &rec.aad()?).map_err(block_err)?);
        Ok(rec)
    }
}

/// The key bytes `material` gives in `format` (checked: a passphrase of 8
/// to 512 bytes, 32 raw bytes, or 64 hex digits).
fn key_bytes(format: KeyFormat, material: &[u8]) -> Result<Zeroizing<Vec<u8>>, DsError> {
    match format {
        KeyFormat::Passphrase => {
            if !(8..=512).contains(&material.len()) {
                return Err(DsError::Invalid(format!(
                    "a passphrase must be 8 to 512 bytes long, not {}",
                    material.len()
                )));
            }
            Ok(Zeroizing::new(material.to_vec()))
        }
        KeyFormat::Raw => {
            if material.len() != 32 {
                return Err(DsError::Invalid(format!(
                    "a raw key must be exactly 32 bytes, not {}",
                    material.len()
                )));
            }
            Ok(Zeroizing::new(material.to_vec()))
        }
        KeyFormat::Hex => {
            let text = std::str::from_utf8(material).unwrap_or("").trim();
            let bytes = unhex(text).ok().filter(|b| b.len() == 32).ok_or_else(|| {
                DsError::Invalid("a hex key must be exactly 64 hexadecimal digits".into())
            })?;
            Ok(Zeroizing::new(bytes))
        }
    }
}

/// Whether a dataset is encrypted and its key usable, as `keystatus` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// Not encrypted.
    None,
    /// Encrypted, key loaded.
    Available,
    /// Encrypted, key not loaded: locked.
    Unavailable,
}

impl KeyStatus {
    /// The property value users see.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Available => "available",
            Self::Unavailable => "unavailable",
        }
    }
}

/// What `list` and `get` say of a dataset's encryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encryption {
    /// The cipher (`aes-256-gcm`, ...).
    pub cipher: String,
    /// Whether the key is loaded.
    pub status: KeyStatus,
    /// The encryption root's name.
    pub root: String,
    /// How the key is given.
    pub keyformat: KeyFormat,
    /// Where the key comes from.
    pub keylocation: String,
}

impl Dir {
    /// The loaded key of dataset `id`: None when it is not encrypted,
    /// [`DsError::Locked`] when its key is not loaded.
    pub(crate) fn keyset(&self, id: u64) -> Result<Option<Arc<KeySet>>, DsError> {
        let Some(kid) = self.rec(id)?.key else {
            return Ok(None);
        };
        match self.unlocked.get(&kid) {
            Some(k) => Ok(Some(k.clone())),
            None => Err(self.locked_error(id, kid)),
        }
    }

    fn locked_error(&self, id: u64, kid: u64) -> DsError {
        let name = self
            .recs
            .get(&id)
            .map(|r| r.name.clone())
            .unwrap_or_default();
        let root = self.key_root_name(kid);
        DsError::Locked(format!(
            "'{name}' is encrypted and its key is not loaded: run `tarn key load {root}`"
        ))
    }

    /// The name of the encryption root of key `kid`.
    pub(crate) fn key_root_name(&self, kid: u64) -> String {
        self.keys
            .get(&kid)
            .and_then(|k| self.recs.get(&k.root))
            .map(|r| r.name.clone())
            .unwrap_or_else(|| format!("<key {kid}>"))
    }

    /// True when dataset `id` is encrypted.
    pub(crate) fn is_encrypted(&self, id: u64) -> bool {
        self.recs.get(&id).is_some_and(|r| r.key.is_some())
    }

    /// What `list` and `get` say of dataset `id`'s encryption.
    pub(crate) fn encryption(&self, id: u64) -> Option<Encryption> {
        let kid = self.recs.get(&id)?.key?;
        let k = self.keys.get(&kid)?;
        Some(Encryption {
            cipher: k.cipher.clone(),
            status: if self.unlocked.contains_key(&kid) {
                KeyStatus::Available
            } else {
                KeyStatus::Unavailable
            },
            root: self.key_root_name(kid),
            keyformat: k.keyformat,
            keylocation: k.keylocation.clone(),
        })
    }

    /// A new key record for encryption root `root`, with a new master key
    /// wrapped under `input`: its id. `ks` is the master key (made by the
    /// caller, outside every lock, with the wrapping).
    pub(crate) fn add_key(&mut self, rec: KeyRec, ks: KeySet) -> u64 {
        let id = rec.id;
        self.keys.insert(id, rec);
        self.unlocked.insert(id, Arc::new(ks));
        self.dirty_keys.insert(id);
        id
    }

    /// Drops key records no dataset names any more, and gives a record
    /// whose root is gone the oldest dataset that still uses it.
    pub(crate) fn tidy_keys(&mut self) {
        let mut users: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for r in self.recs.values() {
            if let Some(k) = r.key {
                if !r.is_snapshot() {
                    users.entry(k).or_default().push(r.id);
                } else {
                    users.entry(k).or_default();
                }
            }
        }
        let ids: Vec<u64> = self.keys.keys().copied().collect();
        for kid in ids {
            match users.get(&kid) {
                None => {
                    self.keys.remove(&kid);
                    self.unlocked.remove(&kid);
                    self.deleted_keys.insert(kid);
                    self.dirty_keys.remove(&kid);
                }
                Some(heads) => {
                    let root_ok = self
                        .keys
                        .get(&kid)
                        .is_some_and(|k| self.recs.get(&k.root).is_some_and(|r| !r.is_snapshot()));
                    if !root_ok {
                        if let (Some(new), Some(k)) = (heads.iter().min(), self.keys.get_mut(&kid))
                        {
                            k.root = *new;
                            self.dirty_keys.insert(kid);
                        }
                    }
                }
            }
        }
    }
}

/// A new encryption root's key: a random master key of `cipher`, wrapped
/// under `input` (Argon2id runs here: call it outside every lock). The
/// record's id is filled in by the caller.
pub(crate) fn new_key(cipher: Cipher, input: &KeyInput) -> Result<(KeyRec, KeySet), DsError> {
    let ks = KeySet::generate(cipher).map_err(block_err)?;
    let mut g = [0u8; 8];
    random_bytes(&mut g).map_err(block_err)?;
    let guid = u64::from_le_bytes(g).max(1);
    let rec = KeyRec::wrapped_for(0, guid, 0, &ks, input)?;
    Ok((rec, ks))
}

/// The key record of `name`'s encryption root, and that root's name;
/// `name` must be the root itself.
fn root_key(dir: &Dir, name: &str) -> Result<KeyRec, DsError> {
    let id = dir.id_of(name)?;
    let r = dir.rec(id)?;
    let Some(kid) = r.key else {
        return Err(DsError::Invalid(format!("'{name}' is not encrypted")));
    };
    let k = dir.keys.get(&kid).ok_or_else(|| {
        DsError::Corrupt(format!("'{name}' names key record {kid}, which is missing"))
    })?;
    if k.root != id {
        return Err(DsError::Invalid(format!(
            "'{name}' inherits its key from '{}': name the encryption root",
            dir.key_root_name(kid)
        )));
    }
    Ok(k.clone())
}

/// The encryption roots of the pool (or those at or below `under`):
/// (name, whether the key is loaded, keyformat, keylocation).
pub fn encryption_roots(
    pool: &Pool,
    under: Option<&str>,
) -> Result<Vec<(String, bool, KeyFormat, String)>, DsError> {
    with_dir(pool, |dir, _| {
        if let Some(u) = under {
            dir.id_of(u)?;
        }
        let mut out: Vec<(String, bool, KeyFormat, String)> = dir
            .keys
            .values()
            .filter_map(|k| {
                let name = dir.recs.get(&k.root)?.name.clone();
                let inside = under.is_none_or(|u| name == u || name.starts_with(&format!("{u}/")));
                inside.then(|| {
                    (
                        name,
                        dir.unlocked.contains_key(&k.id),
                        k.keyformat,
                        k.keylocation.clone(),
                    )
                })
            })
            .collect();
        out.sort();
        Ok(out)
    })
}

/// The key format and location of encryption root `name` (what loading
/// its key needs).
pub fn key_location(pool: &Pool, name: &str) -> Result<(KeyFormat, String, bool), DsError> {
    with_dir(pool, |dir, _| {
        let k = root_key(dir, name)?;
        Ok((
            k.keyformat,
            k.keylocation.clone(),
            dir.unlocked.contains_key(&k.id),
        ))
    })
}

/// Loads the key of encryption root `name` (see the module docs): a wrong
/// key is refused, a loaded one is an error too ([`DsError::Busy`]), and
/// the intent log records parked for its datasets are replayed. Returns
/// how many were.
pub fn load_key(pool: &Pool, name: &str, input: &KeyInput) -> Result<usize, DsError> {
    load_key_with(pool, name, input, false)
}

/// [`load_key`]; with `discard_log`, parked intent log records that can
/// no longer be read are dropped (and reported as damage) instead of
/// failing the load.
pub fn load_key_with(
    pool: &Pool,
    name: &str,
    input: &KeyInput,
    discard_log: bool,
) -> Result<usize, DsError> {
    let rec = with_dir(pool, |dir, _| {
        let k = root_key(dir, name)?;
        if dir.unlocked.contains_key(&k.id) {
            return Err(DsError::Busy(format!(
                "the key of '{name}' is already loaded"
            )));
        }
        Ok(k)
    })?;
    let ks = Arc::new(rec.unwrap(input)?);
    let r = with_excl(pool, |dsl, cx| {
        {
            let mut dir = dsl.dir();
            if dir.keys.get(&rec.id) != Some(&rec) {
                return Err(DsError::Busy(format!(
                    "the key of '{name}' changed while it was being loaded; try again"
                )));
            }
            if dir.unlocked.contains_key(&rec.id) {
                return Err(DsError::Busy(format!(
                    "the key of '{name}' is already loaded"
                )));
            }
            dir.unlocked.insert(rec.id, ks.clone());
        }
        let r = crate::zil::replay_parked(dsl, cx, rec.id, discard_log);
        if r.is_err() {
            // Not loaded after all: its datasets stay locked, and their
            // parked records stay parked.
            dsl.dir().unlocked.remove(&rec.id);
        }
        r
    });
    if r.is_err() {
        // The replay read (and the cache kept) plaintext of datasets that
        // stay locked: it goes as at an unload.
        forget_key(pool, ks);
    }
    r
}

/// Makes a key that is no longer in the directory useless: reads in flight
/// with it fail and cache nothing, and once they let go of it the cache
/// drops the plaintext it holds (the cache does not know datasets: the
/// pool's blocks go, and come back on demand).
fn forget_key(pool: &Pool, ks: Arc<KeySet>) {
    ks.revoke();
    let t0 = std::time::Instant::now();
    while Arc::strong_count(&ks) > 1 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    pool.evict_cache();
}

/// Unloads the key of encryption root `name`: its datasets are locked
/// until it is loaded again. The caller makes sure nothing uses them
/// (mounts, shares, open volumes).
pub fn unload_key(pool: &Pool, name: &str) -> Result<(), DsError> {
    let ks = with_excl(pool, |dsl, _cx| {
        let mut dir = dsl.dir();
        let k = root_key(&dir, name)?;
        let Some(ks) = dir.unlocked.remove(&k.id) else {
            return Err(DsError::Busy(format!("the key of '{name}' is not loaded")));
        };
        Ok(ks)
    })?;
    // Reads still in flight (a block found before the unload, read-ahead)
    // fail from now on.
    forget_key(pool, ks);
    Ok(())
}

/// Rewraps the master key of encryption root `name` (its key loaded)
/// under a new key: new format, location, passphrase or raw key. No data
/// is rewritten.
pub fn change_key(pool: &Pool, name: &str, input: &KeyInput) -> Result<(), DsError> {
    let (rec, ks) = with_dir(pool, |dir, _| {
        let k = root_key(dir, name)?;
        let ks = dir.unlocked.get(&k.id).cloned().ok_or_else(|| {
            DsError::Locked(format!("load the key of '{name}' before changing it"))
        })?;
        Ok((k, ks))
    })?;
    let new = KeyRec::wrapped_for(rec.id, rec.guid, rec.root, &ks, input)?;
    with_excl(pool, |dsl, _cx| {
        let mut dir = dsl.dir();
        if dir.keys.get(&rec.id) != Some(&rec) {
            return Err(DsError::Busy(format!(
                "the key of '{name}' changed meanwhile; try again"
            )));
        }
        dir.keys.insert(rec.id, new);
        dir.dirty_keys.insert(rec.id);
        Ok(())
    })
}

/// Sets where the key of encryption root `name` comes from.
pub fn set_keylocation(pool: &Pool, name: &str, location: &str) -> Result<(), DsError> {
    check_keylocation(location)?;
    with_excl(pool, |dsl, _cx| {
        let mut dir = dsl.dir();
        let mut k = root_key(&dir, name)?;
        k.keylocation = location.to_string();
        let id = k.id;
        dir.keys.insert(id, k);
        dir.dirty_keys.insert(id);
        Ok(())
    })
}

/// Reads the key records from the meta tree (at attach).
pub(crate) fn load_records(dir: &mut Dir, cx: &mut tarn_pool::SyncCx<'_>) -> Result<(), DsError> {
    let lo = vec![P_KEY];
    let hi = vec![P_KEY + 1];
    let mut start = std::ops::Bound::Included(lo);
    loop {
        let page = cx.meta_range(
            start.as_ref().map(Vec::as_slice),
            std::ops::Bound::Excluded(&hi),
            256,
        )?;
        let Some(last) = page.last().map(|(k, _)| k.clone()) else {
            return Ok(());
        };
        for (k, v) in page {
            let rec: KeyRec = serde_json::from_slice(&v)
                .map_err(|e| DsError::Corrupt(format!("key record {}: {e}", hex(&k))))?;
            rec.cipher()?;
            dir.next_id = dir.next_id.max(rec.id + 1);
            dir.keys.insert(rec.id, rec);
        }
        start = std::ops::Bound::Excluded(last);
    }
}

/// The key records the sync writes (step 5 of the dataset layer's sync).
pub(crate) fn sync_records(
    dir: &mut Dir,
    cx: &mut tarn_pool::SyncCx<'_>,
) -> Result<(), tarn_pool::PoolError> {
    for id in std::mem::take(&mut dir.deleted_keys) {
        cx.meta_delete(&key_key(id))?;
    }
    for id in std::mem::take(&mut dir.dirty_keys) {
        if let Some(k) = dir.keys.get(&id) {
            let json =
                serde_json::to_vec(k).map_err(|e| tarn_pool::PoolError::Internal(e.to_string()))?;
            // The pool says it holds sealed data (docs/format.md,
            // `features`): a tarn that does not know encryption refuses to
            // import it rather than read ciphertext as data and write
            // plaintext beside it.
            cx.enable_feature(ENCRYPTION_FEATURE);
            cx.meta_put(&key_key(id), &json)?;
        }
    }
    Ok(())
}

/// The pool format feature of pools with (or once with) encrypted
/// datasets.
pub(crate) const ENCRYPTION_FEATURE: &str = "encryption";

//! Encryption of blocks, tree values and intent log records.
//!
//! # Theory
//!
//! An encrypted dataset has a random 256-bit *master key*. It never
//! reaches a device in the clear: the dataset layer stores it *wrapped*
//! (AES-256-GCM) under a *wrapping key* that comes from the user's
//! passphrase (Argon2id, with its parameters and salt stored beside it) or
//! is the user's raw key. Changing the passphrase rewraps the master key
//! and rewrites no data.
//!
//! Nothing is encrypted with the master key itself. Every sealed message
//! names an 8-byte *salt*, and its key is HKDF-SHA256(master key, salt,
//! purpose), so each salt selects its own key ([`KeySet`] keeps the ones
//! in use). A loaded key picks a fresh random salt per purpose and uses it
//! for at most [`SALT_USES`] messages before picking another; within one
//! salt the 96-bit nonces are a counter after a random 32-bit prefix, so
//! no nonce repeats under one key, and no key ever sees more messages than
//! AES-GCM's bounds allow. The three purposes (data blocks, tree values,
//! intent log records) derive different keys from the same salt.
//!
//! **Blocks.** A data block is compressed, then sealed in place (the
//! ciphertext is as long as the plaintext, so `psize` is unchanged), then
//! checksummed: the checksum in the block pointer covers the ciphertext,
//! so scrub, resilver and self-heal verify and repair blocks with no key.
//! The salt, the nonce and the 16-byte authentication tag live in the
//! block pointer (`salt`, `iv`, `mac`; flag bit 0). The associated data
//! binds the type, compression and logical size of the pointer, so a
//! pointer whose fields were changed does not decrypt.
//!
//! **Values.** A plain value of an encrypted dataset's tree is stored
//! sealed: `salt ‖ nonce ‖ ciphertext ‖ tag`, with the value's tree key as
//! associated data, so a value moved to another key does not open.
//!
//! **Records.** An intent log record of an encrypted dataset is sealed as
//! a whole the same way, with whatever of its header stays readable as
//! associated data.
//!
//! Opening anything whose tag does not verify is an error, never bytes:
//! the caller treats it like a checksum failure (damage), and with the
//! wrong master key every open fails, so a wrong key cannot pass for data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ring::aead::{self, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::bp::{BlockPtr, BlockType, CompressAlg};
use crate::BlockError;

/// Bytes of a master key and of a wrapping key.
pub const KEY_LEN: usize = 32;
/// Bytes a sealed value or record adds: salt, nonce and tag.
pub const SEALED_OVERHEAD: usize = SALT_LEN + NONCE_LEN + TAG_LEN;
/// Bytes of a wrapped master key: nonce, ciphertext, tag.
pub const WRAPPED_LEN: usize = NONCE_LEN + KEY_LEN + TAG_LEN;
/// Messages sealed under one salt before a key picks another.
pub const SALT_USES: u64 = 1 << 20;

const SALT_LEN: usize = 8;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Derived keys kept per loaded key (salts of blocks being read).
const DERIVED_MAX: usize = 256;

/// The cipher of an encrypted dataset; the value is stored on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Cipher {
    /// AES-256 in GCM mode: the default (`encryption=on`).
    #[default]
    Aes256Gcm = 1,
    /// AES-128 in GCM mode.
    Aes128Gcm = 2,
    /// ChaCha20-Poly1305: fast without AES instructions.
    ChaCha20Poly1305 = 3,
}

impl Cipher {
    /// Decodes the stored value.
    pub fn from_u8(v: u8) -> Result<Self, BlockError> {
        match v {
            1 => Ok(Self::Aes256Gcm),
            2 => Ok(Self::Aes128Gcm),
            3 => Ok(Self::ChaCha20Poly1305),
            _ => Err(BlockError::Format(format!("unknown cipher {v}"))),
        }
    }

    /// Parses the `encryption` property (`on` is aes-256-gcm).
    pub fn parse(s: &str) -> Result<Self, BlockError> {
        match s {
            "on" | "aes-256-gcm" => Ok(Self::Aes256Gcm),
            "aes-128-gcm" => Ok(Self::Aes128Gcm),
            "chacha20-poly1305" => Ok(Self::ChaCha20Poly1305),
            _ => Err(BlockError::InvalidProperty(format!(
                "encryption={s}: expected on, aes-256-gcm, aes-128-gcm or chacha20-poly1305"
            ))),
        }
    }

    /// The property value users see.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Aes256Gcm => "aes-256-gcm",
            Self::Aes128Gcm => "aes-128-gcm",
            Self::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }

    fn algorithm(&self) -> &'static aead::Algorithm {
        match self {
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::Aes128Gcm => &aead::AES_128_GCM,
            Self::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// What a derived key seals; each purpose has its own keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Purpose {
    Block = 0,
    Value = 1,
    Record = 2,
}

impl Purpose {
    fn info(&self) -> &'static [u8] {
        match self {
            Purpose::Block => b"tarn-v1 block key",
            Purpose::Value => b"tarn-v1 value key",
            Purpose::Record => b"tarn-v1 log record key",
        }
    }
}

/// Salt, nonce and tag of one sealed block, for its block pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seal {
    /// Selects the derived key.
    pub salt: [u8; SALT_LEN],
    /// The nonce.
    pub iv: [u8; NONCE_LEN],
    /// The authentication tag.
    pub mac: [u8; TAG_LEN],
}

/// The salt in use for one purpose, its key, and how far its nonce
/// counter went.
struct Current {
    salt: [u8; SALT_LEN],
    prefix: [u8; 4],
    uses: u64,
    key: Arc<LessSafeKey>,
}

/// Keys derived from the master key, by purpose and salt.
type Derived = HashMap<(Purpose, [u8; SALT_LEN]), Arc<LessSafeKey>>;

/// What sealing one message takes: its salt, its nonce, and the key.
type Next = ([u8; SALT_LEN], [u8; NONCE_LEN], Arc<LessSafeKey>);

/// A loaded master key: seals and opens everything of the datasets that
/// share it (see the module docs). Cheap to share between threads.
pub struct KeySet {
    cipher: Cipher,
    master: Zeroizing<[u8; KEY_LEN]>,
    rng: SystemRandom,
    current: Mutex<[Option<Current>; 3]>,
    derived: Mutex<Derived>,
    /// Set when the key is unloaded: nothing is opened or sealed with it
    /// any more, so no plaintext enters a cache after the unload.
    revoked: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySet({}, <secret>)", self.cipher.name())
    }
}

/// The output length of a derived key, for HKDF.
struct KeyLen(usize);

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        self.0
    }
}

fn crypto_error(what: &str) -> BlockError {
    BlockError::Crypto(what.to_string())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn block_aad(btype: BlockType, compress: CompressAlg, lsize: u32) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..10].copy_from_slice(b"tarn-block");
    a[10] = btype as u8;
    a[11] = compress as u8;
    a[12..16].copy_from_slice(&lsize.to_le_bytes());
    a
}

impl KeySet {
    /// A key set around `master`.
    pub fn new(cipher: Cipher, master: [u8; KEY_LEN]) -> Self {
        KeySet {
            cipher,
            master: Zeroizing::new(master),
            rng: SystemRandom::new(),
            current: Mutex::new([None, None, None]),
            derived: Mutex::new(HashMap::new()),
            revoked: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Stops every use of this key (it was unloaded): opening and sealing
    /// fail from now on.
    pub fn revoke(&self) {
        self.revoked
            .store(true, std::sync::atomic::Ordering::SeqCst);
        lock(&self.derived).clear();
        *lock(&self.current) = [None, None, None];
    }

    /// True once [`KeySet::revoke`] ran.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A new random master key.
    pub fn generate(cipher: Cipher) -> Result<Self, BlockError> {
        let mut m = Zeroizing::new([0u8; KEY_LEN]);
        SystemRandom::new()
            .fill(&mut m[..])
            .map_err(|_| crypto_error("no random bytes for a master key"))?;
        Ok(Self::new(cipher, *m))
    }

    /// The cipher.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    fn derive(
        &self,
        purpose: Purpose,
        salt: &[u8; SALT_LEN],
    ) -> Result<Arc<LessSafeKey>, BlockError> {
        if self.is_revoked() {
            return Err(BlockError::KeyUnavailable(
                "a block or value of a key that was unloaded".into(),
            ));
        }
        if let Some(k) = lock(&self.derived).get(&(purpose, *salt)) {
            return Ok(k.clone());
        }
        let alg = self.cipher.algorithm();
        let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
        let n = alg.key_len();
        hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
            .extract(&self.master[..])
            .expand(&[purpose.info()], KeyLen(n))
            .and_then(|okm| okm.fill(&mut bytes[..n]))
            .map_err(|_| crypto_error("key derivation failed"))?;
        let key = UnboundKey::new(alg, &bytes[..n])
            .map_err(|_| crypto_error("derived key rejected by the cipher"))?;
        let key = Arc::new(LessSafeKey::new(key));
        let mut d = lock(&self.derived);
        if d.len() >= DERIVED_MAX {
            d.clear();
        }
        d.insert((purpose, *salt), key.clone());
        Ok(key)
    }

    /// The salt, key and a fresh nonce to seal one message of `purpose`.
    fn next(&self, purpose: Purpose) -> Result<Next, BlockError> {
        let mut cur = lock(&self.current);
        if self.is_revoked() {
            return Err(BlockError::KeyUnavailable(
                "sealing with a key that was unloaded".into(),
            ));
        }
        let slot = &mut cur[purpose as usize];
        if slot.as_ref().is_none_or(|c| c.uses >= SALT_USES) {
            let mut salt = [0u8; SALT_LEN];
            let mut prefix = [0u8; 4];
            self.rng
                .fill(&mut salt)
                .and_then(|()| self.rng.fill(&mut prefix))
                .map_err(|_| crypto_error("no random bytes for a salt"))?;
            let key = self.derive(purpose, &salt)?;
            *slot = Some(Current {
                salt,
                prefix,
                uses: 0,
                key,
            });
        }
        let Some(c) = slot.as_mut() else {
            return Err(crypto_error("no current salt"));
        };
        let mut iv = [0u8; NONCE_LEN];
        iv[..4].copy_from_slice(&c.prefix);
        iv[4..].copy_from_slice(&c.uses.to_le_bytes());
        c.uses += 1;
        Ok((c.salt, iv, c.key.clone()))
    }

    /// Seals a block's stored bytes in place (after compression, before
    /// the checksum); the result goes into its pointer.
    pub fn seal_block(
        &self,
        btype: BlockType,
        compress: CompressAlg,
        lsize: u32,
        data: &mut [u8],
    ) -> Result<Seal, BlockError> {
        let (salt, iv, key) = self.next(Purpose::Block)?;
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(iv),
                Aad::from(block_aad(btype, compress, lsize)),
                data,
            )
            .map_err(|_| crypto_error("sealing a block failed"))?;
        let mut mac = [0u8; TAG_LEN];
        mac.copy_from_slice(tag.as_ref());
        Ok(Seal { salt, iv, mac })
    }

    /// Opens the verified stored bytes of an encrypted block in place.
    pub fn open_block(&self, bp: &BlockPtr, data: &mut [u8]) -> Result<(), BlockError> {
        let key = self.derive(Purpose::Block, &bp.salt)?;
        key.open_in_place_separate_tag(
            Nonce::assume_unique_for_key(bp.iv),
            Aad::from(block_aad(bp.btype, bp.compress, bp.lsize)),
            Tag::from(bp.mac),
            data,
            0..,
        )
        .map(|_| ())
        .map_err(|_| {
            BlockError::Crypto(format!(
                "{} does not decrypt: wrong key, or damaged beyond its checksum",
                crate::pipeline::describe(bp)
            ))
        })
    }

    fn seal(&self, purpose: Purpose, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, BlockError> {
        let (salt, iv, key) = self.next(purpose)?;
        let mut out = Vec::with_capacity(plain.len() + SEALED_OVERHEAD);
        out.extend_from_slice(&salt);
        out.extend_from_slice(&iv);
        out.extend_from_slice(plain);
        let body = SALT_LEN + NONCE_LEN;
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(iv),
                Aad::from(aad),
                &mut out[body..],
            )
            .map_err(|_| crypto_error("sealing failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    fn open(&self, purpose: Purpose, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, BlockError> {
        if sealed.len() < SEALED_OVERHEAD {
            return Err(crypto_error("sealed bytes shorter than their header"));
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&sealed[..SALT_LEN]);
        let mut iv = [0u8; NONCE_LEN];
        iv.copy_from_slice(&sealed[SALT_LEN..SALT_LEN + NONCE_LEN]);
        let key = self.derive(purpose, &salt)?;
        let mut body = sealed[SALT_LEN + NONCE_LEN..].to_vec();
        let n = key
            .open_in_place(Nonce::assume_unique_for_key(iv), Aad::from(aad), &mut body)
            .map_err(|_| crypto_error("does not decrypt: wrong key, or damaged"))?
            .len();
        body.truncate(n);
        Ok(body)
    }

    /// Seals a tree value stored under `key`.
    pub fn seal_value(&self, key: &[u8], plain: &[u8]) -> Result<Vec<u8>, BlockError> {
        self.seal(Purpose::Value, &value_aad(key), plain)
    }

    /// Opens a sealed tree value found under `key`.
    pub fn open_value(&self, key: &[u8], sealed: &[u8]) -> Result<Vec<u8>, BlockError> {
        self.open(Purpose::Value, &value_aad(key), sealed)
            .map_err(|e| BlockError::Crypto(format!("the value at key {key:02x?}: {e}")))
    }

    /// Seals an intent log record; `aad` is what stays readable of it.
    pub fn seal_record(&self, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, BlockError> {
        self.seal(Purpose::Record, aad, plain)
    }

    /// Opens a sealed intent log record.
    pub fn open_record(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, BlockError> {
        self.open(Purpose::Record, aad, sealed)
            .map_err(|e| BlockError::Crypto(format!("an intent log record: {e}")))
    }

    /// The master key wrapped under `wrapping` (see [`WrappingKey`]);
    /// `aad` binds it to its record (cipher, key guid).
    pub fn wrap(&self, wrapping: &WrappingKey, aad: &[u8]) -> Result<Vec<u8>, BlockError> {
        let mut iv = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut iv)
            .map_err(|_| crypto_error("no random bytes for a nonce"))?;
        let key = wrapping.key()?;
        let mut out = Vec::with_capacity(WRAPPED_LEN);
        out.extend_from_slice(&iv);
        out.extend_from_slice(&self.master[..]);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(iv),
                Aad::from(aad),
                &mut out[NONCE_LEN..],
            )
            .map_err(|_| crypto_error("wrapping the master key failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Unwraps a master key: fails with [`BlockError::WrongKey`] when
    /// `wrapping` is not the key it was wrapped with.
    pub fn unwrap(
        cipher: Cipher,
        wrapping: &WrappingKey,
        aad: &[u8],
        wrapped: &[u8],
    ) -> Result<KeySet, BlockError> {
        if wrapped.len() != WRAPPED_LEN {
            return Err(BlockError::Format(format!(
                "a wrapped key of {} bytes, not {WRAPPED_LEN}",
                wrapped.len()
            )));
        }
        let mut iv = [0u8; NONCE_LEN];
        iv.copy_from_slice(&wrapped[..NONCE_LEN]);
        let mut body = Zeroizing::new(wrapped[NONCE_LEN..].to_vec());
        let key = wrapping.key()?;
        let master = key
            .open_in_place(Nonce::assume_unique_for_key(iv), Aad::from(aad), &mut body)
            .map_err(|_| BlockError::WrongKey)?;
        let mut m = [0u8; KEY_LEN];
        m.copy_from_slice(master);
        let ks = KeySet::new(cipher, m);
        zeroize::Zeroize::zeroize(&mut m);
        Ok(ks)
    }
}

fn value_aad(key: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(10 + key.len());
    a.extend_from_slice(b"tarn-value");
    a.extend_from_slice(key);
    a
}

/// Argon2id parameters for turning a passphrase into a wrapping key;
/// stored with the wrapped key so later loads derive the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pbkdf {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for Pbkdf {
    /// 64 MiB, 3 passes, 1 lane (a few hundred milliseconds per load).
    fn default() -> Self {
        Pbkdf {
            memory_kib: 64 << 10,
            iterations: 3,
            parallelism: 1,
        }
    }
}

/// The key that wraps a master key: from a passphrase through Argon2id, or
/// the user's raw 32 bytes.
pub struct WrappingKey(Zeroizing<[u8; KEY_LEN]>);

impl std::fmt::Debug for WrappingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WrappingKey(<secret>)")
    }
}

impl WrappingKey {
    /// Derives the wrapping key from a passphrase.
    pub fn from_passphrase(pass: &[u8], salt: &[u8], p: Pbkdf) -> Result<Self, BlockError> {
        let params = argon2::Params::new(p.memory_kib, p.iterations, p.parallelism, Some(KEY_LEN))
            .map_err(|e| BlockError::InvalidProperty(format!("argon2 parameters: {e}")))?;
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = Zeroizing::new([0u8; KEY_LEN]);
        a.hash_password_into(pass, salt, &mut out[..])
            .map_err(|e| BlockError::InvalidProperty(format!("argon2: {e}")))?;
        Ok(WrappingKey(out))
    }

    /// A raw key of exactly 32 bytes.
    pub fn from_raw(raw: &[u8]) -> Result<Self, BlockError> {
        let bytes: [u8; KEY_LEN] = raw.try_into().map_err(|_| {
            BlockError::InvalidProperty(format!(
                "a raw key must be exactly {KEY_LEN} bytes, got {}",
                raw.len()
            ))
        })?;
        Ok(WrappingKey(Zeroizing::new(bytes)))
    }

    fn key(&self) -> Result<LessSafeKey, BlockError> {
        UnboundKey::new(&aead::AES_256_GCM, &self.0[..])
            .map(LessSafeKey::new)
            .map_err(|_| crypto_error("wrapping key rejected"))
    }
}

/// Fills `out` with random bytes (salts of key records).
pub fn random_bytes(out: &mut [u8]) -> Result<(), BlockError> {
    SystemRandom::new()
        .fill(out)
        .map_err(|_| crypto_error("no random bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ks(c: Cipher) -> KeySet {
        KeySet::new(c, [7u8; KEY_LEN])
    }

    fn bp_for(s: &Seal, btype: BlockType, compress: CompressAlg, lsize: u32) -> BlockPtr {
        BlockPtr {
            btype,
            compress,
            lsize,
            psize: lsize,
            birth: 1,
            flags: 1,
            salt: s.salt,
            iv: s.iv,
            mac: s.mac,
            ..Default::default()
        }
    }

    const CIPHERS: [Cipher; 3] = [
        Cipher::Aes256Gcm,
        Cipher::Aes128Gcm,
        Cipher::ChaCha20Poly1305,
    ];

    proptest! {
        #[test]
        fn blocks_round_trip_and_refuse_any_changed_bit(
            data in proptest::collection::vec(any::<u8>(), 1..4096),
            flip in any::<usize>(),
            c in 0usize..3,
        ) {
            let k = ks(CIPHERS[c]);
            let mut buf = data.clone();
            let s = k.seal_block(BlockType::Data, CompressAlg::Off, data.len() as u32, &mut buf).unwrap();
            prop_assert_ne!(&buf, &data);
            let bp = bp_for(&s, BlockType::Data, CompressAlg::Off, data.len() as u32);
            let mut good = buf.clone();
            k.open_block(&bp, &mut good).unwrap();
            prop_assert_eq!(&good, &data);
            // A flipped bit of the ciphertext, the tag, or a bound field.
            let mut bad = buf.clone();
            let bit = flip % (bad.len() * 8);
            bad[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(k.open_block(&bp, &mut bad).is_err());
            let mut tag = bp;
            tag.mac[flip % TAG_LEN] ^= 1;
            prop_assert!(k.open_block(&tag, &mut buf.clone()).is_err());
            let mut lsize = bp;
            lsize.lsize ^= 1 << (flip % 20);
            prop_assert!(k.open_block(&lsize, &mut buf.clone()).is_err());
            let mut kind = bp;
            kind.btype = BlockType::TreeNode;
            prop_assert!(k.open_block(&kind, &mut buf.clone()).is_err());
            // Another master key opens nothing.
            let other = KeySet::new(CIPHERS[c], [8u8; KEY_LEN]);
            prop_assert!(other.open_block(&bp, &mut buf.clone()).is_err());
        }

        #[test]
        fn values_are_bound_to_their_key(
            v in proptest::collection::vec(any::<u8>(), 0..300),
            key in proptest::collection::vec(any::<u8>(), 1..40),
            other in proptest::collection::vec(any::<u8>(), 1..40),
        ) {
            let k = ks(Cipher::Aes256Gcm);
            let s = k.seal_value(&key, &v).unwrap();
            prop_assert_eq!(s.len(), v.len() + SEALED_OVERHEAD);
            prop_assert_eq!(k.open_value(&key, &s).unwrap(), v);
            if other != key {
                prop_assert!(k.open_value(&other, &s).is_err());
            }
            for cut in 0..s.len().min(SEALED_OVERHEAD + 2) {
                prop_assert!(k.open_value(&key, &s[..cut]).is_err() || cut == s.len());
            }
        }

        #[test]
        fn open_never_panics_on_garbage(
            b in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let k = ks(Cipher::ChaCha20Poly1305);
            prop_assert!(k.open_value(b"k", &b).is_err());
            prop_assert!(k.open_record(b"", &b).is_err());
            prop_assert!(KeySet::unwrap(
                Cipher::Aes256Gcm,
                &WrappingKey::from_raw(&[1; 32]).unwrap(),
                b"",
                &b
            )
            .is_err());
        }
    }

    #[test]
    fn nonces_never_repeat_and_salts_rotate() {
        let k = ks(Cipher::Aes256Gcm);
        let mut seen = std::collections::HashSet::new();
        let mut salts = std::collections::HashSet::new();
        for _ in 0..1000 {
            let s = k.seal_value(b"k", b"v").unwrap();
            assert!(seen.insert(s[..20].to_vec()), "a salt and nonce repeated");
            salts.insert(s[..8].to_vec());
        }
        assert_eq!(
            salts.len(),
            1,
            "one salt for the first {SALT_USES} messages"
        );
        // Past SALT_USES the salt changes (forced here by a full counter).
        lock(&k.current)[Purpose::Value as usize]
            .as_mut()
            .unwrap()
            .uses = SALT_USES;
        let s = k.seal_value(b"k", b"v").unwrap();
        assert!(!salts.contains(&s[..8]), "the salt did not rotate");
        assert_eq!(k.open_value(b"k", &s).unwrap(), b"v");
    }

    #[test]
    fn purposes_use_different_keys() {
        let k = ks(Cipher::Aes256Gcm);
        let v = k.seal_value(b"", b"same bytes").unwrap();
        assert!(k.open_record(&value_aad(b""), &v).is_err());
    }

    #[test]
    fn wrapping_needs_the_same_passphrase_and_record() {
        let fast = Pbkdf {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        };
        let k = KeySet::generate(Cipher::Aes128Gcm).unwrap();
        let w = WrappingKey::from_passphrase(b"correct horse", b"saltsalt", fast).unwrap();
        let wrapped = k.wrap(&w, b"rec").unwrap();
        assert_eq!(wrapped.len(), WRAPPED_LEN);
        let again = WrappingKey::from_passphrase(b"correct horse", b"saltsalt", fast).unwrap();
        let back = KeySet::unwrap(Cipher::Aes128Gcm, &again, b"rec", &wrapped).unwrap();
        let mut data = b"hello".to_vec();
        let s = k
            .seal_block(BlockType::Data, CompressAlg::Off, 5, &mut data)
            .unwrap();
        back.open_block(&bp_for(&s, BlockType::Data, CompressAlg::Off, 5), &mut data)
            .unwrap();
        assert_eq!(data, b"hello");
        let wrong = WrappingKey::from_passphrase(b"correct horsf", b"saltsalt", fast).unwrap();
        assert!(matches!(
            KeySet::unwrap(Cipher::Aes128Gcm, &wrong, b"rec", &wrapped),
            Err(BlockError::WrongKey)
        ));
        assert!(matches!(
            KeySet::unwrap(Cipher::Aes128Gcm, &again, b"other", &wrapped),
            Err(BlockError::WrongKey)
        ));
        assert!(WrappingKey::from_raw(&[0; 31]).is_err());
    }

    #[test]
    fn cipher_names_round_trip() {
        for c in CIPHERS {
            assert_eq!(Cipher::parse(c.name()).unwrap(), c);
            assert_eq!(Cipher::from_u8(c as u8).unwrap(), c);
        }
        assert_eq!(Cipher::parse("on").unwrap(), Cipher::Aes256Gcm);
        assert!(Cipher::parse("rot13").is_err());
        assert!(Cipher::from_u8(0).is_err());
    }
}

//! Configuration records: small values that belong to the pool (users,
//! shares), so they move with the disks.

use tarn_pool::Pool;

use crate::dsl::{with_dir, with_dir_excl};
use crate::record::prefix_end;
use crate::DsError;

pub(crate) const P_CONFIG: u8 = b'C';

pub(crate) fn config_key(kind: &str, name: &str) -> Vec<u8> {
    let mut k = vec![P_CONFIG];
    k.extend_from_slice(kind.as_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn check_config_name(kind: &str, name: &str) -> Result<(), DsError> {
    let ok_kind =
        !kind.is_empty() && kind.len() <= 32 && kind.bytes().all(|b| b.is_ascii_lowercase());
    let ok_name = !name.is_empty() && name.len() <= 128 && !name.contains('\0');
    if ok_kind && ok_name {
        Ok(())
    } else {
        Err(DsError::Invalid(format!("invalid {kind} name '{name}'")))
    }
}

/// Stores a small configuration record that belongs to the pool (users,
/// shares: what should move with the disks), durable on return.
pub fn config_put(pool: &Pool, kind: &str, name: &str, value: &[u8]) -> Result<(), DsError> {
    check_config_name(kind, name)?;
    if value.len() > 4096 {
        return Err(DsError::Invalid(format!(
            "{kind} '{name}': record too large"
        )));
    }
    with_dir_excl(pool, |dir, cx| {
        let key = config_key(kind, name);
        cx.meta_put(&key, value)?;
        dir.config.insert(key, value.to_vec());
        Ok(())
    })
}

/// Removes a configuration record; false if there was none. Durable on
/// return.
pub fn config_delete(pool: &Pool, kind: &str, name: &str) -> Result<bool, DsError> {
    check_config_name(kind, name)?;
    with_dir_excl(pool, |dir, cx| {
        let key = config_key(kind, name);
        let had = cx.meta_delete(&key)?;
        dir.config.remove(&key);
        Ok(had)
    })
}

/// Every configuration record of a kind, by name.
pub fn config_list(pool: &Pool, kind: &str) -> Result<Vec<(String, Vec<u8>)>, DsError> {
    check_config_name(kind, "x")?;
    with_dir(pool, |dir, _| {
        let lo = config_key(kind, "");
        let hi = prefix_end(&lo);
        Ok(dir
            .config
            .range(lo..hi)
            .map(|(k, v)| {
                let name = String::from_utf8_lossy(&k[kind.len() + 2..]).into_owned();
                (name, v.clone())
            })
            .collect())
    })
}

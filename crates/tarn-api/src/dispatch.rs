//! The one dispatch table: which method calls which [`Backend`] function.
//!
//! It decodes the parameters (typed structs that refuse unknown fields),
//! runs the checks that need no pool, calls the backend and encodes the
//! result. It knows nothing of sockets, so any transport (the daemon's Unix
//! socket today, HTTPS later) reaches the same methods the same way.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::backend::Backend;
use crate::error::ApiError;
use crate::params::*;
use crate::pool::{CreateRequest, ImportRequest};
use crate::wire::{Request, Response};
use crate::API_VERSION;

/// Decodes `params` for `method`; `null` reads as `{}`. Anything else
/// that is not an object is refused: serde would read an array as the
/// struct's fields in order, past every check that looks for a field by
/// its name (`roles::https_refusal`, the web's own-user rules).
fn params<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, ApiError> {
    let params = match params {
        Value::Null => Value::Object(Default::default()),
        Value::Object(_) => params,
        _ => {
            return Err(ApiError::invalid(format!(
                "bad params for {method}: params are a JSON object of named fields"
            )))
        }
    };
    serde_json::from_value(params)
        .map_err(|e| ApiError::invalid(format!("bad params for {method}: {e}")))
}

/// Encodes a result.
fn reply<T: Serialize>(value: T) -> Result<Value, ApiError> {
    serde_json::to_value(value)
        .map_err(|e| ApiError::internal(format!("the daemon could not encode its answer: {e}")))
}

/// Answers one request line's worth: runs [`call`] and wraps the outcome
/// with the request's id.
pub fn dispatch(backend: &dyn Backend, request: Request) -> Response {
    let outcome = call(backend, &request.method, request.params);
    Response::new(request.id, outcome)
}

/// Runs one API call against `backend`. Transport-independent: the socket
/// daemon and any other front end call this with the decoded method and
/// params. `daemon.stop` belongs to the transport and is refused here.
pub fn call(backend: &dyn Backend, method: &str, p: Value) -> Result<Value, ApiError> {
    use crate::method as m;
    match method {
        m::DAEMON_PING => {
            let NoParams {} = params(method, p)?;
            reply(PingResult {
                version: env!("CARGO_PKG_VERSION").to_string(),
                pid: std::process::id(),
                api_version: API_VERSION.to_string(),
            })
        }
        m::POOL_CREATE => {
            let req: CreateRequest = params(method, p)?;
            req.validate()?;
            reply(backend.pool_create(&req)?)
        }
        m::POOL_IMPORT => {
            let req: ImportRequest = params(method, p)?;
            req.validate()?;
            reply(backend.pool_import(&req)?)
        }
        m::POOL_EXPORT => {
            let ForceParams { name, force } = params(method, p)?;
            reply(backend.pool_export(&name, force)?)
        }
        m::POOL_DESTROY => {
            let ForceParams { name, force } = params(method, p)?;
            reply(backend.pool_destroy(&name, force)?)
        }
        m::POOL_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.pool_list()?)
        }
        m::POOL_STATUS => {
            let OptionalNameParams { name } = params(method, p)?;
            reply(backend.pool_status(name.as_deref())?)
        }
        m::POOL_SCRUB => {
            let ScrubParams { name, action } = params(method, p)?;
            reply(backend.pool_scrub(&name, action)?)
        }
        m::POOL_OFFLINE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_offline(&name, &device)?)
        }
        m::POOL_ONLINE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_online(&name, &device)?)
        }
        m::POOL_REPLACE => {
            let ReplaceParams {
                name,
                old,
                new,
                force,
            } = params(method, p)?;
            reply(backend.pool_replace(&name, &old, &new, force)?)
        }
        m::POOL_ADD_LOG => {
            let AddLogParams { name, vdev, force } = params(method, p)?;
            reply(backend.pool_add_log(&name, &vdev, force)?)
        }
        m::POOL_REMOVE => {
            let DeviceParams { name, device } = params(method, p)?;
            reply(backend.pool_remove(&name, &device)?)
        }
        m::POOL_CLEAR => {
            let ClearParams { name, device } = params(method, p)?;
            reply(backend.pool_clear(&name, device.as_deref())?)
        }
        m::POOL_IOSTAT => {
            let OptionalNameParams { name } = params(method, p)?;
            reply(backend.pool_iostat(name.as_deref())?)
        }
        m::POOL_SYNC => {
            let NameParams { name } = params(method, p)?;
            let txg = backend.pool_sync(&name)?;
            reply(SyncResult { txg })
        }
        m::OBJECT_WRITE => {
            let ObjectWriteParams {
                pool,
                object,
                from_path,
                offset,
                sync,
            } = params(method, p)?;
            reply(backend.object_write(&pool, &object, &from_path, offset, sync)?)
        }
        m::OBJECT_READ => {
            let ObjectReadParams {
                pool,
                object,
                to_path,
            } = params(method, p)?;
            reply(backend.object_read(&pool, &object, &to_path)?)
        }
        m::OBJECT_LIST => {
            let PoolParams { pool } = params(method, p)?;
            reply(backend.object_list(&pool)?)
        }
        m::OBJECT_DELETE => {
            let ObjectParams { pool, object } = params(method, p)?;
            reply(backend.object_delete(&pool, &object)?)
        }
        m::DATASET_CREATE => {
            let p: DatasetCreateParams = params(method, p)?;
            reply(backend.dataset_create(&p)?)
        }
        m::KEY_LOAD => {
            let p: KeyLoadParams = params(method, p)?;
            reply(backend.key_load(&p)?)
        }
        m::KEY_UNLOAD => {
            let NameParams { name } = params(method, p)?;
            reply(backend.key_unload(&name)?)
        }
        m::KEY_CHANGE => {
            let p: KeyChangeParams = params(method, p)?;
            reply(backend.key_change(&p)?)
        }
        m::DATASET_RECEIVE_ABORT => {
            let NameParams { name } = params(method, p)?;
            reply(backend.dataset_receive_abort(&name)?)
        }
        m::DATASET_SEND | m::DATASET_RECEIVE => Err(ApiError::invalid(format!(
            "{method} streams its data: call it on a transport that carries a body (the \
             admin socket does)"
        ))),
        m::REPLICATION_TOKEN_ADD => {
            let TokenAddParams { label, dataset } = params(method, p)?;
            reply(backend.replication_token_add(&label, &dataset)?)
        }
        m::REPLICATION_TOKEN_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.replication_token_list()?)
        }
        m::REPLICATION_TOKEN_DEL => {
            let NameParams { name } = params(method, p)?;
            reply(backend.replication_token_del(&name)?)
        }
        m::REPLICATION_INFO => {
            let NoParams {} = params(method, p)?;
            reply(backend.replication_info()?)
        }
        m::REPLICATION_HELLO => Err(ApiError::invalid(
            "replication.hello opens a session on the replication port, not here",
        )),
        m::KEY_LIST => {
            let OptionalNameParams { name } = params(method, p)?;
            reply(backend.key_list(name.as_deref())?)
        }
        m::VOLUME_CREATE => {
            let p: VolumeCreateParams = params(method, p)?;
            reply(backend.volume_create(&p)?)
        }
        m::VOLUME_RESIZE => {
            let VolumeResizeParams { name, size, force } = params(method, p)?;
            reply(backend.volume_resize(&name, &size, force)?)
        }
        m::DATASET_DESTROY => {
            let DatasetDestroyParams { name, recursive } = params(method, p)?;
            reply(backend.dataset_destroy(&name, recursive)?)
        }
        m::DATASET_LIST => {
            let DatasetListParams { snapshots } = params(method, p)?;
            reply(backend.dataset_list(snapshots)?)
        }
        m::DATASET_GET => {
            let DatasetGetParams { name, properties } = params(method, p)?;
            reply(backend.dataset_get(&name, &properties)?)
        }
        m::DATASET_SET => {
            let DatasetSetParams {
                name,
                property,
                value,
            } = params(method, p)?;
            reply(backend.dataset_set(&name, &property, &value)?)
        }
        m::DATASET_INHERIT => {
            let DatasetInheritParams { name, property } = params(method, p)?;
            reply(backend.dataset_inherit(&name, &property)?)
        }
        m::DATASET_RENAME => {
            let DatasetRenameParams { name, new_name } = params(method, p)?;
            reply(backend.dataset_rename(&name, &new_name)?)
        }
        m::DATASET_SNAPSHOT => {
            let SnapshotParams { names, recursive } = params(method, p)?;
            if names.is_empty() {
                return Err(ApiError::invalid("name at least one snapshot (fs@name)"));
            }
            reply(backend.dataset_snapshot(&names, recursive)?)
        }
        m::DATASET_HOLD | m::DATASET_RELEASE => {
            let HoldParams {
                tag,
                snapshots,
                recursive,
            } = params(method, p)?;
            if snapshots.is_empty() {
                return Err(ApiError::invalid("name at least one snapshot (fs@name)"));
            }
            if method == m::DATASET_HOLD {
                reply(backend.dataset_hold(&tag, &snapshots, recursive)?)
            } else {
                reply(backend.dataset_release(&tag, &snapshots, recursive)?)
            }
        }
        m::DATASET_HOLDS => {
            let HoldsParams {
                snapshots,
                recursive,
            } = params(method, p)?;
            reply(backend.dataset_holds(&snapshots, recursive)?)
        }
        m::DATASET_ROLLBACK => {
            let RollbackParams {
                snapshot,
                destroy_newer,
            } = params(method, p)?;
            reply(backend.dataset_rollback(&snapshot, destroy_newer)?)
        }
        m::DATASET_CLONE => {
            let CloneParams {
                snapshot,
                name,
                properties,
            } = params(method, p)?;
            reply(backend.dataset_clone(&snapshot, &name, &properties)?)
        }
        m::DATASET_PROMOTE => {
            let NameParams { name } = params(method, p)?;
            reply(backend.dataset_promote(&name)?)
        }
        m::POOL_INJECT => {
            let InjectParams {
                name,
                device,
                fault,
            } = params(method, p)?;
            if let Some(f) = &fault {
                if !(0.0..=1.0).contains(&f.probability) {
                    return Err(ApiError::invalid("probability must be between 0 and 1"));
                }
            }
            reply(backend.pool_inject(&name, &device, fault)?)
        }
        m::USER_ADD => {
            let UserAddParams {
                pool,
                name,
                password,
                uid,
                gid,
                smb,
            } = params(method, p)?;
            reply(backend.user_add(pool.as_deref(), &name, &password, uid, gid, smb)?)
        }
        m::USER_DEL => {
            let UserParams { pool, name } = params(method, p)?;
            reply(backend.user_del(pool.as_deref(), &name)?)
        }
        m::USER_PASSWD => {
            let UserPasswdParams {
                pool,
                name,
                password,
                smb,
            } = params(method, p)?;
            reply(backend.user_passwd(pool.as_deref(), &name, &password, smb)?)
        }
        m::USER_CHAP => {
            let UserChapParams { pool, name, secret } = params(method, p)?;
            reply(backend.user_chap(pool.as_deref(), &name, secret.as_deref())?)
        }
        m::USER_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.user_list()?)
        }
        m::USER_ADMIN => {
            let UserAdminParams { pool, name, admin } = params(method, p)?;
            reply(backend.user_admin(pool.as_deref(), &name, admin)?)
        }
        m::API_TOKEN_ADD => {
            let ApiTokenAddParams { label, user, pool } = params(method, p)?;
            crate::access::check_name("token", &label)?;
            reply(backend.api_token_add(&label, &user, pool.as_deref())?)
        }
        m::API_TOKEN_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.api_token_list()?)
        }
        m::STATS_HISTORY => {
            let HistoryParams { day } = params(method, p)?;
            reply(backend.stats_history(day)?)
        }
        m::LINK_CREATE => {
            let p: LinkCreateParams = params(method, p)?;
            reply(backend.link_create(&p)?)
        }
        m::LINK_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.link_list()?)
        }
        m::LINK_REVOKE => {
            let NameParams { name } = params(method, p)?;
            reply(backend.link_revoke(&name)?)
        }
        m::API_TOKEN_DEL => {
            let NameParams { name } = params(method, p)?;
            reply(backend.api_token_del(&name)?)
        }
        m::SHARE_ADD => {
            let ShareAddParams { share, owner } = params(method, p)?;
            reply(backend.share_add(&share, owner.as_deref())?)
        }
        m::SHARE_DEL => {
            let ShareDelParams { pool, name } = params(method, p)?;
            reply(backend.share_del(pool.as_deref(), &name)?)
        }
        m::SHARE_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.share_list()?)
        }
        m::DISK_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.disk_list()?)
        }
        m::DISK_HEALTH => {
            let DiskParams { device, .. } = params(method, p)?;
            reply(backend.disk_health(&device)?)
        }
        m::DISK_SELFTEST => {
            let DiskParams { device, test } = params(method, p)?;
            reply(backend.disk_selftest(&device, test.as_deref().unwrap_or("short"))?)
        }
        m::EVENTS_LIST => {
            let EventsParams { after, limit } = params(method, p)?;
            reply(backend.events_list(after, limit.unwrap_or(100).min(10_000))?)
        }
        m::ALERT_ADD => {
            let AlertAddParams { alert } = params(method, p)?;
            crate::events::check_alert(&alert)?;
            reply(backend.alert_add(&alert)?)
        }
        m::ALERT_DEL => {
            let AlertParams { name } = params(method, p)?;
            reply(backend.alert_del(&name)?)
        }
        m::ALERT_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.alert_list()?)
        }
        m::ALERT_TEST => {
            let AlertTestParams { name } = params(method, p)?;
            reply(backend.alert_test(name.as_deref())?)
        }
        m::SCHEDULE_ADD => {
            let ScheduleAddParams { schedule } = params(method, p)?;
            crate::schedule::check_schedule(&schedule)?;
            reply(backend.schedule_add(&schedule)?)
        }
        m::SCHEDULE_DEL => {
            let ScheduleParams { pool, name } = params(method, p)?;
            reply(backend.schedule_del(pool.as_deref(), &name)?)
        }
        m::SCHEDULE_LIST => {
            let NoParams {} = params(method, p)?;
            reply(backend.schedule_list()?)
        }
        m::SCHEDULE_RUN => {
            let ScheduleParams { pool, name } = params(method, p)?;
            reply(backend.schedule_run(pool.as_deref(), &name)?)
        }
        m::DATASET_MOUNT => {
            let MountParams {
                name,
                mountpoint,
                allow_other,
                read_only,
            } = params(method, p)?;
            reply(backend.dataset_mount(&name, mountpoint.as_deref(), allow_other, read_only)?)
        }
        m::DATASET_UNMOUNT => {
            let UnmountParams { name } = params(method, p)?;
            reply(backend.dataset_unmount(&name)?)
        }
        m::DATASET_MOUNTS => {
            let NoParams {} = params(method, p)?;
            reply(backend.dataset_mounts()?)
        }
        m::DAEMON_STATS => {
            let NoParams {} = params(method, p)?;
            reply(backend.daemon_stats()?)
        }
        m::DAEMON_STOP => Err(ApiError::invalid(
            "daemon.stop is only served on the daemon's admin socket; use `tarn daemon stop`",
        )),
        other => Err(ApiError::invalid(format!(
            "unknown method {other:?}; known methods: {}",
            m::ALL.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_are_an_object_of_named_fields() {
        let as_object: Result<LinkCreateParams, _> =
            params("link.create", json!({"share": "a", "owner": "t/bob"}));
        assert_eq!(as_object.map(|p| p.owner), Ok(Some("t/bob".to_string())));
        let none: Result<NoParams, _> = params("daemon.ping", Value::Null);
        assert!(none.is_ok());
        // serde alone would read these as the fields in order.
        for p in [
            json!(["a", "", true, null, null, "t/bob"]),
            json!("a"),
            json!(7),
        ] {
            let r: Result<LinkCreateParams, _> = params("link.create", p.clone());
            assert!(r.is_err(), "{p} was read as params");
        }
    }
}

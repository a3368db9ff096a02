//! A placeholder backend that refuses every call, used until the storage
//! engine is plugged into the daemon.

use crate::api::ApiError;
use crate::backend::{Backend, CreateRequest, ImportRequest, ImportResult, ObjectInfo, ScrubAction};
use crate::status::{IostatEntry, PoolListEntry, PoolStatus, ScanStatus};

/// Answers `internal` to everything; `shutdown` does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unwired;

fn not_wired<T>() -> Result<T, ApiError> {
    Err(ApiError::internal(
        "not wired: this build's daemon has no storage engine behind its API",
    ))
}

impl Backend for Unwired {
    fn pool_create(&self, _: &CreateRequest) -> Result<PoolStatus, ApiError> {
        not_wired()
    }
    fn pool_import(&self, _: &ImportRequest) -> Result<ImportResult, ApiError> {
        not_wired()
    }
    fn pool_export(&self, _: &str, _: bool) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_destroy(&self, _: &str, _: bool) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_list(&self) -> Result<Vec<PoolListEntry>, ApiError> {
        not_wired()
    }
    fn pool_status(&self, _: Option<&str>) -> Result<Vec<PoolStatus>, ApiError> {
        not_wired()
    }
    fn pool_scrub(&self, _: &str, _: ScrubAction) -> Result<Option<ScanStatus>, ApiError> {
        not_wired()
    }
    fn pool_offline(&self, _: &str, _: &str) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_online(&self, _: &str, _: &str) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_replace(&self, _: &str, _: &str, _: &str, _: bool) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_clear(&self, _: &str, _: Option<&str>) -> Result<(), ApiError> {
        not_wired()
    }
    fn pool_iostat(&self, _: Option<&str>) -> Result<Vec<IostatEntry>, ApiError> {
        not_wired()
    }
    fn pool_sync(&self, _: &str) -> Result<u64, ApiError> {
        not_wired()
    }
    fn object_write(&self, _: &str, _: &str, _: &str, _: u64, _: bool) -> Result<ObjectInfo, ApiError> {
        not_wired()
    }
    fn object_read(&self, _: &str, _: &str, _: &str) -> Result<ObjectInfo, ApiError> {
        not_wired()
    }
    fn object_list(&self, _: &str) -> Result<Vec<ObjectInfo>, ApiError> {
        not_wired()
    }
    fn object_delete(&self, _: &str, _: &str) -> Result<(), ApiError> {
        not_wired()
    }
    fn shutdown(&self) {}
}

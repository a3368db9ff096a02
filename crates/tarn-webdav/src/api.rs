//! The object-safe seam between the WebDAV layer and a [`tarn_fs::Fs`].
//!
//! [`tarn_fs::Fs`] is generic over its backend; a share stores an
//! `Arc<dyn FsApi>` so one server can serve datasets and test backends side
//! by side and the DAV code is compiled once. Every method blocks (it takes
//! the pool lock): the DAV layer only calls them from blocking threads.

pub use tarn_fs::DynFs as FsApi;

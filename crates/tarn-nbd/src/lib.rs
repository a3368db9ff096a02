//! tarn-nbd: an NBD (Network Block Device) server for block devices
//! behind [`tarn_vol::Device`], such as tarn's volumes.
//!
//! The protocol is the one documented as `doc/proto.md` in the NBD
//! project. This first part holds its vocabulary ([`proto`]) and the
//! decoders of what a client sends: options during the handshake
//! ([`option`]) and requests during transmission ([`request`]). They are
//! pure functions that never panic and never allocate from a count the
//! client sent.

#![warn(missing_docs)]

pub mod option;
pub mod proto;
pub mod request;

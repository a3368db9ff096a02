//! tarn-iscsi: an iSCSI target (RFC 7143) for block devices behind
//! [`tarn_vol::Device`], such as tarn's volumes.

#![warn(missing_docs)]

pub mod digest;
pub mod pdu;

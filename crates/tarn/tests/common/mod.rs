//! What the tests of the built `tarn` binary share: a real daemon process
//! and the CLI run against it, and the rounds and seed of the crash loops.
//! What every crate's tests share (seeded data, what a test needs of the
//! machine, real clients, sockets) comes from `tarn_testkit`.

#![allow(dead_code)]

pub mod browser;
pub mod clients;
pub mod iscsi;
pub mod minio;
pub mod nbd;
pub mod process;
pub mod seeded;

//! Persistent reservations (SPC-4 PERSISTENT RESERVE IN/OUT).

/// The persistent reservation state of one logical unit.
#[derive(Debug, Default)]
pub struct Reservations {}

//! An in-memory [`Device`] for protocol tests and as the model that
//! [`crate::Volume`]'s property tests compare against.

use std::sync::Mutex;

use crate::{check_range, Device, Extent, VolError};

/// A device held in memory: bytes plus which blocks are stored. A block
/// whose bytes are all zero is a hole, as on a real volume.
#[derive(Debug)]
pub struct MemDevice {
    block: u32,
    read_only: bool,
    bytes: Mutex<Vec<u8>>,
    /// Flushes so far, so a test can check that a client sent one.
    flushes: std::sync::atomic::AtomicU64,
    /// Set by [`MemDevice::close`]: what a closed volume reports.
    closed: std::sync::atomic::AtomicBool,
}

impl MemDevice {
    /// A zeroed device of `size` bytes (a multiple of `block`).
    pub fn new(size: u64, block: u32) -> Self {
        MemDevice {
            block,
            read_only: false,
            bytes: Mutex::new(vec![0; size as usize]),
            flushes: Default::default(),
            closed: Default::default(),
        }
    }

    /// Marks the device closed ([`Device::is_open`] false), as a volume
    /// is while it is rolled back or destroyed; its bytes stay usable.
    pub fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Grows or shrinks the device to `size` bytes (new bytes zero), as
    /// a volume resize does under its sessions.
    pub fn resize(&self, size: u64) {
        self.lock().resize(size as usize, 0);
    }

    /// The same device, refusing writes.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Flushes received so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A copy of the whole device.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writable(&self) -> Result<(), VolError> {
        if self.read_only {
            return Err(VolError::ReadOnly("the device is read-only".into()));
        }
        Ok(())
    }
}

impl Device for MemDevice {
    fn size(&self) -> u64 {
        self.lock().len() as u64
    }

    fn try_size(&self) -> Option<u64> {
        Some(self.size())
    }

    fn block_size(&self) -> u32 {
        self.block
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn is_open(&self) -> bool {
        !self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn read_data(&self, off: u64, len: u32) -> Result<crate::ReadData, VolError> {
        let b = self.lock();
        check_range(b.len() as u64, off, len as u64)?;
        Ok(b[off as usize..off as usize + len as usize].to_vec().into())
    }

    /// Everything is in memory: every read is answered here (so front
    /// ends' tests over a `MemDevice` take their from-memory path).
    fn read_cached(&self, off: u64, len: u32) -> Option<Result<crate::ReadData, VolError>> {
        Some(self.read_data(off, len))
    }

    fn write(&self, off: u64, data: &[u8], _fua: bool) -> Result<(), VolError> {
        self.writable()?;
        let mut b = self.lock();
        check_range(b.len() as u64, off, data.len() as u64)?;
        b[off as usize..off as usize + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn flush(&self) -> Result<(), VolError> {
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn trim(&self, off: u64, len: u64) -> Result<(), VolError> {
        self.write_zeroes(off, len, false)
    }

    fn write_zeroes(&self, off: u64, len: u64, _fua: bool) -> Result<(), VolError> {
        self.writable()?;
        let mut b = self.lock();
        check_range(b.len() as u64, off, len)?;
        b[off as usize..(off + len) as usize].fill(0);
        Ok(())
    }

    fn extents(&self, off: u64, len: u64) -> Result<Vec<Extent>, VolError> {
        let b = self.lock();
        check_range(b.len() as u64, off, len)?;
        let bs = self.block as u64;
        let mut out: Vec<Extent> = Vec::new();
        let mut at = off;
        while at < off + len {
            let blk = at / bs;
            let end = ((blk + 1) * bs).min(off + len);
            let s = (blk * bs) as usize;
            let hole = b[s..s + bs as usize].iter().all(|&x| x == 0);
            match out.last_mut() {
                Some(e) if e.hole == hole => e.len += end - at,
                _ => out.push(Extent {
                    len: end - at,
                    hole,
                }),
            }
            at = end;
        }
        Ok(out)
    }
}

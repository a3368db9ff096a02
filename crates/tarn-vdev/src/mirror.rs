//! Single-device and mirror vdevs: every child holds the whole block at the
//! same offset (`DATA_START + vdev offset`). A single device is a mirror of
//! one, so it detects damage but has nothing to repair it from.

use crate::label::DATA_START;
use crate::top::{Handle, ScrubOutcome, TopVdev};
use crate::VdevError;

impl TopVdev {
    /// Children usable for reading, complete ones first so a resilvering
    /// child is only read when nothing else verifies.
    pub(crate) fn read_order(&self) -> Vec<Handle> {
        let mut hs: Vec<Handle> = (0..self.width()).filter_map(|i| self.handle(i)).collect();
        hs.sort_by_key(|h| h.resilvering);
        hs
    }

    /// No copy verified: says what each child did, by path, so an I/O
    /// failure is not mistaken for damaged data or the other way round.
    /// `bad` holds the children tried, with whether they could be read.
    fn unrecoverable(&self, offset: u64, psize: usize, bad: &[(usize, bool)]) -> VdevError {
        let what: Vec<String> = (0..self.width())
            .map(|idx| {
                let (path, out_of_service) = self.child_word(idx);
                let did = match bad.iter().find(|(i, _)| *i == idx) {
                    Some((_, true)) => "bad checksum",
                    Some((_, false)) => "read error",
                    None => out_of_service.unwrap_or("not read"),
                };
                format!("{path}: {did}")
            })
            .collect();
        VdevError::Unrecoverable {
            offset,
            psize,
            reason: format!("no copy verifies ({})", what.join(", ")),
        }
    }
    pub(crate) fn mirror_read(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, VdevError> {
        let at = DATA_START + offset;
        let len = self.alloc_size(psize as u64) as usize;
        let order = self.read_order();
        let mut buf = vec![0u8; len];
        // The children that failed, each with whether it could be read.
        let mut bad: Vec<(&Handle, bool)> = Vec::new();
        for h in &order {
            if !self.child_read(h, &mut buf, at) {
                bad.push((h, false));
                continue;
            }
            if verify(&buf[..psize]) {
                for (b, _) in bad {
                    self.heal(b, &buf, at);
                }
                buf.truncate(psize);
                return Ok(buf);
            }
            self.note_cksum(h);
            bad.push((h, true));
        }
        let tried: Vec<(usize, bool)> = bad.iter().map(|(h, read)| (h.idx, *read)).collect();
        Err(self.unrecoverable(offset, psize, &tried))
    }

    pub(crate) fn mirror_scrub(
        &self,
        offset: u64,
        psize: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<ScrubOutcome, VdevError> {
        let at = DATA_START + offset;
        let len = self.alloc_size(psize as u64) as usize;
        let order = self.read_order();
        let mut buf = vec![0u8; len];
        let mut good: Option<Vec<u8>> = None;
        let mut bad: Vec<(&Handle, bool)> = Vec::new();
        for h in &order {
            if !self.child_read(h, &mut buf, at) {
                bad.push((h, false));
            } else if verify(&buf[..psize]) {
                if good.is_none() {
                    good = Some(std::mem::replace(&mut buf, vec![0u8; len]));
                }
            } else {
                self.note_cksum(h);
                bad.push((h, true));
            }
        }
        let Some(good) = good else {
            let tried: Vec<(usize, bool)> = bad.iter().map(|(h, read)| (h.idx, *read)).collect();
            return Err(self.unrecoverable(offset, psize, &tried));
        };
        let mut out = ScrubOutcome::default();
        for (h, _) in bad {
            out.repaired_bytes += self.heal(h, &good, at);
            out.bad_children.push(h.idx);
        }
        out.bad_children.sort_unstable();
        Ok(out)
    }
}

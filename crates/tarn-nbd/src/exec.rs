//! Carrying out a command on the device and encoding its reply.
//!
//! [`run`] is the only place the server calls [`Device`]; it runs on a
//! blocking thread (device calls may wait for disks). [`encode`] turns
//! its outcome into wire bytes: simple replies without structured
//! replies; with them, a read is one content chunk (`OFFSET_HOLE` when
//! the data is all zeros, else `OFFSET_DATA`) ending the reply, block
//! status is one `BLOCK_STATUS` chunk, an error is one `ERROR` chunk
//! with the device's message, and other successes are simple replies
//! (the protocol allows either for commands without payload).
//!
//! Because a read reply is always exactly one content chunk, the server
//! can honour `NBD_CMD_FLAG_DF` for free and advertises it.

use tarn_vol::{Device, ReadData, VolError};

use crate::proto::{self, errno, reply};
use crate::request::Command;

/// Most extents in one block status reply. The spec allows up to 2^20;
/// 2^16 keeps a reply under 512 KiB and a query's work bounded (the
/// client asks again from where the reply stopped).
pub const MAX_STATUS_EXTENTS: usize = 1 << 16;

/// What a successful command returns.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    /// No data (writes, flush, trim, cache, write zeroes).
    Empty,
    /// The bytes read, as ranges of the blocks that hold them (shared with
    /// the block cache: the reply is written from them, not from a copy).
    Data(ReadData),
    /// `(length, flags)` descriptors of `base:allocation`.
    Status(Vec<(u32, u32)>),
}

/// A failed command: the reply's error value and a message for people.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    /// `NBD_E*`.
    pub errno: u32,
    /// The device's error, for the structured error chunk and the log.
    pub message: String,
}

/// A reply ready for the wire: a small head and, for reads, the data.
#[derive(Debug)]
pub struct Reply {
    /// Reply header (and chunk fields before the data).
    pub head: Vec<u8>,
    /// Data after the head (a read's bytes).
    pub data: Option<ReadData>,
}

/// Maps a device error to the protocol's error value. Writes past the end
/// are `ENOSPC` and reads past it `EINVAL`, as the protocol asks; a quota
/// is `ENOSPC` too (there is no `EDQUOT` on the wire).
pub fn errno_of(e: &VolError, writes: bool) -> u32 {
    match e {
        VolError::OutOfRange(_) if writes => errno::ENOSPC,
        VolError::OutOfRange(_) | VolError::Invalid(_) => errno::EINVAL,
        VolError::NoSpace(_) | VolError::Quota(_) => errno::ENOSPC,
        VolError::ReadOnly(_) => errno::EPERM,
        VolError::Damaged(_) | VolError::Other(_) => errno::EIO,
    }
}

/// [`run`] of a read the device answers from memory, on the network
/// thread (see [`Device::read_cached`]); None for any other command, or
/// when the read must go to a blocking thread.
pub fn run_cached(dev: &dyn Device, cmd: Command) -> Option<Result<Done, Failure>> {
    match cmd {
        Command::Read { len: 0, .. } => Some(Ok(Done::Data(ReadData::default()))),
        Command::Read { offset, len } => Some(read_done(dev.read_cached(offset, len)?, len)),
        _ => None,
    }
}

/// The outcome of a read of `len` bytes.
fn read_done(r: Result<ReadData, VolError>, len: u32) -> Result<Done, Failure> {
    let data = r.map_err(|e| fail(e, false))?;
    if data.len() != len as usize {
        return Err(Failure {
            errno: errno::EIO,
            message: format!(
                "the device returned {} bytes for a {len}-byte read",
                data.len()
            ),
        });
    }
    Ok(Done::Data(data))
}

fn fail(e: VolError, writes: bool) -> Failure {
    Failure {
        errno: errno_of(&e, writes),
        message: e.to_string(),
    }
}

/// Carries out `cmd` (already checked by [`crate::request::classify`]);
/// `payload` is a write's data. `NBD_CMD_FLAG_NO_HOLE` needs nothing: a
/// volume stores zeros as holes whatever the client asks, and a hole
/// never fails a later write for lack of room any more than a block of
/// zeros would (space is reserved per volume, not per block).
pub fn run(dev: &dyn Device, cmd: Command, payload: Option<Vec<u8>>) -> Result<Done, Failure> {
    match cmd {
        Command::Read { len: 0, .. } => Ok(Done::Data(ReadData::default())),
        Command::Read { offset, len } => read_done(dev.read_data(offset, len), len),
        Command::Write { len: 0, .. } => Ok(Done::Empty),
        Command::Write { offset, len, fua } => {
            let data = payload.unwrap_or_default();
            if data.len() != len as usize {
                return Err(Failure {
                    errno: errno::EIO,
                    message: "write payload missing".into(),
                });
            }
            dev.write(offset, &data, fua).map_err(|e| fail(e, true))?;
            Ok(Done::Empty)
        }
        Command::Flush => {
            dev.flush().map_err(|e| fail(e, true))?;
            Ok(Done::Empty)
        }
        Command::Trim { len: 0, .. } => Ok(Done::Empty),
        Command::Trim { offset, len, fua } => {
            dev.trim(offset, len as u64).map_err(|e| fail(e, true))?;
            if fua {
                dev.flush().map_err(|e| fail(e, true))?;
            }
            Ok(Done::Empty)
        }
        Command::Cache => Ok(Done::Empty),
        Command::WriteZeroes { len: 0, .. } => Ok(Done::Empty),
        Command::WriteZeroes {
            offset,
            len,
            fua,
            fast,
        } => {
            // Zeroing whole blocks deletes them; a block zeroed in part is
            // read and written again, as slow as a write: refused at once
            // under FAST_ZERO, as the protocol asks, so the client writes
            // the zeros itself (or zeroes whole blocks).
            let block = u64::from(dev.block_size().max(1));
            let end = offset.saturating_add(u64::from(len));
            if fast && (offset % block != 0 || (end % block != 0 && end != dev.size())) {
                return Err(Failure {
                    errno: errno::ENOTSUP,
                    message: "FAST_ZERO over part of a block".into(),
                });
            }
            dev.write_zeroes(offset, len as u64, fua)
                .map_err(|e| fail(e, true))?;
            Ok(Done::Empty)
        }
        Command::BlockStatus {
            offset,
            len,
            req_one,
            max_extents,
        } => block_status(dev, offset, len, req_one, max_extents as usize),
    }
}

/// `base:allocation` of `offset..offset + len`, or of a prefix of it: the
/// query covers at most [`MAX_STATUS_EXTENTS`] blocks, so neither the
/// device's answer nor the reply can grow with the length asked. Holes
/// are `HOLE | ZERO`, data is 0.
fn block_status(
    dev: &dyn Device,
    offset: u64,
    len: u32,
    req_one: bool,
    max_extents: usize,
) -> Result<Done, Failure> {
    let max_extents = max_extents.clamp(1, MAX_STATUS_EXTENTS);
    let block = dev.block_size().max(512) as u64;
    let span = (len as u64).min(block * MAX_STATUS_EXTENTS as u64);
    let extents = dev.extents(offset, span).map_err(|e| fail(e, false))?;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut left = span;
    for e in extents {
        // Never describe more than was asked, whatever the device says.
        let n = e.len.min(left);
        if n == 0 {
            continue;
        }
        left -= n;
        let flags = if e.hole {
            proto::STATE_HOLE | proto::STATE_ZERO
        } else {
            0
        };
        let full = out.len() == max_extents;
        match out.last_mut() {
            Some((l, f)) if *f == flags => *l += n as u32,
            _ if full => break,
            _ => out.push((n as u32, flags)),
        }
        if left == 0 {
            break;
        }
    }
    if out.is_empty() {
        // A device that reports nothing: status 0 ("allocated or
        // unknown") is always a true answer.
        out.push((span as u32, 0));
    }
    if req_one {
        out.truncate(1);
    }
    Ok(Done::Status(out))
}

/// True if every byte is zero (fast on data: stops at the first 4 KiB
/// that holds anything).
pub fn is_zero(b: &[u8]) -> bool {
    b.chunks(4096)
        .all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// The reply to a request with `cookie` and offset `offset`, whose
/// command read data (`read`) or not.
pub fn encode(
    cookie: u64,
    offset: u64,
    read: bool,
    structured: bool,
    outcome: Result<Done, Failure>,
) -> Reply {
    match outcome {
        Err(f) => error(cookie, structured, f.errno, &f.message),
        Ok(Done::Data(data)) if structured => {
            let mut head = Vec::with_capacity(40);
            if data.is_empty() {
                // A content chunk must describe at least one byte.
                proto::chunk_header(&mut head, reply::FLAG_DONE, reply::TYPE_NONE, cookie, 0);
                return Reply { head, data: None };
            }
            if data.slices().all(is_zero) {
                proto::chunk_header(
                    &mut head,
                    reply::FLAG_DONE,
                    reply::TYPE_OFFSET_HOLE,
                    cookie,
                    12,
                );
                head.extend_from_slice(&offset.to_be_bytes());
                head.extend_from_slice(&(data.len() as u32).to_be_bytes());
                return Reply { head, data: None };
            }
            proto::chunk_header(
                &mut head,
                reply::FLAG_DONE,
                reply::TYPE_OFFSET_DATA,
                cookie,
                8 + data.len() as u32,
            );
            head.extend_from_slice(&offset.to_be_bytes());
            Reply {
                head,
                data: Some(data),
            }
        }
        Ok(Done::Data(data)) => Reply {
            head: proto::simple_reply(0, cookie),
            data: (!data.is_empty()).then_some(data),
        },
        Ok(Done::Status(desc)) => {
            let mut head = Vec::with_capacity(24 + 8 * desc.len());
            let len = 4 + 8 * desc.len() as u32;
            proto::chunk_header(
                &mut head,
                reply::FLAG_DONE,
                reply::TYPE_BLOCK_STATUS,
                cookie,
                len,
            );
            head.extend_from_slice(&proto::BASE_ALLOCATION_ID.to_be_bytes());
            for (l, f) in desc {
                head.extend_from_slice(&l.to_be_bytes());
                head.extend_from_slice(&f.to_be_bytes());
            }
            Reply { head, data: None }
        }
        Ok(Done::Empty) if structured && read => {
            // Unreachable in practice (reads return Data), but a read
            // must never get a simple reply once structured replies are on.
            let mut head = Vec::with_capacity(20);
            proto::chunk_header(&mut head, reply::FLAG_DONE, reply::TYPE_NONE, cookie, 0);
            Reply { head, data: None }
        }
        Ok(Done::Empty) => Reply {
            head: proto::simple_reply(0, cookie),
            data: None,
        },
    }
}

/// An error reply: an `ERROR` chunk with structured replies, else a
/// simple reply carrying `errno`.
pub fn error(cookie: u64, structured: bool, errno: u32, msg: &str) -> Reply {
    let head = if structured {
        proto::error_chunk(errno, cookie, msg)
    } else {
        proto::simple_reply(errno, cookie)
    };
    Reply { head, data: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    fn dev() -> MemDevice {
        MemDevice::new(1 << 20, 4096)
    }

    /// A reply never holds more descriptors than the maximum payload
    /// allows (4 bytes of context id and 8 per descriptor), however many
    /// extents the range has; it is then a prefix of the range.
    #[test]
    fn block_status_stays_within_the_maximum_payload() {
        let d = dev();
        for i in (0..256u64).step_by(2) {
            d.write(i * 4096, &[1], false).unwrap();
        }
        let q = |max_extents| {
            run(
                &d,
                Command::BlockStatus {
                    offset: 0,
                    len: 1 << 20,
                    req_one: false,
                    max_extents,
                },
                None,
            )
        };
        let Ok(Done::Status(all)) = q(u32::MAX) else {
            panic!("no status");
        };
        assert_eq!(all.len(), 256);
        let Ok(Done::Status(few)) = q(5) else {
            panic!("no status");
        };
        assert_eq!(few, all[..5]);
    }

    #[test]
    fn errno_mapping() {
        let e = |x: VolError, w| errno_of(&x, w);
        assert_eq!(e(VolError::OutOfRange("".into()), true), errno::ENOSPC);
        assert_eq!(e(VolError::OutOfRange("".into()), false), errno::EINVAL);
        assert_eq!(e(VolError::NoSpace("".into()), true), errno::ENOSPC);
        assert_eq!(e(VolError::Quota("".into()), true), errno::ENOSPC);
        assert_eq!(e(VolError::ReadOnly("".into()), true), errno::EPERM);
        assert_eq!(e(VolError::Damaged("".into()), false), errno::EIO);
        assert_eq!(e(VolError::Other("".into()), false), errno::EIO);
        assert_eq!(e(VolError::Invalid("".into()), true), errno::EINVAL);
    }

    #[test]
    fn write_read_trim_zero_flush() {
        let d = dev();
        let w = Command::Write {
            offset: 8192,
            len: 4,
            fua: true,
        };
        assert_eq!(run(&d, w, Some(vec![1, 2, 3, 4])), Ok(Done::Empty));
        let r = Command::Read {
            offset: 8190,
            len: 8,
        };
        assert_eq!(
            run(&d, r, None),
            Ok(Done::Data(vec![0, 0, 1, 2, 3, 4, 0, 0].into()))
        );
        let z = Command::WriteZeroes {
            offset: 8192,
            len: 2,
            fua: false,
            fast: false,
        };
        assert_eq!(run(&d, z, None), Ok(Done::Empty));
        assert_eq!(
            run(&d, r, None),
            Ok(Done::Data(vec![0, 0, 0, 0, 3, 4, 0, 0].into()))
        );
        let t = Command::Trim {
            offset: 8192,
            len: 4096,
            fua: true,
        };
        assert_eq!(run(&d, t, None), Ok(Done::Empty));
        assert_eq!(d.flushes(), 1, "trim with FUA flushes");
        assert_eq!(run(&d, r, None), Ok(Done::Data(vec![0; 8].into())));
        assert_eq!(run(&d, Command::Flush, None), Ok(Done::Empty));
        assert_eq!(d.flushes(), 2);
    }

    #[test]
    fn device_errors_become_failures() {
        let d = dev().read_only();
        let w = Command::Write {
            offset: 0,
            len: 1,
            fua: false,
        };
        assert_eq!(run(&d, w, Some(vec![1])).unwrap_err().errno, errno::EPERM);
        let d = dev();
        let far = Command::Read {
            offset: 1 << 20,
            len: 1,
        };
        assert_eq!(run(&d, far, None).unwrap_err().errno, errno::EINVAL);
        let far = Command::Write {
            offset: 1 << 20,
            len: 1,
            fua: false,
        };
        assert_eq!(
            run(&d, far, Some(vec![1])).unwrap_err().errno,
            errno::ENOSPC
        );
    }

    #[test]
    fn block_status_merges_caps_and_honours_req_one() {
        let d = dev();
        d.write(4096, &[1], false).unwrap();
        d.write(3 * 4096, &[1], false).unwrap();
        d.write(4 * 4096, &[1], false).unwrap();
        let bs = |offset, len, req_one| {
            run(
                &d,
                Command::BlockStatus {
                    offset,
                    len,
                    req_one,
                    max_extents: u32::MAX,
                },
                None,
            )
        };
        let hz = proto::STATE_HOLE | proto::STATE_ZERO;
        assert_eq!(
            bs(0, 6 * 4096, false),
            Ok(Done::Status(vec![
                (4096, hz),
                (4096, 0),
                (4096, hz),
                (8192, 0),
                (4096, hz)
            ]))
        );
        assert_eq!(bs(100, 10, true), Ok(Done::Status(vec![(10, hz)])));
        assert_eq!(bs(0, 6 * 4096, true), Ok(Done::Status(vec![(4096, hz)])));
        // A query for the whole device is cut to MAX_STATUS_EXTENTS blocks
        // at most (here the device is smaller, so all of it).
        let Ok(Done::Status(all)) = bs(0, 1 << 20, false) else {
            panic!()
        };
        assert_eq!(all.iter().map(|x| x.0 as u64).sum::<u64>(), 1 << 20);
    }

    #[test]
    fn block_status_of_a_huge_device_is_bounded() {
        // 2^17 alternating blocks of 512 bytes: more than one reply's
        // worth of extents.
        let d = MemDevice::new(512 << 17, 512);
        for i in (0..(1u64 << 17)).step_by(2) {
            d.write(i * 512, &[1], false).unwrap();
        }
        let Ok(Done::Status(v)) = run(
            &d,
            Command::BlockStatus {
                offset: 0,
                len: 512 << 17,
                req_one: false,
                max_extents: u32::MAX,
            },
            None,
        ) else {
            panic!()
        };
        assert_eq!(v.len(), MAX_STATUS_EXTENTS);
        assert!(v.iter().all(|&(l, _)| l == 512));
    }

    #[test]
    fn encodings() {
        let r = encode(5, 0, true, false, Ok(Done::Data(vec![9; 3].into())));
        assert_eq!(r.head, proto::simple_reply(0, 5));
        assert_eq!(r.data, Some(vec![9; 3].into()));
        let r = encode(5, 4096, true, true, Ok(Done::Data(vec![9; 3].into())));
        assert_eq!(r.head.len(), 28);
        assert_eq!(
            u16::from_be_bytes([r.head[6], r.head[7]]),
            reply::TYPE_OFFSET_DATA
        );
        assert_eq!(u32::from_be_bytes(r.head[16..20].try_into().unwrap()), 11);
        assert_eq!(u64::from_be_bytes(r.head[20..28].try_into().unwrap()), 4096);
        let r = encode(5, 4096, true, true, Ok(Done::Data(vec![0; 8192].into())));
        assert_eq!(
            u16::from_be_bytes([r.head[6], r.head[7]]),
            reply::TYPE_OFFSET_HOLE
        );
        assert_eq!(r.head.len(), 32);
        assert_eq!(u32::from_be_bytes(r.head[28..32].try_into().unwrap()), 8192);
        assert!(r.data.is_none());
        let r = encode(5, 0, true, true, Ok(Done::Data(vec![].into())));
        assert_eq!(u16::from_be_bytes([r.head[6], r.head[7]]), reply::TYPE_NONE);
        let f = Failure {
            errno: errno::EIO,
            message: "boom".into(),
        };
        let r = encode(5, 0, true, false, Err(f));
        assert_eq!(r.head, proto::simple_reply(errno::EIO, 5));
        let r = encode(5, 0, false, true, Ok(Done::Status(vec![(512, 3)])));
        assert_eq!(r.head.len(), 20 + 12);
        assert_eq!(u32::from_be_bytes(r.head[16..20].try_into().unwrap()), 12);
        assert!(is_zero(&[]));
        assert!(!is_zero(&[0, 0, 1]));
    }
}

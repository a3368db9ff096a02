//! A small blocking NBD client (fixed newstyle, `NBD_OPT_GO`, simple
//! replies) for tests that must write through the daemon request by
//! request, faster than a client program started per write.

use std::io::{Read, Write};
use std::net::TcpStream;

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const FLAG_FUA: u16 = 1;

/// One transmission session with an export.
pub struct Nbd {
    s: TcpStream,
    cookie: u64,
    /// The export's size.
    pub size: u64,
}

fn io_err(msg: String) -> std::io::Error {
    std::io::Error::other(msg)
}

impl Nbd {
    /// Connects to `addr` and enters export `name`.
    pub fn open(addr: &str, name: &str) -> std::io::Result<Nbd> {
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if &hello[..8] != b"NBDMAGIC"
            || u64::from_be_bytes(hello[8..16].try_into().unwrap()) != IHAVEOPT
        {
            return Err(io_err("not an NBD server".into()));
        }
        // Fixed newstyle, no zeroes.
        s.write_all(&3u32.to_be_bytes())?;
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
        opt.extend_from_slice(&data);
        s.write_all(&opt)?;
        let mut size = None;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            if u64::from_be_bytes(h[..8].try_into().unwrap()) != OPT_REPLY_MAGIC {
                return Err(io_err("bad option reply magic".into()));
            }
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len];
            s.read_exact(&mut body)?;
            if kind & 0x8000_0000 != 0 {
                return Err(io_err(format!("export {name}: option error {kind:#x}")));
            }
            // NBD_INFO_EXPORT: type 0, size, flags.
            if kind == 3 && body.len() >= 12 && body[..2] == [0, 0] {
                size = Some(u64::from_be_bytes(body[2..10].try_into().unwrap()));
            }
            if kind == REP_ACK {
                break;
            }
        }
        let size = size.ok_or_else(|| io_err("no export info".into()))?;
        Ok(Nbd { s, cookie: 0, size })
    }

    fn request(
        &mut self,
        cmd: u16,
        flags: u16,
        off: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<()> {
        self.cookie += 1;
        let mut r = Vec::with_capacity(28 + data.len());
        r.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        r.extend_from_slice(&flags.to_be_bytes());
        r.extend_from_slice(&cmd.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&off.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r)
    }

    fn reply(&mut self) -> std::io::Result<()> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        if u32::from_be_bytes(h[..4].try_into().unwrap()) != SIMPLE_REPLY_MAGIC {
            return Err(io_err("bad reply magic".into()));
        }
        if u64::from_be_bytes(h[8..16].try_into().unwrap()) != self.cookie {
            return Err(io_err("reply to another request".into()));
        }
        match u32::from_be_bytes(h[4..8].try_into().unwrap()) {
            0 => Ok(()),
            e => Err(io_err(format!("NBD error {e}"))),
        }
    }

    /// Writes `data` at `off` (FUA: durable when this returns).
    pub fn write(&mut self, off: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        let flags = if fua { FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, off, data.len() as u32, data)?;
        self.reply()
    }

    /// Reads `len` bytes at `off`.
    pub fn read(&mut self, off: u64, len: u32) -> std::io::Result<Vec<u8>> {
        self.request(CMD_READ, 0, off, len, &[])?;
        self.reply()?;
        let mut b = vec![0u8; len as usize];
        self.s.read_exact(&mut b)?;
        Ok(b)
    }

    /// Makes every acknowledged write durable.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.request(CMD_FLUSH, 0, 0, 0, &[])?;
        self.reply()
    }

    /// Ends the session.
    pub fn close(mut self) {
        let _ = self.request(CMD_DISC, 0, 0, 0, &[]);
    }
}

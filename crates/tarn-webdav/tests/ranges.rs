//! Partial uploads, holes and ranges over a real pool, checked byte for
//! byte against a model. Its own test binary: the streaming tests measure
//! the process's peak memory, which a test running beside them would
//! inflate.

mod common;

use common::*;
use tarn_testkit::clients::curl;
use tarn_testkit::data::Rng;
use tarn_testkit::require;
use tarn_testkit::MIB;
use tarn_webdav::Share;

/// Uploads in pieces at odd offsets (`PUT` with `Content-Range`, so the
/// server's write path starts off the 1 MiB boundaries it gathers to),
/// holes punched and left past the end (so downloads carry runs of zeros
/// between blocks), then whole and ranged downloads, every byte checked
/// against a model. Seeded (`TARN_DAV_SEED=0x...` replays).
#[test]
fn partial_puts_holes_and_ranges() {
    if !require::programs(&["curl"]) {
        return;
    }
    let seed = tarn_testkit::data::env_seed("TARN_DAV_SEED")
        .unwrap_or_else(tarn_testkit::data::random_seed);
    println!("seed {seed:#x}");
    let mut rng = Rng::new(seed);
    let real = real_fs(512 << 20, pool_opts());
    let server = start(vec![Share::new("tank", real.fs.clone())]);
    let u = url(server.local_addr(), "/tank/f.bin");
    let work = tempfile::tempdir().unwrap();
    let piece = work.path().join("piece");
    let put = |body: &[u8], range: Option<(u64, u64)>| -> u16 {
        std::fs::write(&piece, body).unwrap();
        let p = piece.to_str().unwrap().to_string();
        let mut args = vec!["-u".to_string(), "alice:secret".into(), "-T".into(), p];
        if let Some((a, b)) = range {
            args.extend(["-H".into(), format!("Content-Range: bytes {a}-{b}/*")]);
        }
        args.push(u.clone());
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        curl(&args).0
    };
    let mut model = rng.bytes(2 * MIB as usize + 333);
    assert_eq!(put(&model, None), 201);
    for _ in 0..12 {
        match rng.below(3) {
            0 | 1 => {
                let off = rng.below(model.len() as u64 + 1) as usize;
                let len = rng.range(1, 3 * MIB / 2) as usize;
                let data = rng.bytes(len);
                let code = put(&data, Some((off as u64, (off + len - 1) as u64)));
                assert!(code == 200 || code == 204, "partial PUT at {off}: {code}");
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
            _ => {
                // A hole punched inside, or the file grown past its end.
                let cred = tarn_fs::Cred::root();
                let fs = real.fs.as_ref();
                let ino = fs.lookup(tarn_fs::ROOT_INO, b"f.bin", &cred).unwrap().ino;
                if rng.chance(0.5) {
                    let off = rng.below(model.len() as u64);
                    let len = rng.range(1, MIB + 1);
                    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    fs.fallocate(ino, off, len, mode as u32, &cred).unwrap();
                    let end = (off + len).min(model.len() as u64) as usize;
                    model[off as usize..end].fill(0);
                } else {
                    let size = model.len() as u64 + rng.range(1, 2 * MIB);
                    let set = tarn_fs::SetAttr {
                        size: Some(size),
                        ..Default::default()
                    };
                    fs.setattr(ino, &set, &cred).unwrap();
                    model.resize(size as usize, 0);
                }
            }
        }
        let (code, body, _) = curl(&["-u", "alice:secret", &u]);
        assert_eq!(code, 200);
        assert_eq!(body.len(), model.len(), "seed {seed:#x}: size");
        let at = body.iter().zip(&model).position(|(a, b)| a != b);
        assert!(at.is_none(), "seed {seed:#x}: download differs at {at:?}");
        for _ in 0..3 {
            let a = rng.below(model.len() as u64);
            let b = (a + rng.range(1, 2 * MIB)).min(model.len() as u64) - 1;
            let (code, body, _) = curl(&["-u", "alice:secret", "-r", &format!("{a}-{b}"), &u]);
            assert_eq!(code, 206);
            assert!(
                body == model[a as usize..=b as usize],
                "seed {seed:#x}: range {a}-{b} differs"
            );
        }
        // Two ranges in one request (a multipart answer): the server seeks
        // back inside one open file.
        let a = rng.below(model.len() as u64 / 2 + 1);
        let c = rng.below(a + 1);
        let (b, d) = ((a + 70_000).min(model.len() as u64) - 1, c + 9);
        let (code, body, _) = curl(&["-u", "alice:secret", "-r", &format!("{a}-{b},{c}-{d}"), &u]);
        assert_eq!(code, 206);
        let find = |want: &[u8]| body.windows(want.len()).any(|w| w == want);
        assert!(
            find(&model[a as usize..=b as usize]) && find(&model[c as usize..=d as usize]),
            "seed {seed:#x}: a part of the two ranges {a}-{b},{c}-{d} differs"
        );
    }
    server.stop();
}

/// A chunked upload that comes a few bytes per chunk (each chunk its own
/// body frame at the server, which gathers small frames) stores exactly
/// the bytes sent, across record and 1 MiB boundaries.
#[test]
fn tiny_chunks_upload() {
    use std::io::{Read, Write};
    if !require::programs(&["curl"]) {
        return;
    }
    let seed = tarn_testkit::data::random_seed();
    println!("seed {seed:#x}");
    let mut rng = Rng::new(seed);
    let real = real_fs(256 << 20, pool_opts());
    let server = start(vec![Share::new("tank", real.fs.clone())]);
    let data = rng.bytes(MIB as usize + 70_000);
    let mut body = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let n = (rng.range(1, 9) as usize).min(data.len() - at);
        body.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        body.extend_from_slice(&data[at..at + n]);
        body.extend_from_slice(b"\r\n");
        at += n;
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    let head = format!(
        "PUT /tank/tiny.bin HTTP/1.1\r\nHost: t\r\nAuthorization: {ALICE}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    let (code, got, _) = curl(&[
        "-u",
        "alice:secret",
        &url(server.local_addr(), "/tank/tiny.bin"),
    ]);
    assert_eq!(code, 200);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "seed {seed:#x}: the upload differs");
    server.stop();
}

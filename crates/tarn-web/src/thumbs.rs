//! Thumbnails for the photo grid: a JPEG of at most [`THUMB_SIZE`]
//! pixels a side, made on the server from a JPEG or PNG (turned upright
//! by its EXIF orientation), so a folder of photos shows without sending
//! any original over the network.
//!
//! # Cache and invalidation
//!
//! Made thumbnails are kept in memory, at most [`THUMB_CACHE_BYTES`] in
//! all, the least recently used going first. The key is the file's
//! identity and version as the filesystem reports it: dataset, inode,
//! generation, size, and modification and change times. Any write,
//! truncate or replacement changes one of them, so a changed file is
//! never shown with its old picture: its old entry is simply never asked
//! for again and ages out. The grid asks with the version in the URL
//! (`?thumb&v=…`), which lets the browser keep a thumbnail for good.
//!
//! # Bounds
//!
//! At most [`MAKERS`] thumbnails are made at once (decoding is CPU and
//! memory heavy; other requests keep being served): the others wait for
//! a turn on the runtime ([`Thumbs::makers`]), not on one of its few
//! blocking threads, which every request needs; sources above
//! [`MAX_SOURCE`] bytes, [`MAX_PIXELS_SIDE`] pixels a side or
//! [`MAX_DECODE`] bytes decoded get none (for a progressive JPEG, whose
//! decoders hold every coefficient of the whole image however small the
//! file, counted from its header before decoding: such a JPEG above
//! about 32 megapixels gets a plain tile), so making thumbnails takes at
//! most about `MAKERS × (MAX_SOURCE + MAX_DECODE)` beyond the cache. A
//! decoder that panics on a hostile file fails that request only.
//! HEIC has no maintained decoder we could build in, so HEIC files get
//! no thumbnail (the page shows a plain tile).

use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::sync::Mutex;

use bytes::Bytes;
use http::StatusCode;
use tarn_fs::{Attr, FileKind};

use crate::files::{FErr, Scope};

/// Longest side of a thumbnail, in pixels.
pub const THUMB_SIZE: u32 = 256;
/// Memory for cached thumbnails.
pub const THUMB_CACHE_BYTES: usize = 64 << 20;
/// Thumbnails made at once.
pub const MAKERS: usize = 2;
/// Largest source file that gets a thumbnail.
pub const MAX_SOURCE: u64 = 48 << 20;
/// Largest source image side, in pixels.
pub const MAX_PIXELS_SIDE: u32 = 12_000;
/// Memory one decode may take (a 48-megapixel photo needs 144 MiB).
pub const MAX_DECODE: u64 = 192 << 20;

/// A file's identity and version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    dataset: u64,
    ino: u64,
    generation: u64,
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

impl Key {
    fn of(a: &Attr) -> Key {
        Key {
            dataset: a.dataset,
            ino: a.ino,
            generation: a.generation,
            size: a.size,
            mtime: (a.mtime.sec, a.mtime.nsec),
            ctime: (a.ctime.sec, a.ctime.nsec),
        }
    }
}

#[derive(Default)]
struct Lru {
    map: HashMap<Key, (Bytes, u64)>,
    order: BTreeMap<u64, Key>,
    bytes: usize,
    tick: u64,
}

/// The thumbnail cache and the makers' gate.
pub(crate) struct Thumbs {
    lru: Mutex<Lru>,
    /// Turns to make a thumbnail, [`MAKERS`] at once; taken before the
    /// blocking thread that makes one.
    pub makers: tokio::sync::Semaphore,
    budget: usize,
}

impl Default for Thumbs {
    fn default() -> Thumbs {
        Thumbs::new(THUMB_CACHE_BYTES)
    }
}

impl Thumbs {
    pub fn new(budget: usize) -> Thumbs {
        Thumbs {
            lru: Mutex::new(Lru::default()),
            makers: tokio::sync::Semaphore::new(MAKERS),
            budget,
        }
    }

    fn get(&self, k: &Key) -> Option<Bytes> {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.tick += 1;
        let tick = l.tick;
        let (b, old) = {
            let e = l.map.get_mut(k)?;
            let old = e.1;
            e.1 = tick;
            (e.0.clone(), old)
        };
        l.order.remove(&old);
        l.order.insert(tick, *k);
        Some(b)
    }

    fn put(&self, k: Key, b: Bytes) {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        if b.len() > self.budget {
            return;
        }
        l.tick += 1;
        let tick = l.tick;
        if let Some((old, t)) = l.map.insert(k, (b.clone(), tick)) {
            l.bytes -= old.len();
            l.order.remove(&t);
        }
        l.bytes += b.len();
        l.order.insert(tick, k);
        while l.bytes > self.budget {
            let Some((_, victim)) = l.order.pop_first() else {
                break;
            };
            if let Some((old, _)) = l.map.remove(&victim) {
                l.bytes -= old.len();
            }
        }
    }

    /// Drops every thumbnail: they are pictures of files' plaintext, and
    /// a key unloaded must take what was made from its datasets with it
    /// (the cache does not know which those are, as the block cache does
    /// not; the rest are made again on demand).
    pub fn clear(&self) {
        let mut l = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        l.map.clear();
        l.order.clear();
        l.bytes = 0;
    }

    /// Bytes of thumbnails held.
    pub fn bytes(&self) -> usize {
        self.lru.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

fn unsupported(msg: &str) -> FErr {
    FErr::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "no_thumbnail", msg)
}

/// Makes a JPEG thumbnail of an encoded JPEG or PNG image.
pub(crate) fn make(data: &[u8]) -> Result<Vec<u8>, FErr> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        if let Some(t) = make_from_jpeg(data)? {
            return Ok(t);
        }
    }
    make_any(data)
}

/// A JPEG decoded at the smallest scale its DCT allows that still covers
/// the thumbnail (an eighth, a quarter or half of each side): a 12-MP
/// photo costs the decode of a 0.2-MP one. None for kinds this path does
/// not take (CMYK, 16-bit): [`make_any`] does those.
fn make_from_jpeg(data: &[u8]) -> Result<Option<Vec<u8>>, FErr> {
    let bad = |_| unsupported("cannot read this image (damaged, or too large)");
    let mut d = jpeg_decoder::Decoder::new(Cursor::new(data));
    d.set_max_decoding_buffer_size(MAX_DECODE as usize);
    d.read_info().map_err(bad)?;
    let Some(info) = d.info() else {
        return Ok(None);
    };
    if u32::from(info.width) > MAX_PIXELS_SIDE || u32::from(info.height) > MAX_PIXELS_SIDE {
        return Err(unsupported("the image is too large for a thumbnail"));
    }
    if progressive_coefficients(&info) > MAX_DECODE {
        return Err(unsupported("the image is too large for a thumbnail"));
    }
    let side = THUMB_SIZE as u16;
    d.scale(side.min(info.width), side.min(info.height))
        .map_err(bad)?;
    let px = d.decode().map_err(bad)?;
    let Some(info) = d.info() else {
        return Ok(None);
    };
    let (w, h) = (u32::from(info.width), u32::from(info.height));
    let mut img = match info.pixel_format {
        jpeg_decoder::PixelFormat::RGB24 => {
            image::RgbImage::from_raw(w, h, px).map(image::DynamicImage::ImageRgb8)
        }
        jpeg_decoder::PixelFormat::L8 => {
            image::GrayImage::from_raw(w, h, px).map(image::DynamicImage::ImageLuma8)
        }
        _ => return Ok(None),
    }
    .ok_or_else(|| unsupported("cannot read this image"))?;
    if let Some(o) = d
        .exif_data()
        .and_then(image::metadata::Orientation::from_exif_chunk)
    {
        img.apply_orientation(o);
    }
    encode(&img).map(Some)
}

/// The memory a decoder holds for a progressive JPEG's coefficients
/// before it makes a pixel: two bytes for each of the 64 coefficients of
/// every 8×8 block of every component, at the full size whatever the
/// scale asked (the later scans refine them), counted as if no component
/// were subsampled. Neither decoder bounds it: a file of a few hundred
/// bytes announcing 12,000 pixels a side makes them allocate (and touch)
/// most of a gigabyte, so such files are refused before decoding. Zero
/// for sequential JPEGs, whose decoders work a row of blocks at a time.
fn progressive_coefficients(info: &jpeg_decoder::ImageInfo) -> u64 {
    if info.coding_process != jpeg_decoder::CodingProcess::DctProgressive {
        return 0;
    }
    let components: u64 = match info.pixel_format {
        jpeg_decoder::PixelFormat::L8 | jpeg_decoder::PixelFormat::L16 => 1,
        jpeg_decoder::PixelFormat::RGB24 => 3,
        jpeg_decoder::PixelFormat::CMYK32 => 4,
    };
    let blocks = |side: u16| u64::from(side).div_ceil(8);
    components * blocks(info.width) * blocks(info.height) * 64 * 2
}

fn encode(img: &image::DynamicImage) -> Result<Vec<u8>, FErr> {
    let small = img.thumbnail(THUMB_SIZE, THUMB_SIZE).to_rgb8();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
        .encode_image(&small)
        .map_err(|e| FErr::new(StatusCode::INTERNAL_SERVER_ERROR, "io", e.to_string()))?;
    Ok(out)
}

/// Any JPEG or PNG, decoded whole.
fn make_any(data: &[u8]) -> Result<Vec<u8>, FErr> {
    use image::ImageDecoder;
    let mut reader = image::ImageReader::new(Cursor::new(data))
        .with_guessed_format()
        .map_err(|_| unsupported("cannot read this image"))?;
    match reader.format() {
        Some(image::ImageFormat::Jpeg | image::ImageFormat::Png) => {}
        _ => return Err(unsupported("thumbnails are made of JPEG and PNG images")),
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_PIXELS_SIDE);
    limits.max_image_height = Some(MAX_PIXELS_SIDE);
    limits.max_alloc = Some(MAX_DECODE);
    reader.limits(limits);
    let mut decoder = reader
        .into_decoder()
        .map_err(|_| unsupported("cannot read this image"))?;
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = image::DynamicImage::from_decoder(decoder)
        .map_err(|_| unsupported("cannot read this image (damaged, or too large)"))?;
    img.apply_orientation(orientation);
    encode(&img)
}

/// The file at `comps` as a thumbnail's source: a regular file the
/// caller may read, small enough.
fn source(scope: &Scope, comps: &[Vec<u8>]) -> Result<Attr, FErr> {
    let a = scope.file_for_reading(comps)?;
    if a.kind != FileKind::Regular {
        return Err(unsupported("only files have thumbnails"));
    }
    // The cache is shared by every caller: whoever asks must be allowed
    // to read the file, cached or not.
    scope.may_read(&a)?;
    if a.size > MAX_SOURCE {
        return Err(unsupported("the image is too large for a thumbnail"));
    }
    Ok(a)
}

/// The thumbnail of the file at `comps` if the cache has it (None: it
/// must be made, with [`thumbnail`], in a turn of [`Thumbs::makers`]).
pub(crate) fn cached(
    thumbs: &Thumbs,
    scope: &Scope,
    comps: &[Vec<u8>],
) -> Result<Option<Bytes>, FErr> {
    let a = source(scope, comps)?;
    Ok(thumbs.get(&Key::of(&a)))
}

/// The thumbnail of the file at `comps`, and whether it came from the
/// cache. The caller holds a turn of [`Thumbs::makers`].
pub(crate) fn thumbnail(
    thumbs: &Thumbs,
    scope: &Scope,
    comps: &[Vec<u8>],
) -> Result<(Bytes, bool), FErr> {
    let a = source(scope, comps)?;
    let key = Key::of(&a);
    // Made by another request while this one waited for its turn.
    if let Some(b) = thumbs.get(&key) {
        return Ok((b, true));
    }
    let data = scope.read_all(&a)?;
    // A decoder that panics on a hostile file costs that request only.
    let made = std::panic::catch_unwind(|| make(&data))
        .unwrap_or_else(|_| Err(unsupported("cannot read this image")))?;
    let made = Bytes::from(made);
    thumbs.put(key, made.clone());
    Ok((made, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 128]));
        let mut out = Vec::new();
        img.write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn thumbnails_keep_the_aspect_and_fit_the_box() {
        let t = make(&png(1200, 600)).unwrap();
        let img = image::load_from_memory(&t).unwrap();
        assert_eq!((img.width(), img.height()), (256, 128));
        let t = make(&png(100, 300)).unwrap();
        let img = image::load_from_memory(&t).unwrap();
        assert_eq!((img.width(), img.height()), (85, 256));
        assert!(make(b"not an image at all").is_err());
        assert!(
            make(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 1, 2]).is_err(),
            "a cut JPEG"
        );
        // JPEGs: scaled in the decoder, turned upright by EXIF.
        let rgb = image::RgbImage::from_fn(1600, 1200, |x, y| image::Rgb([x as u8, y as u8, 9]));
        let jpeg = |exif: Option<Vec<u8>>| {
            use image::ImageEncoder;
            let mut out = Vec::new();
            let mut e = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85);
            if let Some(x) = exif {
                e.set_exif_metadata(x).unwrap();
            }
            e.write_image(&rgb, 1600, 1200, image::ExtendedColorType::Rgb8)
                .unwrap();
            out
        };
        let t = make(&jpeg(None)).unwrap();
        let img = image::load_from_memory(&t).unwrap();
        assert_eq!((img.width(), img.height()), (256, 192));
        // Little-endian TIFF, one IFD entry: Orientation (0x0112) = 6,
        // "rotate 90 clockwise".
        let exif = vec![
            0x49, 0x49, 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0,
            0,
        ];
        let t = make(&jpeg(Some(exif))).unwrap();
        let img = image::load_from_memory(&t).unwrap();
        assert_eq!((img.width(), img.height()), (192, 256), "upright");
        let gray = image::GrayImage::from_fn(300, 300, |x, _| image::Luma([x as u8]));
        let mut g = Vec::new();
        gray.write_to(&mut Cursor::new(&mut g), image::ImageFormat::Jpeg)
            .unwrap();
        let img = image::load_from_memory(&make(&g).unwrap()).unwrap();
        assert_eq!((img.width(), img.height()), (256, 256));
        assert!(make(b"GIF89a....").is_err());
    }

    /// A progressive JPEG of `w`×`h` pixels and `components` components
    /// (no subsampling) holding only its first scan (the DC coefficients,
    /// every difference zero): a few dozen bytes whatever the size.
    fn progressive(w: u16, h: u16, components: u8) -> Vec<u8> {
        let mut j = vec![0xFF, 0xD8];
        // One quantisation table, all ones.
        j.extend([0xFF, 0xDB, 0, 67, 0]);
        j.extend([1u8; 64]);
        // SOF2: progressive DCT.
        let n = components;
        j.extend([0xFF, 0xC2, 0, 8 + 3 * n, 8]);
        j.extend(h.to_be_bytes());
        j.extend(w.to_be_bytes());
        j.push(n);
        for c in 1..=n {
            j.extend([c, 0x11, 0]);
        }
        // A DC table with one code, `0`, for category 0 (no difference).
        j.extend([0xFF, 0xC4, 0, 20, 0x00, 1]);
        j.extend([0u8; 15]);
        j.push(0);
        // The DC scan of every component, then the end.
        j.extend([0xFF, 0xDA, 0, 6 + 2 * n, n]);
        for c in 1..=n {
            j.extend([c, 0x00]);
        }
        j.extend([0, 0, 0]);
        j.extend([0u8; 64]);
        j.extend([0xFF, 0xD9]);
        j
    }

    /// A progressive JPEG's decoders hold every coefficient of the whole
    /// image before making a pixel, whatever the scale: a tiny file
    /// announcing 12,000 pixels a side is refused from its header, not
    /// decoded into most of a gigabyte. Small ones still get thumbnails.
    #[test]
    fn a_tiny_progressive_jpeg_of_a_huge_image_is_refused_before_decoding() {
        let small = progressive(640, 480, 3);
        let t = make(&small).expect("a small progressive JPEG");
        let img = image::load_from_memory(&t).unwrap();
        assert_eq!((img.width(), img.height()), (256, 192));
        for components in [1, 3] {
            let huge = progressive(12_000, 12_000, components);
            assert!(huge.len() < 300);
            let Err(e) = make(&huge) else {
                panic!("a huge progressive JPEG of {components} components was decoded");
            };
            assert_eq!(
                e.msg, "the image is too large for a thumbnail",
                "{components} components"
            );
        }
        // 30 megapixels in three components (about 170 MiB of
        // coefficients) are within the bound.
        let info = jpeg_decoder::ImageInfo {
            width: 6_400,
            height: 4_700,
            pixel_format: jpeg_decoder::PixelFormat::RGB24,
            coding_process: jpeg_decoder::CodingProcess::DctProgressive,
        };
        assert!(progressive_coefficients(&info) <= MAX_DECODE);
    }

    #[test]
    fn the_cache_stays_in_its_budget_and_drops_the_least_recent() {
        let t = Thumbs::new(1000);
        let k = |i: u64| Key {
            dataset: 1,
            ino: i,
            generation: 0,
            size: 0,
            mtime: (0, 0),
            ctime: (0, 0),
        };
        for i in 0..4 {
            t.put(k(i), Bytes::from(vec![0u8; 300]));
        }
        assert!(t.bytes() <= 1000);
        assert!(t.get(&k(0)).is_none(), "the oldest went first");
        assert!(t.get(&k(1)).is_some());
        t.put(k(9), Bytes::from(vec![0u8; 300]));
        assert!(t.get(&k(1)).is_some(), "recently used: kept");
        assert!(t.get(&k(2)).is_none());
        t.put(k(10), Bytes::from(vec![0u8; 5000]));
        assert!(t.get(&k(10)).is_none(), "larger than the budget: not kept");
        let mut changed = k(1);
        changed.mtime = (1, 0);
        assert!(t.get(&changed).is_none(), "a new version is a new key");
    }
}

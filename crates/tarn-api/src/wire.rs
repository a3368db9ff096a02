//! The line protocol: one JSON object per line each way.
//!
//! A request is `{"id":1,"method":"pool.status","params":{"name":"tank"}}`.
//! The answer is one line too, carrying the same id and either a `result`
//! or an `error` with a machine-readable `code` and a sentence for the
//! operator: `{"id":1,"error":{"code":"not_found","message":"..."}}`. The
//! framing here is transport-independent: the daemon serves it on a Unix
//! socket, the client speaks it, and another transport can reuse it.

use std::io::{self, BufRead, Read, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;

/// One request line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Chosen by the client and echoed in the response.
    #[serde(default)]
    pub id: Option<u64>,
    /// One of [`crate::method::ALL`].
    pub method: String,
    /// Method parameters; absent or `null` means none.
    #[serde(default)]
    pub params: Value,
}

/// One response line: exactly one of `result` and `error` is present.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id, or `null` when the request could not be read.
    pub id: Option<u64>,
    /// The method's result on success (may be `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The failure otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

impl Response {
    /// Wraps a dispatch outcome.
    pub fn new(id: Option<u64>, outcome: Result<Value, ApiError>) -> Self {
        match outcome {
            Ok(result) => Response {
                id,
                result: Some(result),
                error: None,
            },
            Err(error) => Response {
                id,
                result: None,
                error: Some(error),
            },
        }
    }

    /// The response as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|e| {
            let fallback = Response::new(
                self.id,
                Err(ApiError::internal(format!(
                    "the daemon could not encode its answer: {e}"
                ))),
            );
            serde_json::to_vec(&fallback).unwrap_or_default()
        });
        line.push(b'\n');
        line
    }
}

/// Decodes a request line. On failure returns the id (when one could be
/// read) together with an `invalid` error, so the caller can still answer.
pub fn parse_request(line: &[u8]) -> Result<Request, (Option<u64>, ApiError)> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        (
            None,
            ApiError::invalid(format!(
                "request is not valid JSON ({e}); send one JSON object per line, \
                 e.g. {{\"id\":1,\"method\":\"daemon.ping\"}}"
            )),
        )
    })?;
    let id = value.get("id").and_then(Value::as_u64);
    serde_json::from_value(value).map_err(|e| {
        (
            id,
            ApiError::invalid(format!(
                "malformed request ({e}); expected {{\"id\":N,\"method\":\"...\",\"params\":{{...}}}}"
            )),
        )
    })
}

/// Outcome of [`read_line_bounded`].
#[derive(Debug, PartialEq, Eq)]
pub enum LineRead {
    /// A whole line is in the buffer (without its newline).
    Line,
    /// The line was longer than the limit; it has been consumed and dropped.
    TooLong,
    /// The peer closed the stream with no partial line pending.
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (cleared first), holding at most
/// `max_bytes` of it in memory. A longer line is read to its end and
/// discarded, so the stream stays in step and the next line can be served.
/// A final line without a newline counts as a line.
pub fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max_bytes: usize,
) -> io::Result<LineRead> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(match (any, too_long) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max_bytes {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        reader.consume(if done { take + 1 } else { take });
        if done {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use std::io::Cursor;

    fn read_all(input: &[u8], max: usize) -> Vec<(LineRead, Vec<u8>)> {
        let mut reader = io::BufReader::with_capacity(7, Cursor::new(input.to_vec()));
        let mut out = Vec::new();
        let mut buf = Vec::new();
        loop {
            let r = read_line_bounded(&mut reader, &mut buf, max).unwrap();
            if r == LineRead::Eof {
                return out;
            }
            out.push((r, buf.clone()));
        }
    }

    #[test]
    fn bounded_lines_drop_oversized_and_keep_step() {
        let long = vec![b'x'; 40];
        let mut input = b"short\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nexact-ten!\nlast");
        let lines = read_all(&input, 10);
        assert_eq!(
            lines,
            vec![
                (LineRead::Line, b"short".to_vec()),
                (LineRead::TooLong, Vec::new()),
                (LineRead::Line, b"exact-ten!".to_vec()),
                (LineRead::Line, b"last".to_vec()),
            ]
        );
    }

    #[test]
    fn garbage_and_malformed_requests_are_invalid() {
        let (id, err) = parse_request(b"{not json").unwrap_err();
        assert_eq!(id, None);
        assert_eq!(err.code, ErrorCode::Invalid);

        let (id, err) = parse_request(br#"{"id":7,"methd":"daemon.ping"}"#).unwrap_err();
        assert_eq!(id, Some(7));
        assert_eq!(err.code, ErrorCode::Invalid);

        let req = parse_request(br#"{"id":3,"method":"pool.list"}"#).unwrap();
        assert_eq!(req.id, Some(3));
        assert!(req.params.is_null());
    }

    #[test]
    fn responses_round_trip() {
        let ok = Response::new(Some(1), Ok(Value::Null));
        assert_eq!(ok.to_line(), b"{\"id\":1,\"result\":null}\n");
        let err = Response::new(None, Err(ApiError::busy("later")));
        let text = String::from_utf8(err.to_line()).unwrap();
        assert_eq!(
            text,
            "{\"id\":null,\"error\":{\"code\":\"busy\",\"message\":\"later\"}}\n"
        );
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(back.error.unwrap().code, ErrorCode::Busy);
        let future: ApiError = serde_json::from_str(r#"{"code":"quota","message":"m"}"#).unwrap();
        assert_eq!(future.code, ErrorCode::Internal);
    }
}

/// Largest frame of a streamed body (see [`FrameWriter`]).
pub const MAX_FRAME: usize = 1 << 20;

/// The streamed body of `dataset.send` and `dataset.receive` on a byte
/// transport: frames of a little-endian u32 length and that many bytes
/// (1 to [`MAX_FRAME`]), ended by a frame of length 0. A send's frames
/// follow its request line, and the response line follows the end frame;
/// a receive's frames follow its request line, and the daemon answers
/// with one response line when it has applied them (or at its first
/// error, after which it closes the connection).
pub struct FrameWriter<W: Write> {
    w: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    /// Frames what is written to `w`.
    pub fn new(w: W) -> Self {
        FrameWriter {
            w,
            buf: Vec::with_capacity(256 << 10),
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.w.write_all(&(self.buf.len() as u32).to_le_bytes())?;
        self.w.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is buffered and the end frame; returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.emit()?;
        self.w.write_all(&0u32.to_le_bytes())?;
        self.w.flush()?;
        Ok(self.w)
    }
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = (256 << 10) - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= 256 << 10 {
            self.emit()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.w.flush()
    }
}

/// Reads a framed body (see [`FrameWriter`]): the bytes of its frames,
/// then end of input at the end frame. A frame longer than [`MAX_FRAME`],
/// or input that ends before the end frame, is an error.
pub struct FrameReader<R: Read> {
    r: R,
    left: usize,
    done: bool,
}

impl<R: Read> FrameReader<R> {
    /// Reads the frames of `r`.
    pub fn new(r: R) -> Self {
        FrameReader {
            r,
            left: 0,
            done: false,
        }
    }

    /// True once the end frame was read.
    pub fn finished(&self) -> bool {
        self.done
    }
}

impl<R: Read> Read for FrameReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut len = [0u8; 4];
            self.r.read_exact(&mut len).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the streamed body ended without its end frame",
                    )
                } else {
                    e
                }
            })?;
            let n = u32::from_le_bytes(len) as usize;
            if n == 0 {
                self.done = true;
                return Ok(0);
            }
            if n > MAX_FRAME {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a frame of {n} bytes (at most {MAX_FRAME})"),
                ));
            }
            self.left = n;
        }
        let want = out.len().min(self.left);
        let got = self.r.read(&mut out[..want])?;
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the streamed body ended inside a frame",
            ));
        }
        self.left -= got;
        Ok(got)
    }
}

#[cfg(test)]
mod frame_tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_damage() {
        let data: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = FrameWriter::new(Vec::new());
        for chunk in data.chunks(10_007) {
            w.write_all(chunk).unwrap();
        }
        let framed = w.finish().unwrap();
        let mut back = Vec::new();
        let mut r = FrameReader::new(&framed[..]);
        r.read_to_end(&mut back).unwrap();
        assert!(r.finished());
        assert_eq!(back, data);
        // Cut anywhere: an error, never a short body taken for whole.
        for cut in [0, 3, 4, 100, framed.len() - 4, framed.len() - 1] {
            let mut r = FrameReader::new(&framed[..cut]);
            assert!(r.read_to_end(&mut Vec::new()).is_err(), "cut at {cut}");
        }
        let mut huge = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(FrameReader::new(&huge[..])
            .read_to_end(&mut Vec::new())
            .is_err());
    }
}

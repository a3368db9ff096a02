//! The line protocol: one JSON object per line each way.
//!
//! A request is `{"id":1,"method":"pool.status","params":{"name":"tank"}}`.
//! The answer is one line too, carrying the same id and either a `result`
//! or an `error` with a machine-readable `code` and a sentence for the
//! operator: `{"id":1,"error":{"code":"not_found","message":"..."}}`. The
//! framing here is transport-independent: the daemon serves it on a Unix
//! socket, the client speaks it, and another transport can reuse it.

use std::io::{self, BufRead};

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

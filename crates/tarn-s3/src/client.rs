//! Bucket operations over [`crate::http`], signed with [`crate::sigv4`]:
//! put, get, list (ListObjectsV2, every page), delete, and create bucket.
//! Failures that may pass (a dropped connection, 500, 503, a throttle)
//! are retried a few times with a growing pause; the rest are errors that
//! carry the store's own code and message.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::{Client, Endpoint, Response};
use crate::sigv4::{amz_date, sha256_hex, uri_encode, Signer};
use crate::S3Error;

/// Attempts per request (the first and the retries).
const ATTEMPTS: u32 = 5;
/// Most objects one listing returns.
pub const MAX_LISTED: usize = 10_000_000;
/// Longest key a listing may name: S3's own limit. A store (or anyone
/// between it and us on plain HTTP) that lists longer keys is not one.
pub const MAX_KEY: usize = 1024;
/// Most pages one listing reads, and most of them that may list nothing
/// while saying there is more: a store that pages on forever, with a new
/// continuation token each time, is an error rather than a loop.
const MAX_PAGES: usize = MAX_LISTED / 100;
const MAX_EMPTY_PAGES: usize = 100;

/// How to reach a store, usually from the environment ([`Config::from_env`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// The service's address.
    pub endpoint: Endpoint,
    /// Buckets in the path (`host/bucket/key`, what MinIO and most
    /// self-hosted stores want) rather than in the host name
    /// (`bucket.host/key`, AWS's default).
    pub path_style: bool,
    /// Credentials and region.
    pub signer: Signer,
}

impl Config {
    /// From `TARN_S3_ENDPOINT` (or `AWS_ENDPOINT_URL_S3`,
    /// `AWS_ENDPOINT_URL`), `AWS_REGION` (or `AWS_DEFAULT_REGION`,
    /// default `us-east-1`), `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`. Without an endpoint, AWS itself, with
    /// buckets in the host name; with one, buckets in the path unless
    /// `TARN_S3_PATH_STYLE=0`.
    pub fn from_env() -> Result<Config, S3Error> {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
        };
        let region = var(&["AWS_REGION", "AWS_DEFAULT_REGION"]).unwrap_or("us-east-1".into());
        let access = var(&["AWS_ACCESS_KEY_ID"]).ok_or_else(|| {
            S3Error::Config("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into())
        })?;
        let secret = var(&["AWS_SECRET_ACCESS_KEY"])
            .ok_or_else(|| S3Error::Config("set AWS_SECRET_ACCESS_KEY".into()))?;
        let (endpoint, path_style) = match var(&[
            "TARN_S3_ENDPOINT",
            "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL",
        ]) {
            Some(url) => (
                Endpoint::parse(&url)?,
                var(&["TARN_S3_PATH_STYLE"]).is_none_or(|v| v != "0"),
            ),
            None => (
                Endpoint::parse(&format!("https://s3.{region}.amazonaws.com"))?,
                var(&["TARN_S3_PATH_STYLE"]).is_some_and(|v| v != "0"),
            ),
        };
        Ok(Config {
            endpoint,
            path_style,
            signer: Signer::new(&access, &secret, &region),
        })
    }
}

/// An object as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Its key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// One bucket of a store.
pub struct Bucket {
    cfg: Config,
    bucket: String,
    http: Client,
    /// Requests retried after a failure that may pass (for reports).
    pub retries: u64,
}

impl Bucket {
    /// A client of `bucket` (nothing is sent yet).
    pub fn new(mut cfg: Config, bucket: &str) -> Result<Bucket, S3Error> {
        let ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !ok {
            return Err(S3Error::Config(format!(
                "bucket name '{bucket}': 3 to 63 lowercase letters, digits, '-' and '.'"
            )));
        }
        // A bucket name with a dot, as a host name over HTTPS, is more
        // labels than a store's wildcard certificate covers: it goes in
        // the path.
        if bucket.contains('.') && cfg.endpoint.tls {
            cfg.path_style = true;
        }
        let endpoint = if cfg.path_style {
            cfg.endpoint.clone()
        } else {
            Endpoint {
                host: format!("{bucket}.{}", cfg.endpoint.host),
                ..cfg.endpoint.clone()
            }
        };
        Ok(Bucket {
            http: Client::new(endpoint)?,
            cfg,
            bucket: bucket.to_string(),
            retries: 0,
        })
    }

    /// The encoded path of `key` (empty: the bucket itself).
    fn path(&self, key: &str) -> String {
        let k = uri_encode(key, true);
        if self.cfg.path_style {
            if key.is_empty() {
                format!("/{}", self.bucket)
            } else {
                format!("/{}/{k}", self.bucket)
            }
        } else {
            format!("/{k}")
        }
    }

    fn host(&self) -> String {
        let mut e = self.cfg.endpoint.clone();
        if !self.cfg.path_style {
            e.host = format!("{}.{}", self.bucket, e.host);
        }
        e.host_header()
    }

    /// One signed request, retried while the failure may pass.
    fn call(
        &mut self,
        method: &str,
        key: &str,
        query: &[(String, String)],
        body: &[u8],
    ) -> Result<Response, S3Error> {
        let path = self.path(key);
        let payload = sha256_hex(body);
        let target = if query.is_empty() {
            path.clone()
        } else {
            let q: Vec<String> = query
                .iter()
                .map(|(k, v)| format!("{}={}", uri_encode(k, false), uri_encode(v, false)))
                .collect();
            format!("{path}?{}", q.join("&"))
        };
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                self.retries += 1;
                std::thread::sleep(Duration::from_millis(200 << attempt));
            }
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut headers = vec![("host".to_string(), self.host())];
            let auth =
                self.cfg
                    .signer
                    .sign(method, &path, query, &mut headers, &payload, &amz_date(now));
            headers.push(("authorization".into(), auth));
            match self.http.request(method, &target, &headers, body) {
                Ok(r) if matches!(r.status, 500 | 502 | 503 | 504) => {
                    last = Some(store_error(method, key, &r));
                }
                Ok(r) => return Ok(r),
                Err(e @ S3Error::Io(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| S3Error::Io("no attempt was made".into())))
    }

    /// Stores `data` as `key`.
    pub fn put(&mut self, key: &str, data: &[u8]) -> Result<(), S3Error> {
        let r = self.call("PUT", key, &[], data)?;
        if r.status == 200 {
            Ok(())
        } else {
            Err(store_error("PUT", key, &r))
        }
    }

    /// The object `key`, or `None` when there is none.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, S3Error> {
        let r = self.call("GET", key, &[], b"")?;
        match r.status {
            200 => Ok(Some(r.body)),
            404 => Ok(None),
            _ => Err(store_error("GET", key, &r)),
        }
    }

    /// Removes `key` (no error when it is not there).
    pub fn delete(&mut self, key: &str) -> Result<(), S3Error> {
        let r = self.call("DELETE", key, &[], b"")?;
        if r.status == 204 || r.status == 200 || r.status == 404 {
            Ok(())
        } else {
            Err(store_error("DELETE", key, &r))
        }
    }

    /// Creates the bucket (no error when this account already owns it).
    pub fn create(&mut self) -> Result<(), S3Error> {
        let r = self.call("PUT", "", &[], b"")?;
        if r.status == 200 {
            return Ok(());
        }
        let e = store_error("PUT", "", &r);
        match &e {
            S3Error::Store { code, .. } if code == "BucketAlreadyOwnedByYou" => Ok(()),
            _ => Err(e),
        }
    }

    /// Every object whose key starts with `prefix`, in key order (at
    /// most [`MAX_LISTED`], keys of at most [`MAX_KEY`] bytes: a store
    /// that pages on forever is an error).
    pub fn list(&mut self, prefix: &str) -> Result<Vec<Object>, S3Error> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        let (mut pages, mut empty) = (0usize, 0usize);
        loop {
            if out.len() > MAX_LISTED {
                return Err(S3Error::Protocol(format!(
                    "more than {MAX_LISTED} objects under '{prefix}'"
                )));
            }
            if pages >= MAX_PAGES || empty >= MAX_EMPTY_PAGES {
                return Err(S3Error::Protocol(format!(
                    "the listing of '{prefix}' goes on for {pages} pages ({empty} of them \
                     empty): the store pages on forever"
                )));
            }
            pages += 1;
            let mut q = vec![
                ("list-type".to_string(), "2".to_string()),
                ("prefix".to_string(), prefix.to_string()),
            ];
            if let Some(t) = &token {
                q.push(("continuation-token".into(), t.clone()));
            }
            let r = self.call("GET", "", &q, b"")?;
            if r.status != 200 {
                return Err(store_error("LIST", prefix, &r));
            }
            let xml = String::from_utf8(r.body)
                .map_err(|_| S3Error::Protocol("a listing that is not UTF-8".into()))?;
            // A page is whole only if it ends as one: a body cut short
            // (a connection closed early, with no length to hold it to)
            // or an error page from something in between would otherwise
            // pass for a listing of fewer objects, and a restore would
            // take an older snapshot for the newest.
            if !xml.trim_end().ends_with("</ListBucketResult>")
                || element(&xml, "IsTruncated").is_none()
            {
                return Err(S3Error::Protocol(format!(
                    "the listing of '{prefix}' came back incomplete or is not a listing"
                )));
            }
            let listed = elements(&xml, "Contents");
            if listed.is_empty() {
                empty += 1;
            }
            for c in listed {
                let key = element(c, "Key")
                    .ok_or_else(|| S3Error::Protocol("a listed object without a key".into()))?;
                if key.len() > MAX_KEY {
                    return Err(S3Error::Protocol(format!(
                        "a listed key of {} bytes (S3 keys have at most {MAX_KEY})",
                        key.len()
                    )));
                }
                let size = element(c, "Size")
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| S3Error::Protocol(format!("'{key}' listed without a size")))?;
                out.push(Object { key, size });
            }
            let truncated = element(&xml, "IsTruncated").is_some_and(|v| v == "true");
            let next = element(&xml, "NextContinuationToken");
            if !truncated {
                break;
            }
            if next.is_none() || next == token {
                return Err(S3Error::Protocol(
                    "a truncated listing without a new continuation token".into(),
                ));
            }
            token = next;
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }
}

/// The store's error response as an error.
fn store_error(method: &str, key: &str, r: &Response) -> S3Error {
    let xml = String::from_utf8_lossy(&r.body);
    S3Error::Store {
        status: r.status,
        code: element(&xml, "Code").unwrap_or_default(),
        message: format!(
            "{method} '{key}': {}",
            element(&xml, "Message").unwrap_or_else(|| format!("HTTP {}", r.status))
        ),
    }
}

/// The contents of every `<tag>...</tag>` in `xml`, in order.
pub(crate) fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else {
            break;
        };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

/// The text of the first `<tag>` in `xml`, entities decoded.
pub(crate) fn element(xml: &str, tag: &str) -> Option<String> {
    elements(xml, tag).first().map(|s| unescape(s))
}

/// Decodes XML's five named entities and numeric references.
pub(crate) fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(j) = after.find(';').filter(|&j| j <= 10) else {
            out.push('&');
            rest = after;
            continue;
        };
        let ent = &after[..j];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &after[j + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A fake store for tests: what a hostile or broken one may answer.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A store on a local socket answering request n (of any kind) with
    /// 200 and the body `page(n)`, over kept connections; returns its
    /// port and the count of requests it answered.
    pub(crate) fn fake_store(
        page: impl Fn(usize) -> String + Send + 'static,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                'conn: loop {
                    loop {
                        let mut line = String::new();
                        match r.read_line(&mut line) {
                            Ok(0) | Err(_) => break 'conn,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let body = page(n);
                    // One write: head and body in two would wait on
                    // delayed acknowledgements at every request.
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if w.write_all(answer.as_bytes()).is_err() {
                        break;
                    }
                }
            }
        });
        (port, count)
    }

    /// How to reach the fake store on `port`.
    pub(crate) fn config_at(port: u16) -> Config {
        Config {
            endpoint: Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
            path_style: true,
            signer: Signer::new("key", "secret", "us-east-1"),
        }
    }

    /// Bucket `tarn-test` of the fake store on `port`.
    pub(crate) fn bucket_at(port: u16) -> Bucket {
        Bucket::new(config_at(port), "tarn-test").unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use testing::{bucket_at, fake_store};

    /// AWS's certificate covers `*.s3.REGION.amazonaws.com`, one label:
    /// a dotted bucket name goes in the path over HTTPS.
    #[test]
    fn dotted_buckets_go_in_the_path_over_https() {
        let aws = || Config {
            endpoint: Endpoint::parse("https://s3.eu-west-1.amazonaws.com").unwrap(),
            path_style: false,
            signer: crate::sigv4::Signer::new("AKIDEXAMPLE", "secret", "eu-west-1"),
        };
        let b = Bucket::new(aws(), "my.backups").unwrap();
        assert_eq!(b.host(), "s3.eu-west-1.amazonaws.com");
        assert_eq!(b.path("a b"), "/my.backups/a%20b");
        let b = Bucket::new(aws(), "my-backups").unwrap();
        assert_eq!(b.host(), "my-backups.s3.eu-west-1.amazonaws.com");
        assert_eq!(b.path("a"), "/a");
    }

    #[test]
    fn a_store_that_pages_on_forever_is_an_error() {
        // It gives up after 500 pages, so a client without the bound
        // ends (and this test fails) instead of hanging.
        let (port, count) = fake_store(|n| {
            let more = n < 500;
            format!("<ListBucketResult><IsTruncated>{more}</IsTruncated><NextContinuationToken>t{n}</NextContinuationToken></ListBucketResult>")
        });
        let e = bucket_at(port).list("p/").unwrap_err();
        assert!(e.to_string().contains("pages on forever"), "{e}");
        let asked = count.load(std::sync::atomic::Ordering::SeqCst);
        assert!(asked <= MAX_EMPTY_PAGES, "{asked} requests");
    }

    /// A page cut short after the part that says it is the last, or a
    /// page that is no listing at all, is an error, not fewer objects.
    #[test]
    fn a_listing_cut_short_is_an_error() {
        let whole = "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/a</Key>\
                     <Size>1</Size></Contents><Contents><Key>p/b</Key><Size>1</Size></Contents>\
                     </ListBucketResult>\n";
        let (port, _) = fake_store(move |_| whole.to_string());
        assert_eq!(bucket_at(port).list("p/").unwrap().len(), 2);
        let cut = &whole[..whole.find("<Key>p/b").unwrap() + 8];
        for page in [
            cut.to_string(),
            "<html><body>Service Unavailable</body></html>".into(),
        ] {
            let (port, _) = fake_store(move |_| page.clone());
            let e = bucket_at(port).list("p/").unwrap_err();
            assert!(e.to_string().contains("incomplete"), "{e}");
        }
    }

    #[test]
    fn keys_longer_than_s3_allows_are_an_error() {
        let long = "k".repeat(MAX_KEY + 1);
        let (port, _) = fake_store(move |_| {
            format!("<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>{long}</Key><Size>1</Size></Contents></ListBucketResult>")
        });
        let e = bucket_at(port).list("").unwrap_err();
        assert!(e.to_string().contains("S3 keys have at most"), "{e}");
        let ok = "k".repeat(MAX_KEY);
        let (port, _) = fake_store(move |_| {
            format!("<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>{ok}</Key><Size>1</Size></Contents></ListBucketResult>")
        });
        assert_eq!(bucket_at(port).list("").unwrap().len(), 1);
    }

    #[test]
    fn listings_parse() {
        let xml = "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>\
            <Contents><Key>a/b&amp;c</Key><Size>12</Size></Contents>\
            <Contents><Key>a/&#233;</Key><Size>0</Size></Contents>\
            <NextContinuationToken>tok&lt;1&gt;</NextContinuationToken></ListBucketResult>";
        let c = elements(xml, "Contents");
        assert_eq!(c.len(), 2);
        assert_eq!(element(c[0], "Key").unwrap(), "a/b&c");
        assert_eq!(element(c[1], "Key").unwrap(), "a/é");
        assert_eq!(element(xml, "NextContinuationToken").unwrap(), "tok<1>");
        assert_eq!(element(xml, "Missing"), None);
    }

    proptest! {
        /// Escaping then unescaping gives the text back; unescaping never
        /// panics on anything.
        #[test]
        fn unescape_inverts_escaping(s in "\\PC{0,40}", junk in "[&;#a-z0-9x]{0,20}") {
            let escaped = s
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;");
            prop_assert_eq!(unescape(&escaped), s);
            let _ = unescape(&junk);
        }
    }
}

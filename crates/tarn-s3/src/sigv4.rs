//! AWS Signature Version 4 for S3 requests: the canonical request, the
//! string to sign and the derived signing key, as the S3 API documents
//! them. Every request is signed with the SHA-256 of its payload (no
//! unsigned or streaming payloads), so a body changed on the way is
//! refused by the store.

use ring::{digest, hmac};

/// Credentials and the region requests are signed for.
#[derive(Clone)]
pub struct Signer {
    access_key: String,
    secret_key: String,
    region: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("region", &self.region)
            .finish()
    }
}

/// Lowercase hex.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex SHA-256 of `data`: the `x-amz-content-sha256` of a payload.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&k, data).as_ref().to_vec()
}

/// URI-encodes `s` as SigV4 wants: unreserved characters stay, every
/// other byte becomes `%XX` (uppercase); `/` stays when `keep_slash`.
pub fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/');
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Signer {
    /// A signer for these credentials in `region`.
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> Signer {
        Signer {
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            region: region.to_string(),
        }
    }

    /// Signs a request: adds `x-amz-date` and `x-amz-content-sha256` to
    /// `headers` and returns the `Authorization` value. `path` is the
    /// already encoded absolute path; `query` the decoded parameters;
    /// `headers` (lowercase names) must include `host`; every one of them
    /// is signed. `amz_date` is `YYYYMMDDTHHMMSSZ`.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        query: &[(String, String)],
        headers: &mut Vec<(String, String)>,
        payload_sha256: &str,
        amz_date: &str,
    ) -> String {
        headers.push(("x-amz-date".into(), amz_date.to_string()));
        headers.push(("x-amz-content-sha256".into(), payload_sha256.to_string()));
        let mut q: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
            .collect();
        q.sort();
        let canonical_query = q
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let mut h: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        h.sort();
        let canonical_headers: String = h.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let signed_headers = h
            .iter()
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join(";");
        let canonical = format!(
            "{method}\n{path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload_sha256}"
        );
        let date = amz_date.get(..8).unwrap_or(amz_date);
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let k_date = hmac(
            format!("AWS4{}", self.secret_key).as_bytes(),
            date.as_bytes(),
        );
        let k_region = hmac(&k_date, self.region.as_bytes());
        let k_service = hmac(&k_region, b"s3");
        let k_signing = hmac(&k_service, b"aws4_request");
        let signature = hex(&hmac(&k_signing, to_sign.as_bytes()));
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed_headers},Signature={signature}",
            self.access_key
        )
    }
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time (UTC).
pub fn amz_date(unix: u64) -> String {
    let days = (unix / 86400) as i64;
    let secs = unix % 86400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GET example of the S3 SigV4 documentation ("Example: GET
    /// Object"), with its published signature.
    #[test]
    fn the_documented_get_example_signs_as_published() {
        let s = Signer::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
        );
        let mut headers = vec![
            (
                "host".to_string(),
                "examplebucket.s3.amazonaws.com".to_string(),
            ),
            ("range".to_string(), "bytes=0-9".to_string()),
        ];
        let empty = sha256_hex(b"");
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let auth = s.sign(
            "GET",
            "/test.txt",
            &[],
            &mut headers,
            &empty,
            "20130524T000000Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// The ListObjects example of the same page: query parameters sorted
    /// and encoded.
    #[test]
    fn the_documented_list_example_signs_as_published() {
        let s = Signer::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "us-east-1",
        );
        let mut headers = vec![(
            "host".to_string(),
            "examplebucket.s3.amazonaws.com".to_string(),
        )];
        let auth = s.sign(
            "GET",
            "/",
            &[
                ("prefix".to_string(), "J".to_string()),
                ("max-keys".to_string(), "2".to_string()),
            ],
            &mut headers,
            &sha256_hex(b""),
            "20130524T000000Z",
        );
        assert!(
            auth.ends_with(
                "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
            ),
            "{auth}"
        );
    }

    #[test]
    fn dates_and_encoding() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(951_825_599), "20000229T115959Z");
        assert_eq!(amz_date(4_107_542_400), "21000301T000000Z");
        assert_eq!(uri_encode("a b/c~d*", true), "a%20b/c~d%2A");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
    }
}

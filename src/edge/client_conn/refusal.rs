//! The answers hyper writes by itself, recognised so the gateway's JSON error can stand in.
//!
//! hyper's HTTP/1 parser answers a request it cannot parse — a malformed request line or header,
//! a bad or conflicting `Content-Length`, a head larger than its buffer — with a canned response
//! of its own: status 400, 414 or 431, `content-length: 0`, `connection: close`, a `date`, no
//! body; then it closes the connection. hyper offers no hook to shape that answer, so the client
//! connection's writer recognises it (this module) and writes the gateway's refusal instead
//! (`super::io`). The recognition is exact and fails safe:
//!
//! - it is only tried while a request head is being read and no request is in the router, which
//!   is the only time hyper writes such an answer;
//! - the write must be one whole response head and nothing else, with exactly that status and no
//!   header but `content-length: 0`, `connection` and `date`. Every answer the router gives has
//!   an `x-request-id` and every refusal a JSON body, so none can match;
//! - anything else passes through untouched: at worst a client sees hyper's empty answer.
//!
//! Parsing each request head a second time before hyper (with httparse) would know the reason
//! in more detail, but it would have to track request framing (bodies, pipelining) to find each
//! head and repeat every check hyper makes, and cost every request; this costs a flag test per
//! write.

use crate::error::ApiError;

/// What hyper's parser refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParserRefusal {
    /// 400: a malformed request line or header, or a bad `Content-Length`/`Transfer-Encoding`.
    Malformed,
    /// 414: a request target longer than the parser accepts.
    UriTooLong,
    /// 431: the request line and headers do not fit the header limit.
    HeaderTooLarge,
}

impl ParserRefusal {
    /// The gateway's error for it; `max_header_bytes` is the header limit in force.
    pub fn error(self, max_header_bytes: usize) -> ApiError {
        match self {
            ParserRefusal::Malformed => ApiError::invalid(
                "malformed HTTP request: the request line or a header could not be parsed \
                 (a header line without a colon, an invalid character, or an invalid or \
                 conflicting Content-Length or Transfer-Encoding)",
                None,
            ),
            ParserRefusal::UriTooLong => ApiError::UriTooLong,
            ParserRefusal::HeaderTooLarge => ApiError::HeaderTooLarge {
                limit: max_header_bytes,
            },
        }
    }
}

/// `Some` when `write` is exactly hyper's canned answer to a request it could not parse.
pub fn canned_refusal(write: &[u8]) -> Option<ParserRefusal> {
    // Every line of the head, the status line and each header, ends with CR LF; an empty line
    // ends the head.
    let head = write.strip_suffix(b"\r\n\r\n")?;
    if head.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r') {
        return None; // a bare line feed
    }
    let mut rest = head;
    let mut lines = std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.windows(2).position(|w| w == b"\r\n").unwrap_or(rest.len());
        let line = &rest[..end];
        rest = rest.get(end + 2..).unwrap_or_default();
        Some(line)
    });
    let status_line = lines.next()?;
    let rest = status_line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix(b"HTTP/1.0 "))?;
    let code = rest.get(..3)?;
    if !matches!(rest.get(3), None | Some(b' ')) {
        return None;
    }
    let refusal = match std::str::from_utf8(code).ok()?.parse::<u16>().ok()? {
        400 => ParserRefusal::Malformed,
        414 => ParserRefusal::UriTooLong,
        431 => ParserRefusal::HeaderTooLarge,
        _ => return None,
    };
    let mut empty_body = false;
    for line in lines {
        // A line without a colon (a blank one: a second message follows) is not hyper's.
        let colon = line.iter().position(|&b| b == b':')?;
        let name = &line[..colon];
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            if value != b"0" || empty_body {
                return None;
            }
            empty_body = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            if !value.eq_ignore_ascii_case(b"close") {
                return None;
            }
        } else if !name.eq_ignore_ascii_case(b"date") {
            return None;
        }
    }
    empty_body.then_some(refusal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_exactly_hypers_canned_answers() {
        let date = "date: Tue, 01 Dec 2026 23:02:14 GMT\r\n";
        let cases: &[(&str, String, Option<ParserRefusal>)] = &[
            (
                "hyper's 400",
                format!("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n"),
                Some(ParserRefusal::Malformed),
            ),
            (
                "hyper's 431",
                format!(
                    "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n"
                ),
                Some(ParserRefusal::HeaderTooLarge),
            ),
            (
                "hyper's 414",
                format!("HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n"),
                Some(ParserRefusal::UriTooLong),
            ),
            (
                "without a date or connection header",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".into(),
                Some(ParserRefusal::Malformed),
            ),
            (
                "HTTP/1.0, other header case, no reason",
                "HTTP/1.0 400\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
                Some(ParserRefusal::Malformed),
            ),
            (
                "the router's 405: a request id and allow",
                format!(
                    "HTTP/1.1 405 Method Not Allowed\r\nx-request-id: 01a2\r\nallow: POST\r\ncontent-length: 0\r\n{date}\r\n"
                ),
                None,
            ),
            (
                "a 400 with a request id",
                "HTTP/1.1 400 Bad Request\r\nx-request-id: 01a2\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "a 400 with a body",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n".into(),
                None,
            ),
            (
                "a head followed by a body",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}".into(),
                None,
            ),
            (
                "two heads in one write",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "no content-length",
                "HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n".into(),
                None,
            ),
            (
                "content-length twice",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "keep-alive",
                "HTTP/1.1 400 Bad Request\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "another status",
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "a four-digit status",
                "HTTP/1.1 4000 Bad Request\r\ncontent-length: 0\r\n\r\n".into(),
                None,
            ),
            (
                "a truncated head",
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n".into(),
                None,
            ),
            (
                "bare line feeds",
                "HTTP/1.1 400 Bad Request\ncontent-length: 0\n\r\n\r\n".into(),
                None,
            ),
            ("body bytes", "data: {\"id\":1}\n\n".into(), None),
            ("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".into(), None),
            ("nothing", String::new(), None),
        ];
        for (what, write, expected) in cases {
            assert_eq!(canned_refusal(write.as_bytes()), *expected, "{what}");
        }
    }

    #[test]
    fn each_refusal_keeps_its_status_in_the_gateway_shape() {
        for (refusal, status, code) in [
            (ParserRefusal::Malformed, 400, "invalid_request_error"),
            (ParserRefusal::UriTooLong, 414, "uri_too_long"),
            (ParserRefusal::HeaderTooLarge, 431, "request_header_too_large"),
        ] {
            let e = refusal.error(16384);
            assert_eq!(e.status().as_u16(), status);
            assert_eq!(e.code(), code);
        }
        assert!(
            ParserRefusal::HeaderTooLarge
                .error(16384)
                .to_string()
                .contains("16384")
        );
    }
}

//! The id of the request being served: a shared kernel type that the error, the client
//! connection and the handlers all name.

/// Header carrying the request's id (UUID v7), on every response.
pub const REQUEST_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("x-request-id");

/// The id of the request being served, in the request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct RequestId(pub uuid::Uuid);

impl RequestId {
    /// The id as text (hyphenated, lower case), written into `buf` without `fmt`.
    pub fn encode(self, buf: &mut [u8; 36]) -> &str {
        self.0.hyphenated().encode_lower(buf)
    }
}

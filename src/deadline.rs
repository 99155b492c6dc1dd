//! The deadlines of a proxied request. Every wait on an upstream is bounded: connecting
//! (`connect_timeout_secs`, in the HTTP client), a non-streamed answer's whole time, head and body
//! (`request_timeout_secs`), a stream's first byte (`stream_first_byte_timeout_secs`) and each gap
//! in it (`stream_idle_timeout_secs`). A request's [`Deadline`] is set once, when dispatch starts,
//! and every wait of dispatch and of reading the answer runs against it, across failover attempts.
//! The client's own body has its bound too (`client_body_timeout_secs`, in `proxy::body`).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Settings;
use crate::error::ApiError;

/// What the gateway waited for when a deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A non-streamed answer, head and body (`request_timeout_secs`).
    Answer,
    /// A stream's first byte (`stream_first_byte_timeout_secs`).
    FirstByte,
    /// The next chunk of a stream under way (`stream_idle_timeout_secs`).
    StreamIdle,
}

impl Wait {
    /// The setting that bounds this wait.
    pub fn setting(self) -> &'static str {
        match self {
            Wait::Answer => "request_timeout_secs",
            Wait::FirstByte => "stream_first_byte_timeout_secs",
            Wait::StreamIdle => "stream_idle_timeout_secs",
        }
    }
}

/// A passed deadline as people read it: what did not come, within how long, and which setting
/// bounds it.
#[derive(Clone, Copy, Debug)]
pub struct Missed {
    /// What was waited for.
    pub wait: Wait,
    /// The bound, in seconds.
    pub seconds: u64,
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (wait, s, setting) = (self.wait, self.seconds, self.wait.setting());
        match wait {
            Wait::Answer => write!(f, "the upstream did not answer within {s} s ({setting})"),
            Wait::FirstByte => write!(
                f,
                "the upstream sent no first byte of the stream within {s} s ({setting})"
            ),
            Wait::StreamIdle => write!(f, "the upstream stream sent nothing for {s} s ({setting})"),
        }
    }
}

/// The instant by which a request's answer (non-streamed) or first byte (streamed) must have
/// come.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    wait: Wait,
    seconds: u64,
}

impl Deadline {
    /// The deadline of a request that starts now: its whole answer, or for a stream its first
    /// byte.
    pub fn for_request(settings: &Settings, stream: bool) -> Deadline {
        let (wait, seconds) = if stream {
            (Wait::FirstByte, settings.stream_first_byte_timeout_secs)
        } else {
            (Wait::Answer, settings.request_timeout_secs)
        };
        Deadline {
            at: Instant::now() + Duration::from_secs(seconds),
            wait,
            seconds,
        }
    }

    /// The instant itself.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The time left.
    pub fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// Runs `f` until the deadline: `None` when the deadline passed first (`f` is dropped).
    pub async fn bound<F: Future>(&self, f: F) -> Option<F::Output> {
        tokio::time::timeout_at(self.at, f).await.ok()
    }

    /// What passing it means.
    pub fn missed(&self) -> Missed {
        Missed {
            wait: self.wait,
            seconds: self.seconds,
        }
    }

    /// The answer when it passed before any byte went to the client: 504 `timeout`.
    pub fn error(&self) -> ApiError {
        ApiError::Timeout(self.missed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            request_timeout_secs: 7,
            stream_first_byte_timeout_secs: 11,
            stream_idle_timeout_secs: 3,
            ..Settings::default()
        }
    }

    #[test]
    fn a_stream_waits_for_its_first_byte_and_an_answer_for_all_of_it() {
        let cases = [
            (false, Wait::Answer, 7, "request_timeout_secs"),
            (true, Wait::FirstByte, 11, "stream_first_byte_timeout_secs"),
        ];
        for (stream, wait, seconds, setting) in cases {
            let d = Deadline::for_request(&settings(), stream);
            assert_eq!((d.wait, d.seconds), (wait, seconds), "stream: {stream}");
            assert!(d.left() <= Duration::from_secs(seconds) && !d.passed());
            let message = d.error().to_string();
            assert!(
                message.contains(setting) && message.contains(&format!("{seconds} s")),
                "{message}"
            );
        }
    }

    #[test]
    fn each_missed_wait_names_its_setting() {
        for wait in [Wait::Answer, Wait::FirstByte, Wait::StreamIdle] {
            let text = Missed { wait, seconds: 5 }.to_string();
            assert!(text.contains(wait.setting()) && text.contains("5 s"), "{text}");
        }
    }

    #[tokio::test]
    async fn bound_gives_up_when_the_deadline_passes() {
        let d = Deadline {
            at: Instant::now() + Duration::from_millis(20),
            ..Deadline::for_request(&settings(), false)
        };
        let slow = d.bound(tokio::time::sleep(Duration::from_secs(10))).await;
        assert!(slow.is_none() && d.passed() && d.left().is_zero());
        let quick = Deadline::for_request(&settings(), false)
            .bound(async { 42 })
            .await;
        assert_eq!(quick, Some(42));
    }
}

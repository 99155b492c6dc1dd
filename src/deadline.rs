//! The deadlines of a proxied request, all of one type, [`Deadline`], built here from the
//! settings and nowhere else. The client's body must arrive within `client_body_timeout_secs`
//! ([`Deadline::for_body`]). Every wait on an upstream is bounded: connecting
//! (`connect_timeout_secs`, in the HTTP client), a non-streamed answer's whole time, head and body
//! (`request_timeout_secs`), a stream's first byte (`stream_first_byte_timeout_secs`) and each gap
//! in it (`stream_idle_timeout_secs`). That [`Deadline::for_request`] is set once, when dispatch
//! starts, and every wait of dispatch and of reading the answer runs against it, across failover
//! attempts; it carries the stream's idle gap too.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Settings;

/// What the gateway waited for when a deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The client's whole request body (`client_body_timeout_secs`).
    ClientBody,
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
            Wait::ClientBody => "client_body_timeout_secs",
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
            Wait::ClientBody => write!(f, "the request body did not arrive within {s} s ({setting})"),
            Wait::Answer => write!(f, "the upstream did not answer within {s} s ({setting})"),
            Wait::FirstByte => write!(
                f,
                "the upstream sent no first byte of the stream within {s} s ({setting})"
            ),
            Wait::StreamIdle => write!(f, "the upstream stream sent nothing for {s} s ({setting})"),
        }
    }
}

/// The instant by which what a request waits for must have come: the client's body, or the
/// upstream's answer (non-streamed) or first byte (streamed); for a stream also the longest gap
/// between two of its chunks after that.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    wait: Wait,
    seconds: u64,
    /// The longest gap between two chunks of a stream (`stream_idle_timeout_secs`).
    idle_secs: u64,
}

impl Deadline {
    fn starting_now(settings: &Settings, wait: Wait, seconds: u64) -> Deadline {
        Deadline {
            at: Instant::now() + Duration::from_secs(seconds),
            wait,
            seconds,
            idle_secs: settings.stream_idle_timeout_secs,
        }
    }

    /// The deadline of a client's request body whose reading starts now.
    pub fn for_body(settings: &Settings) -> Deadline {
        Deadline::starting_now(settings, Wait::ClientBody, settings.client_body_timeout_secs)
    }

    /// The deadline of a request that starts now: its whole answer, or for a stream its first
    /// byte.
    pub fn for_request(settings: &Settings, stream: bool) -> Deadline {
        if stream {
            Deadline::starting_now(settings, Wait::FirstByte, settings.stream_first_byte_timeout_secs)
        } else {
            Deadline::starting_now(settings, Wait::Answer, settings.request_timeout_secs)
        }
    }

    /// The longest gap between two chunks of a stream, once its first byte came.
    pub fn idle_gap(&self) -> Duration {
        Duration::from_secs(self.idle_secs)
    }

    /// What passing the idle gap means.
    pub fn idle_missed(&self) -> Missed {
        Missed {
            wait: Wait::StreamIdle,
            seconds: self.idle_secs,
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

    /// What passing it means (the answer, 408 for the client's body else 504, is
    /// `ApiError::from` the deadline).
    pub fn missed(&self) -> Missed {
        Missed {
            wait: self.wait,
            seconds: self.seconds,
        }
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
            client_body_timeout_secs: 13,
            ..Settings::default()
        }
    }

    #[test]
    fn each_deadline_takes_its_setting() {
        let s = settings();
        let cases = [
            (
                Deadline::for_body(&s),
                Wait::ClientBody,
                13,
                "client_body_timeout_secs",
            ),
            (
                Deadline::for_request(&s, false),
                Wait::Answer,
                7,
                "request_timeout_secs",
            ),
            (
                Deadline::for_request(&s, true),
                Wait::FirstByte,
                11,
                "stream_first_byte_timeout_secs",
            ),
        ];
        for (d, wait, seconds, setting) in cases {
            assert_eq!((d.wait, d.seconds), (wait, seconds), "{setting}");
            assert!(d.left() <= Duration::from_secs(seconds) && !d.passed());
            let message = d.missed().to_string();
            assert!(
                message.contains(setting) && message.contains(&format!("{seconds} s")),
                "{message}"
            );
            assert_eq!(d.idle_gap(), Duration::from_secs(3));
            assert_eq!(d.idle_missed().wait, Wait::StreamIdle);
        }
    }

    #[test]
    fn each_missed_wait_names_its_setting() {
        for wait in [Wait::ClientBody, Wait::Answer, Wait::FirstByte, Wait::StreamIdle] {
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

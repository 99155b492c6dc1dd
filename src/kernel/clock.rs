//! Time, injectable: everything time-based (windows, breaker, locks) reads `Clock::now`, so tests
//! move time forward instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Duration, Utc};

/// The gateway's source of "now".
#[derive(Clone)]
pub enum Clock {
    /// The system clock.
    System,
    /// A clock that only moves when told to (tests); holds Unix milliseconds.
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock starting at `start`.
    pub fn manual(start: DateTime<Utc>) -> Self {
        Clock::Manual(Arc::new(AtomicI64::new(start.timestamp_millis())))
    }

    /// The current instant.
    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Clock::System => Utc::now(),
            Clock::Manual(ms) => {
                DateTime::from_timestamp_millis(ms.load(Ordering::Relaxed)).unwrap_or(DateTime::UNIX_EPOCH)
            }
        }
    }

    /// The current instant in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        match self {
            // Without a calendar date: `Utc::now` builds one, about 120 instructions more a reading.
            Clock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Clock::Manual(ms) => ms.load(Ordering::Relaxed),
        }
    }

    /// Moves a manual clock forward; the system clock ignores it.
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(ms) = self {
            ms.fetch_add(by.num_milliseconds(), Ordering::Relaxed);
        }
    }

    /// Sets a manual clock; the system clock ignores it.
    pub fn set(&self, to: DateTime<Utc>) {
        if let Clock::Manual(ms) = self {
            ms.store(to.timestamp_millis(), Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clock::System => f.write_str("Clock::System"),
            Clock::Manual(_) => write!(f, "Clock::Manual({})", self.now()),
        }
    }
}

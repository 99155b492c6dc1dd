//! Requests in flight per API key and per member, against their `max_in_flight` caps (issue 25
//! item 4). Counted in memory by each gateway process, so the cap holds per replica: behind N
//! replicas a key may have up to N × its cap in flight. Only callers with a cap are counted; a
//! request's count is released when its [`InFlightGuard`] drops, which the request's completion
//! holds until the request ends: answered, its stream finished, or the client gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kernel::caller::{Guarded, InFlightCaps};

/// The counts of every capped key and member with requests in flight.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Mutex<HashMap<(Guarded, i64), u32>>>);

/// A request over a cap: whose, and the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverCap {
    /// The key's cap or the member's.
    pub by: Guarded,
    /// The cap.
    pub limit: u32,
}

impl InFlight {
    /// Counts one more request of `key_id` (and its member) if both are under their caps; the
    /// guard releases it.
    pub fn admit(&self, caps: InFlightCaps, key_id: i64, member_id: i64) -> Result<InFlightGuard, OverCap> {
        if !caps.any() {
            return Ok(InFlightGuard::default());
        }
        let capped = [
            (Guarded::Key, key_id, caps.key),
            (Guarded::Member, member_id, caps.member),
        ];
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (by, id, cap) in capped {
            if let Some(limit) = cap
                && counts.get(&(by, id)).copied().unwrap_or(0) >= limit
            {
                return Err(OverCap { by, limit });
            }
        }
        let mut held = Vec::with_capacity(2);
        for (by, id, cap) in capped {
            if cap.is_some() {
                *counts.entry((by, id)).or_insert(0) += 1;
                held.push((by, id));
            }
        }
        Ok(InFlightGuard {
            counts: Some(self.clone()),
            held,
        })
    }

    /// Requests in flight of a key or member (0 when not counted).
    pub fn count(&self, by: Guarded, id: i64) -> u32 {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&(by, id)).copied().unwrap_or(0)
    }
}

/// One admitted request's place in the counts, released on drop.
#[derive(Debug, Default)]
pub struct InFlightGuard {
    counts: Option<InFlight>,
    held: Vec<(Guarded, i64)>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let Some(InFlight(counts)) = &self.counts else {
            return;
        };
        let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
        for at in &self.held {
            if let Some(n) = counts.get_mut(at) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_admit_up_to_the_limit_and_release_on_drop() {
        let f = InFlight::default();
        let caps = InFlightCaps {
            key: Some(2),
            member: Some(3),
        };
        let a = f.admit(caps, 1, 10).unwrap();
        let _b = f.admit(caps, 1, 10).unwrap();
        assert_eq!(
            f.admit(caps, 1, 10).unwrap_err(),
            OverCap {
                by: Guarded::Key,
                limit: 2
            }
        );
        let _c = f.admit(caps, 2, 10).unwrap();
        assert_eq!(f.admit(caps, 3, 10).unwrap_err().by, Guarded::Member);
        assert_eq!(f.count(Guarded::Member, 10), 3);
        drop(a);
        assert_eq!(f.count(Guarded::Key, 1), 1);
        assert!(f.admit(caps, 1, 10).is_ok(), "a slot freed");
    }

    #[test]
    fn uncapped_callers_are_not_counted() {
        let f = InFlight::default();
        let _g = f.admit(InFlightCaps::default(), 1, 10).unwrap();
        assert_eq!(f.count(Guarded::Key, 1), 0);
        let only_member = InFlightCaps {
            key: None,
            member: Some(1),
        };
        let g = f.admit(only_member, 1, 10).unwrap();
        assert_eq!(f.count(Guarded::Key, 1), 0);
        assert!(f.admit(only_member, 2, 10).is_err());
        drop(g);
        assert!(f.0.lock().unwrap().is_empty(), "released entries go");
    }
}

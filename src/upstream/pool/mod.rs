//! The credential pool: its state and its rules. The routing snapshot, admission under each
//! credential's own limits, learned locks, the corroboration of ambiguous 429s and the failure
//! classification that decides them, and (with `redis_url`) their sharing through Redis.
//! Dispatch (`upstream::dispatch`) reads and feeds it.

pub mod admission;
pub mod classify;
pub mod corroboration;
pub mod locks;
pub mod own_shared;
pub mod routes;
pub mod shared;
pub mod worded_reset;

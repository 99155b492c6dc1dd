//! The shared kernel: types and helpers every layer uses and that know no domain rule. Who is
//! calling ([`caller`]), time ([`clock`]), credits ([`credits`]), sealed secrets ([`crypto`]),
//! requests in flight ([`in_flight`]), what the resources file manages ([`managed`]), the
//! link to Redis, one server or a cluster ([`redis_link`]), the request's id ([`request_id`]),
//! the nearest known name ([`suggest`]), tags and end users ([`tags`]) and tokens used
//! ([`usage`]). Nothing here imports another room of the crate.

pub mod caller;
pub mod clock;
pub mod credits;
pub mod crypto;
pub mod in_flight;
pub mod managed;
pub mod redis_link;
pub mod redis_sentinel;
pub mod redis_writer;
pub mod request_id;
pub mod suggest;
pub mod tags;
pub mod usage;

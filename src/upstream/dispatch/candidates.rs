//! Which credentials of a model a request tries, in which order.

use std::sync::Arc;

use rand::Rng;

use crate::provider::Credential;
use crate::provider::adapter::Endpoint;
use crate::upstream::pool::routes::ModelRoute;

/// The chain model's credentials that serve `endpoint`, by priority, weighted random within a
/// priority (Efraimidis–Spirakis keys).
pub(super) fn candidates(model: &ModelRoute, endpoint: Endpoint) -> Vec<Arc<Credential>> {
    let mut rng = rand::thread_rng();
    let mut keyed: Vec<(i64, f64, Arc<Credential>)> = model
        .credentials
        .iter()
        .filter(|c| endpoint.served_by(c.provider))
        .map(|c| {
            let u: f64 = rng.gen_range(f64::EPSILON..1.0);
            (c.priority, -u.ln() / c.weight as f64, c.clone())
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    keyed.into_iter().map(|(_, _, c)| c).collect()
}

//! Delivering the outbox: each due alert POSTed to its policy's webhook as JSON, signed when the
//! policy has a secret, tried again with exponential backoff (1 s doubling to 1 h) until a 2xx
//! answers or a day has passed since it fired. Every wait is bounded: 5 s to resolve the name,
//! 5 s to connect, 10 s for the whole exchange. Before each try the webhook's address is
//! resolved and checked ([`super::destination`]), and the try connects to the checked addresses
//! only, without a proxy; redirects are not followed (a webhook answers where it is). The
//! history keeps the receiver's status, never its body, and says of a failed connection only
//! that it failed: what an internal service answers, or which of its ports are open, is not a
//! workspace admin's to read. The causes go to the gateway's log.
//!
//! The signature (docs/quotas.md shows how to check it): `x-aigw-signature: t=<unix seconds>,
//! v1=<hex HMAC-SHA256 of "<t>.<body>" under the secret>`, the scheme of Stripe's webhooks, so a
//! receiver checks both the sender and the freshness.

use std::time::Duration;

use ring::hmac;

use super::destination::{REFUSED, Undeliverable, domain};
use super::{AlertRules, Alerts};
use crate::kernel::clock::Clock;
use crate::kernel::crypto::MasterKey;
use crate::store::{AlertAttempt, AlertEventRow, AlertStore, Store};

/// How long a delivery keeps trying after the alert fired.
pub const GIVE_UP_AFTER_MS: i64 = 24 * 3600 * 1000;
/// The first wait after a failed try; it doubles with each further failure.
const FIRST_BACKOFF_MS: i64 = 1000;
/// The longest wait between two tries.
const MAX_BACKOFF_MS: i64 = 3600 * 1000;
/// How long a gateway holds the alerts it took for delivery (another gateway takes them over
/// after it, should this one die mid-delivery): longer than a batch can take, one receiver
/// after another at [`TIMEOUT`] each, so no alert is sent by two gateways at once.
const LEASE_MS: i64 = 300_000;
/// Alerts taken per round of a pass.
const BATCH: i64 = 20;
/// Rounds per pass at most (the next pass continues).
const ROUNDS: usize = 10;
/// The longest exchange with a receiver.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The wait after the `attempts`-th failed try: 1 s, 2 s, 4 s, … at most an hour.
pub fn backoff_ms(attempts: i64) -> i64 {
    let doublings = attempts.saturating_sub(1).clamp(0, 32) as u32;
    FIRST_BACKOFF_MS
        .saturating_mul(1_i64 << doublings)
        .min(MAX_BACKOFF_MS)
}

/// `t=<unix>,v1=<hex>`: the HMAC-SHA256 of `"<unix>.<body>"` under `secret`.
pub fn signature(secret: &str, unix: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut mac = hmac::Context::with_key(&key);
    mac.update(unix.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={unix},v1={}", hex::encode(mac.sign()))
}

/// The client of one try: bounded waits, no redirects, no proxy, and a name (`domain`, none for
/// an address) that resolves to the checked `addrs` only.
fn client(domain: Option<&str>, addrs: &[std::net::SocketAddr]) -> reqwest::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("aigw/", env!("CARGO_PKG_VERSION"), " (budget alerts)"));
    if let Some(domain) = domain {
        builder = builder.resolve_to_addrs(domain, addrs);
    }
    builder.build()
}

/// What one try came to.
enum Sent {
    /// A 2xx answered.
    Delivered(i64),
    /// It failed: the status, if one answered, and why.
    Failed(Option<i64>, String),
}

impl Alerts {
    /// Delivers the alerts due now, a batch at a time; returns how many were tried. One pass at a
    /// time on this gateway; other gateways skip what this one holds.
    pub async fn deliver_due(&self, store: &Store, master: &MasterKey, clock: &Clock) -> usize {
        let _one_at_a_time = self.delivering.lock().await;
        let mut tried = 0;
        for _ in 0..ROUNDS {
            let now = clock.now_ms();
            let due = match store.claim_due_alerts(now, now + LEASE_MS, BATCH).await {
                Ok(due) => due,
                Err(e) => {
                    store.log_failure(&e, "budget alert delivery: cannot read the outbox");
                    break;
                }
            };
            if due.is_empty() {
                break;
            }
            let rules = self.rules.load_full();
            for alert in &due {
                let sent = self.send(&rules, master, alert, clock).await;
                tried += 1;
                if let Err(e) = store
                    .record_alert_attempt(&attempt(alert, &sent, clock.now_ms()))
                    .await
                {
                    // The lease runs out and the alert is sent again: at least once, never lost.
                    store.log_failure(&e, "budget alert delivery: outcome not written");
                }
            }
            if (due.len() as i64) < BATCH {
                break;
            }
        }
        tried
    }

    /// One try of one alert.
    async fn send(
        &self,
        rules: &AlertRules,
        master: &MasterKey,
        alert: &AlertEventRow,
        clock: &Clock,
    ) -> Sent {
        let Some(rule) = rules.get(alert.policy_id) else {
            return Sent::Failed(
                None,
                "the policy or its alerts were removed before delivery".into(),
            );
        };
        let mut body: serde_json::Value = match serde_json::from_str(&alert.payload) {
            Ok(v) => v,
            Err(e) => return Sent::Failed(None, format!("stored alert unreadable: {e}")),
        };
        // `id` first: receivers deduplicate by it (a lease that ran out may send one twice).
        let mut with_id = serde_json::Map::new();
        with_id.insert("id".into(), alert.id.into());
        if let Some(fields) = body.as_object_mut() {
            with_id.append(fields);
        }
        let body = serde_json::Value::Object(with_id).to_string();
        let Ok(url) = reqwest::Url::parse(&rule.webhook) else {
            return Sent::Failed(None, "the webhook is not a URL".into());
        };
        let host = url.host_str().unwrap_or_default().to_owned();
        let addrs = match self.destinations.resolve(&url).await {
            Ok(addrs) => addrs,
            Err(Undeliverable::Refused(why)) => {
                tracing::warn!(alert = alert.id, policy = alert.policy_id, %host, reason = %why, "budget alert webhook refused");
                return Sent::Failed(None, REFUSED.into());
            }
            Err(Undeliverable::Unresolved(why)) => {
                tracing::warn!(alert = alert.id, policy = alert.policy_id, %host, error = %why, "budget alert webhook did not resolve");
                return Sent::Failed(None, no_answer(&host));
            }
        };
        let client = match client(domain(&host), &addrs) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the webhook client");
                return Sent::Failed(None, "the gateway could not build its webhook client".into());
            }
        };
        let mut req = client
            .post(url)
            .header("content-type", "application/json")
            .header("x-aigw-alert-id", alert.id.to_string());
        if let Some(sealed) = &rule.secret_sealed {
            let Ok(secret) = master.open(sealed) else {
                return Sent::Failed(
                    None,
                    "the signing secret cannot be opened (was the master key changed?)".into(),
                );
            };
            let unix = clock.now().timestamp();
            req = req.header("x-aigw-signature", signature(&secret, unix, body.as_bytes()));
        }
        match req.body(body).send().await {
            // The answer's body is never read: only its status is the receiver's to tell.
            Ok(r) if r.status().is_success() => Sent::Delivered(i64::from(r.status().as_u16())),
            Ok(r) => {
                let status = r.status().as_u16();
                Sent::Failed(Some(i64::from(status)), format!("HTTP {status}"))
            }
            Err(e) => {
                // The cause (refused, reset, timed out) is the operator's: it would tell which
                // ports are open where the webhook points.
                tracing::warn!(alert = alert.id, policy = alert.policy_id, %host, error = %cause(&e), "budget alert delivery failed");
                Sent::Failed(None, no_answer(&host))
            }
        }
    }
}

/// What the history says of a try that got no HTTP answer.
fn no_answer(host: &str) -> String {
    format!("no HTTP answer from {host} (the gateway's log has the cause)")
}

/// A transport failure's innermost cause (reqwest's own message names the URL, whose path or
/// query may hold the receiver's secret).
fn cause(e: &reqwest::Error) -> String {
    let mut cause = std::error::Error::source(e);
    let mut root = if e.is_timeout() {
        format!("no answer within {} s", TIMEOUT.as_secs())
    } else {
        "request failed".to_owned()
    };
    while let Some(c) = cause {
        root = c.to_string();
        cause = c.source();
    }
    root
}

/// The row update of a try made at `now`.
fn attempt<'a>(alert: &AlertEventRow, sent: &'a Sent, now: i64) -> AlertAttempt<'a> {
    match sent {
        Sent::Delivered(status) => {
            metrics::counter!("aigw_budget_alerts_total", "event" => "delivered").increment(1);
            AlertAttempt {
                id: alert.id,
                status: Some(*status),
                error: None,
                now,
                next_attempt_at: None,
            }
        }
        Sent::Failed(status, why) => {
            let next = now.saturating_add(backoff_ms(alert.attempts + 1));
            let next = (next <= alert.give_up_at).then_some(next);
            let event = if next.is_some() { "retried" } else { "given_up" };
            metrics::counter!("aigw_budget_alerts_total", "event" => event).increment(1);
            if next.is_none() {
                tracing::warn!(alert = alert.id, policy = alert.policy_id, error = %why, "budget alert given up");
            }
            AlertAttempt {
                id: alert.id,
                status: *status,
                error: Some(why),
                now,
                next_attempt_at: next,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_second_to_an_hour() {
        // (failed tries so far, wait in seconds)
        let cases = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (12, 2048),
            (13, 3600),
            (100, 3600),
            (i64::MAX, 3600),
        ];
        for (attempts, secs) in cases {
            assert_eq!(backoff_ms(attempts), secs * 1000, "{attempts}");
        }
    }

    #[test]
    fn a_failed_try_is_retried_until_the_alert_is_a_day_old() {
        let alert = |attempts, give_up_at| AlertEventRow {
            id: 1,
            workspace_id: 1,
            policy_id: 1,
            subject: "ws".into(),
            subject_id: 1,
            time_window: "day".into(),
            window_start: 0,
            threshold: 80,
            payload: "{}".into(),
            status: "pending".into(),
            attempts,
            next_attempt_at: 0,
            give_up_at,
            lease_until: 0,
            last_status: None,
            last_error: None,
            created_at: 0,
            delivered_at: None,
        };
        let failed = Sent::Failed(Some(500), "HTTP 500".into());
        // (tries before, give up at, now, next try)
        let cases = [
            (0, GIVE_UP_AFTER_MS, 0, Some(1000)),
            (3, GIVE_UP_AFTER_MS, 10_000, Some(18_000)),
            (20, GIVE_UP_AFTER_MS, 3_600_000, Some(7_200_000)),
            (40, GIVE_UP_AFTER_MS, GIVE_UP_AFTER_MS - 1000, None),
            (0, 500, 0, None),
        ];
        for (attempts, give_up_at, now, next) in cases {
            let a = attempt(&alert(attempts, give_up_at), &failed, now);
            assert_eq!(a.next_attempt_at, next, "{attempts} tries, at {now}");
            assert_eq!((a.status, a.error), (Some(500), Some("HTTP 500")));
        }
        let delivered = attempt(&alert(5, 0), &Sent::Delivered(204), 7);
        assert_eq!(
            (delivered.error, delivered.next_attempt_at, delivered.status),
            (None, None, Some(204))
        );
    }

    #[test]
    fn the_signature_is_an_hmac_of_the_time_and_the_body() {
        // RFC 4231 test case 2 ("Jefe"), with its data split as "<t>.<body>" would be.
        let s = signature("Jefe", 1, b"what do ya want for nothing?");
        assert!(s.starts_with("t=1,v1="), "{s}");
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"Jefe");
        let mac = hmac::sign(&key, b"1.what do ya want for nothing?");
        assert_eq!(s, format!("t=1,v1={}", hex::encode(mac)));
        let rfc = hex::encode(hmac::sign(&key, b"what do ya want for nothing?"));
        assert_eq!(
            rfc,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}

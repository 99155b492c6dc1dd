//! Admin sessions: HS256 JWTs with a short expiry, issuer and audience checked, no other
//! algorithm accepted; failed sign-ins slowed per address and per email.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use chrono::{DateTime, Utc};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::store::MemberRow;

/// Issuer of admin tokens.
pub const ISSUER: &str = "aigw";
/// Audience of admin tokens.
pub const AUDIENCE: &str = "aigw-admin";
/// How long a token is valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);
/// An argon2 hash of a random password, verified when the email is unknown so that an unknown
/// email costs the same time as a wrong password.
pub static DUMMY_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    crate::kernel::crypto::hash_password(&crate::kernel::crypto::generate_password())
});

/// The claims of an admin token.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// Member id.
    pub sub: String,
    /// Workspace id.
    pub ws: i64,
    /// Role at sign-in (the store is re-read for decisions).
    pub role: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds.
    pub exp: i64,
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// The member's session epoch at issue: sign-out and password change bump it, which revokes
    /// every token issued before.
    pub sep: i64,
}

/// Issues and checks tokens; slows failed sign-ins.
pub struct Sessions {
    encoding: EncodingKey,
    decoding: DecodingKey,
    by_ip: DefaultKeyedRateLimiter<IpAddr>,
    by_email: DefaultKeyedRateLimiter<String>,
    /// Addresses and emails told to wait, until when.
    blocked: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl Sessions {
    /// Sessions signed with `secret`. Failed sign-ins: a burst of 10 per address and per email,
    /// then one every 6 seconds.
    pub fn new(secret: &str) -> Self {
        let quota = Quota::with_period(Duration::from_secs(6))
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN));
        Sessions {
            encoding: EncodingKey::from_secret(secret.as_bytes()),
            decoding: DecodingKey::from_secret(secret.as_bytes()),
            by_ip: RateLimiter::keyed(quota),
            by_email: RateLimiter::keyed(quota),
            blocked: std::sync::Mutex::default(),
        }
    }

    /// Whether a sign-in may be tried now; else the seconds to wait.
    pub fn may_try(&self, ip: IpAddr, email: &str) -> Result<(), u64> {
        let now = std::time::Instant::now();
        let blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        let until = [blocked.get(&ip.to_string()), blocked.get(&email.to_lowercase())]
            .into_iter()
            .flatten()
            .filter(|u| **u > now)
            .max()
            .copied();
        match until {
            Some(u) => Err((u - now).as_secs_f64().ceil().max(1.0) as u64),
            None => Ok(()),
        }
    }

    /// Charges a failed sign-in; past the burst, the address or email waits.
    pub fn failed(&self, ip: IpAddr, email: &str) {
        let clock = governor::clock::DefaultClock::default();
        let now = governor::clock::Clock::now(&clock);
        let email = email.to_lowercase();
        let waits = [
            (
                ip.to_string(),
                self.by_ip.check_key(&ip).err().map(|n| n.wait_time_from(now)),
            ),
            (
                email.clone(),
                self.by_email
                    .check_key(&email)
                    .err()
                    .map(|n| n.wait_time_from(now)),
            ),
        ];
        let mut blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        let instant = std::time::Instant::now();
        blocked.retain(|_, u| *u > instant);
        for (key, wait) in waits {
            if let Some(w) = wait {
                blocked.insert(key, instant + w);
            }
        }
    }

    /// A token for `member`, and when it expires.
    pub fn issue(&self, member: &MemberRow, now: DateTime<Utc>) -> (String, DateTime<Utc>) {
        let exp = now + chrono::Duration::from_std(TOKEN_TTL).unwrap_or(chrono::Duration::hours(1));
        let claims = Claims {
            sub: member.id.to_string(),
            ws: member.workspace_id,
            role: member.role.clone(),
            iat: now.timestamp(),
            exp: exp.timestamp(),
            iss: ISSUER.to_owned(),
            aud: AUDIENCE.to_owned(),
            sep: member.session_epoch,
        };
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding).unwrap_or_default();
        (token, exp)
    }

    /// The claims of a valid token (HS256 only, issuer, audience and expiry checked at `now`).
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Option<Claims> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_issuer(&[ISSUER]);
        v.set_audience(&[AUDIENCE]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // Expiry is checked against the gateway's clock below, not the library's.
        v.validate_exp = false;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &v).ok()?;
        (data.claims.exp > now.timestamp()).then_some(data.claims)
    }
}
